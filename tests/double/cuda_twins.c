/* The PTX kernels of meshpg's NCCL backend, run on the CPU: the test
 * double's cudaLibraryLoadData, cudaLibraryGetKernel, cudaLibraryUnload and
 * cudaLaunchKernel (see double.h; this file is a client of that contract
 * like nccl_double.c).
 *
 * A library is the PTX text the caller loads; the double notes each
 * `.entry` (its name, its parameter types and a fingerprint of its text).
 * A kernel can be looked up only if the library defines it AND it has a CPU
 * twin in `twins` below, written for exactly that PTX: the fingerprint of
 * the entry's text must be the one the twin was written for, so that an
 * edited kernel cannot silently keep an outdated twin.  A launch copies the
 * argument values (cudaLaunchKernel docs: each args[i] points to the memory
 * the parameter is copied from) and queues the twin as a kernel item on the
 * stream (dbl_stream_submit with kernel = 1).
 *
 * The twins compute what the PTX computes, bit for bit, NaNs included;
 * they were checked against the real kernels on an H100 (CUDA 13), whose
 * outputs for every f16/bf16 pattern and a structured sample of f32/f64
 * patterns are summarised by hashes in tests/double/test_cuda_double_twins.c.
 * Grid-stride loops cover every i < n whatever the grid, so the twins
 * simply loop over n. */
#include "double.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The twins need IEEE single and double arithmetic rounded once per
 * operation, with subnormals (PTX mul.rn.f32 without .ftz keeps them). */
#if !defined(__FLT_EVAL_METHOD__) || __FLT_EVAL_METHOD__ != 0
#error "the PTX twins need FLT_EVAL_METHOD == 0 (SSE arithmetic)"
#endif
#ifdef __FAST_MATH__
#error "the PTX twins need exact IEEE arithmetic: no -ffast-math"
#endif

/* ------------------------------------------------------------------ */
/* Bit-exact PTX arithmetic                                            */
/* ------------------------------------------------------------------ */

static float f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, sizeof f);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return b;
}

/* mul.rn.f32: one rounding to nearest even; a NaN result is the canonical
 * NaN 0x7fffffff whatever the operands (seen on an H100; x86 would keep an
 * operand's payload, or give 0xffc00000 for inf * 0). */
static float mul_rn_f32(float a, float b) {
  float r = a * b;
  return r != r ? f32_of(0x7fffffffu) : r;
}

/* mul.rn.f64 of an element a by the scale b: one rounding to nearest
 * even.  NaN results, as seen on an H100: a NaN operand comes out quiet
 * with its payload, the scale's when both are NaN (the machine code may
 * order the operands of this commutative multiply as it likes, so this is
 * what the H100's build did, not a PTX rule); an invalid product (inf * 0)
 * is the canonical 0x7fffffffffffffff. */
static double mul_rn_f64(double a, double b) {
  if (a != a || b != b) {
    uint64_t x;
    memcpy(&x, b != b ? &b : &a, sizeof x);
    x |= 0x0008000000000000ull;
    double q;
    memcpy(&q, &x, sizeof q);
    return q;
  }
  double r = a * b;
  if (r != r) {
    uint64_t c = 0x7fffffffffffffffull;
    memcpy(&r, &c, sizeof r);
  }
  return r;
}

/* cvt.f32.f16: exact.  (A NaN's payload never matters below: every use
 * multiplies, and mul_rn_f32 makes any NaN canonical.) */
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return f32_of(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0));
  if (e) return f32_of(sign | ((e + 112) << 23) | (m << 13));
  if (!m) return f32_of(sign);
  int shift = 0; /* subnormal: m * 2^-24, normalised */
  while (!(m & 0x400)) m <<= 1, shift++;
  return f32_of(sign | ((uint32_t)(113 - shift) << 23) | ((m & 0x3ff) << 13));
}

/* cvt.rn.f16.f32: to nearest even, overflow to infinity, subnormals kept;
 * a NaN gives 0x7fff (seen on an H100, for the canonical NaN that is the
 * only NaN reaching it in scale_f16; narrow_f16 replaces NaNs itself). */
static uint16_t f32_to_f16_rn(float f) {
  uint32_t b = bits_of(f), a = b & 0x7fffffffu;
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  if (a > 0x7f800000u) return 0x7fff;
  if (a >= 0x477ff000u) return sign | 0x7c00; /* >= 65520: infinity */
  if (a >= 0x38800000u) {                      /* normal: >= 2^-14 */
    uint32_t m = a - 0x38000000u;               /* exponent rebiased 127 -> 15 */
    return sign | (uint16_t)((m + 0xfffu + ((m >> 13) & 1)) >> 13);
  }
  if (a <= 0x33000000u) return sign; /* <= 2^-25: zero (2^-25 ties to even) */
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1))) r++;
  return sign | (uint16_t)r;
}

/* The PTX's own bf16 rounding: (r + 0x7fff + ((r >> 16) & 1)) >> 16 as
 * u32, truncated to 16 bits; `nan` is what it stores for a NaN. */
static uint16_t bf16_rn(uint32_t r, uint16_t nan, int is_nan) {
  if (is_nan) return nan;
  return (uint16_t)((r + 0x7fffu + ((r >> 16) & 1)) >> 16);
}

static float bf16_to_f32(uint16_t h) { return f32_of((uint32_t)h << 16); }

/* ------------------------------------------------------------------ */
/* The twins                                                           */
/* ------------------------------------------------------------------ */

/* The parameters of every MPG__PTX_GRID_LOOP kernel (nccl_internal.h):
 * dst, src, n, scale as f64 (%f1 = cvt.rn.f32.f64 of it). */
struct elementwise {
  void *dst;
  const void *src;
  uint64_t n;
  double scale;
};

static void scale_f32(const struct elementwise *a) {
  const float *s = a->src;
  float *d = a->dst, k = (float)a->scale;
  for (uint64_t i = 0; i < a->n; i++) d[i] = mul_rn_f32(s[i], k);
}

static void scale_f64(const struct elementwise *a) {
  const double *s = a->src;
  double *d = a->dst;
  for (uint64_t i = 0; i < a->n; i++) d[i] = mul_rn_f64(s[i], a->scale);
}

static void scale_f16(const struct elementwise *a) {
  const uint16_t *s = a->src;
  uint16_t *d = a->dst;
  float k = (float)a->scale;
  for (uint64_t i = 0; i < a->n; i++) d[i] = f32_to_f16_rn(mul_rn_f32(f16_to_f32(s[i]), k));
}

/* NaN -> 32704 (0x7fc0), as the PTX stores it. */
static void scale_bf16(const struct elementwise *a) {
  const uint16_t *s = a->src;
  uint16_t *d = a->dst;
  float k = (float)a->scale;
  for (uint64_t i = 0; i < a->n; i++) {
    float r = mul_rn_f32(bf16_to_f32(s[i]), k);
    d[i] = bf16_rn(bits_of(r), 0x7fc0, r != r);
  }
}

static void widen_f16(const struct elementwise *a) {
  const uint16_t *s = a->src;
  float *d = a->dst, k = (float)a->scale;
  for (uint64_t i = 0; i < a->n; i++) d[i] = mul_rn_f32(f16_to_f32(s[i]), k);
}

static void widen_bf16(const struct elementwise *a) {
  const uint16_t *s = a->src;
  float *d = a->dst, k = (float)a->scale;
  for (uint64_t i = 0; i < a->n; i++) d[i] = mul_rn_f32(bf16_to_f32(s[i]), k);
}

/* NaN -> its sign | 0x7e00 (selp), else cvt.rn.f16.f32. */
static void narrow_f16(const struct elementwise *a) {
  const float *s = a->src;
  uint16_t *d = a->dst;
  for (uint64_t i = 0; i < a->n; i++) {
    uint32_t b = bits_of(s[i]);
    d[i] = s[i] != s[i] ? (uint16_t)(((b >> 16) & 0x8000) | 0x7e00) : f32_to_f16_rn(s[i]);
  }
}

/* NaN -> its top 16 bits | 0x40 (selp), else the rounding above. */
static void narrow_bf16(const struct elementwise *a) {
  const float *s = a->src;
  uint16_t *d = a->dst;
  for (uint64_t i = 0; i < a->n; i++) {
    uint32_t b = bits_of(s[i]);
    d[i] = bf16_rn(b, (uint16_t)((b >> 16) | 0x40), s[i] != s[i]);
  }
}

/* The one table of kernels the double can run: name, parameter types,
 * the fingerprint of the PTX text each twin was written for (see
 * fingerprint()), the twin, element sizes of dst and src.  A kernel of
 * groups/nccl/local.c or widen.c that is added or edited needs its twin
 * added or re-checked here; then its new fingerprint is the one the
 * failing cudaLibraryGetKernel prints. */
static const struct twin {
  const char *name, *params;
  uint64_t fingerprint;
  void (*fn)(const struct elementwise *);
  unsigned dsize, ssize;
} twins[] = {
    {"mpg_scale_f32", "u64,u64,u64,f64", 0x0b4a973ed357ba08ull, scale_f32, 4, 4},
    {"mpg_scale_f64", "u64,u64,u64,f64", 0xf25fc9ace40778b7ull, scale_f64, 8, 8},
    {"mpg_scale_f16", "u64,u64,u64,f64", 0x294785ab5c3a3bb5ull, scale_f16, 2, 2},
    {"mpg_scale_bf16", "u64,u64,u64,f64", 0x46cd59bbb0908484ull, scale_bf16, 2, 2},
    {"mpg_widen_f16", "u64,u64,u64,f64", 0x48e2316ef3533e6full, widen_f16, 4, 2},
    {"mpg_widen_bf16", "u64,u64,u64,f64", 0x05528ca36e568631ull, widen_bf16, 4, 2},
    {"mpg_narrow_f16", "u64,u64,u64,f64", 0xdfbf8ef1fe853418ull, narrow_f16, 2, 4},
    {"mpg_narrow_bf16", "u64,u64,u64,f64", 0xfdc6171085763169ull, narrow_bf16, 2, 4},
};
enum { NTWINS = sizeof twins / sizeof *twins };

static const struct twin *twin_named(const char *name) {
  for (int i = 0; i < NTWINS; i++)
    if (!strcmp(twins[i].name, name)) return &twins[i];
  return NULL;
}

static void twin_names(char *buf, size_t len) {
  size_t at = 0;
  buf[0] = '\0';
  for (int i = 0; i < NTWINS && at + 1 < len; i++) {
    int n = snprintf(buf + at, len - at, "%s%s", i ? ", " : "", twins[i].name);
    if (n > 0) at += (size_t)n;
  }
}

/* ------------------------------------------------------------------ */
/* Reading PTX                                                         */
/* ------------------------------------------------------------------ */

struct entry {
  char name[128];
  char params[160]; /* "u64,u64,u64,f64" */
  uint64_t fingerprint;
};

static int is_ident(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         c == '_' || c == '$';
}

static const char *skip_space(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* FNV-1a of the text [p, end) with every run of white space read as one
 * space: the entry's text, from ".entry" to its closing brace. */
static uint64_t fingerprint(const char *p, const char *end) {
  uint64_t h = 0xcbf29ce484222325ull;
  int space = 0;
  for (; p < end; p++) {
    int ws = *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r';
    if (ws) {
      space = 1;
      continue;
    }
    if (space) h = (h ^ ' ') * 0x100000001b3ull;
    space = 0;
    h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
  }
  return h;
}

/* The parameter types of "(.param .u64 a, .param .f64 b)" at p into out;
 * returns the character after ')' or NULL. */
static const char *read_params(const char *p, char *out, size_t len) {
  size_t at = 0;
  out[0] = '\0';
  if (*p != '(') return NULL;
  for (p++;;) {
    p = skip_space(p);
    if (*p == ')') return p + 1;
    if (strncmp(p, ".param", 6)) return NULL;
    p = skip_space(p + 6);
    if (*p != '.') return NULL;
    const char *t = ++p;
    while (is_ident(*p)) p++;
    int n = snprintf(out + at, len - at, "%s%.*s", at ? "," : "", (int)(p - t), t);
    if (n < 0 || (size_t)n >= len - at) return NULL;
    at += (size_t)n;
    while (*p && *p != ',' && *p != ')') p++;
    if (*p == ',') p++;
    if (!*p) return NULL;
  }
}

/* One ".entry NAME(params) { ... }" at p (p points at ".entry"); returns
 * where parsing goes on, or NULL when the text is not such an entry. */
static const char *read_entry(const char *p, struct entry *e) {
  const char *start = p;
  p = skip_space(p + 6);
  const char *n = p;
  while (is_ident(*p)) p++;
  if (p == n || (size_t)(p - n) >= sizeof e->name) return NULL;
  snprintf(e->name, sizeof e->name, "%.*s", (int)(p - n), n);
  p = read_params(skip_space(p), e->params, sizeof e->params);
  if (!p) return NULL;
  p = strchr(p, '{');
  if (!p) return NULL;
  int depth = 0;
  for (; *p; p++) {
    if (*p == '{') depth++;
    if (*p == '}' && --depth == 0) break;
  }
  if (!*p) return NULL;
  e->fingerprint = fingerprint(start, p + 1);
  return p + 1;
}

/* Every entry of a PTX text; -1 when the text is not PTX the double reads. */
static int read_ptx(const char *text, struct entry **out, int *n) {
  *out = NULL;
  *n = 0;
  if (!strstr(text, ".version")) return -1;
  int cap = 0;
  for (const char *p = text; (p = strstr(p, ".entry")) != NULL;) {
    if (p > text && is_ident(p[-1])) {
      p += 6;
      continue;
    }
    if (*n == cap) {
      cap = cap ? 2 * cap : 8;
      struct entry *t = realloc(*out, (size_t)cap * sizeof *t);
      if (!t) return -1;
      *out = t;
    }
    const char *next = read_entry(p, &(*out)[*n]);
    if (!next) return -1;
    (*n)++;
    p = next;
  }
  return 0;
}

/* ------------------------------------------------------------------ */
/* Libraries and kernels                                               */
/* ------------------------------------------------------------------ */

struct dlib {
  struct dlib *next;
  int unloaded, n;
  struct entry *entries;
};

struct dkern {
  struct dkern *next;
  struct dlib *lib;
  const struct twin *twin;
};

/* Kept for the life of the process, so that any handle can be checked. */
static pthread_mutex_t L = PTHREAD_MUTEX_INITIALIZER;
static struct dlib *libs;
static struct dkern *kerns;

static struct dlib *lib_find(cudaLibrary_t h) {
  for (struct dlib *l = libs; l; l = l->next)
    if ((cudaLibrary_t)l == h) return l;
  return NULL;
}

static struct dkern *kern_find(const void *h) {
  for (struct dkern *k = kerns; k; k = k->next)
    if ((const void *)k == h) return k;
  return NULL;
}

/* PTX text only: the double has no GPU code to run, only twins. */
cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                enum cudaJitOption *jitOptions, void **jitOptionsValues,
                                unsigned int numJitOptions,
                                enum cudaLibraryOption *libraryOptions,
                                void **libraryOptionValues, unsigned int numLibraryOptions) {
  dbl_cuda_enter("cudaLibraryLoadData");
  if (!library || !code || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
      (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
    return dbl_cuda_error(cudaErrorInvalidValue);
  const unsigned char *c = code;
  if ((c[0] == 0x7f && c[1] == 'E') || (c[0] == 0x50 && c[1] == 0xed))
    dbl_fatal("cudaLibraryLoadData: a cubin or fatbin image; the double loads PTX text only");
  struct dlib *l = calloc(1, sizeof *l);
  if (!l) return dbl_cuda_error(cudaErrorMemoryAllocation);
  if (read_ptx(code, &l->entries, &l->n)) {
    free(l->entries);
    free(l);
    return dbl_cuda_error(cudaErrorInvalidPtx);
  }
  pthread_mutex_lock(&L);
  l->next = libs;
  libs = l;
  pthread_mutex_unlock(&L);
  *library = (cudaLibrary_t)l;
  return cudaSuccess;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t library) {
  dbl_cuda_enter("cudaLibraryUnload");
  pthread_mutex_lock(&L);
  struct dlib *l = lib_find(library);
  int ok = l && !l->unloaded;
  if (ok) l->unloaded = 1;
  pthread_mutex_unlock(&L);
  return ok ? cudaSuccess : dbl_cuda_error(cudaErrorInvalidResourceHandle);
}

/* The twin for an entry of the library, or a loud failure: a kernel the
 * double cannot run must not pass for one that ran. */
static const struct twin *twin_for(const struct entry *e) {
  char names[512];
  const struct twin *t = twin_named(e->name);
  twin_names(names, sizeof names);
  if (!t) dbl_fatal("kernel %s has no CPU twin; twins: %s (tests/double/cuda_twins.c)",
                    e->name, names);
  if (strcmp(t->params, e->params))
    dbl_fatal("kernel %s takes (%s) but its CPU twin was written for (%s): update the twin "
              "in tests/double/cuda_twins.c", e->name, e->params, t->params);
  if (t->fingerprint != e->fingerprint)
    dbl_fatal("kernel %s's PTX is not the text its CPU twin was written for (fingerprint "
              "0x%016llx, the twin's 0x%016llx): re-check the twin against the PTX in "
              "tests/double/cuda_twins.c, then record the new fingerprint", e->name,
              (unsigned long long)e->fingerprint, (unsigned long long)t->fingerprint);
  return t;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *pKernel, cudaLibrary_t library, const char *name) {
  dbl_cuda_enter("cudaLibraryGetKernel");
  if (!pKernel || !name) return dbl_cuda_error(cudaErrorInvalidValue);
  pthread_mutex_lock(&L);
  struct dlib *l = lib_find(library);
  const struct entry *e = NULL;
  for (int i = 0; l && !l->unloaded && i < l->n && !e; i++)
    if (!strcmp(l->entries[i].name, name)) e = &l->entries[i];
  struct entry copy;
  if (e) copy = *e;
  int usable = l && !l->unloaded;
  pthread_mutex_unlock(&L);
  if (!usable) return dbl_cuda_error(cudaErrorInvalidResourceHandle);
  if (!e) return dbl_cuda_error(cudaErrorSymbolNotFound); /* cudaLibraryGetKernel docs */
  struct dkern *k = calloc(1, sizeof *k);
  if (!k) return dbl_cuda_error(cudaErrorMemoryAllocation);
  k->lib = l;
  k->twin = twin_for(&copy);
  pthread_mutex_lock(&L);
  k->next = kerns;
  kerns = k;
  pthread_mutex_unlock(&L);
  *pKernel = (cudaKernel_t)k;
  return cudaSuccess;
}

/* ------------------------------------------------------------------ */
/* Launch                                                              */
/* ------------------------------------------------------------------ */

struct launch {
  const struct twin *twin;
  struct elementwise a;
  int device;
};

/* A buffer of the kernel: device memory of the stream's device, live and
 * large enough, at the launch and again when the kernel runs.  A real GPU
 * would fault on host or another device's memory (no peer access is
 * enabled) and corrupt freed or overrun memory. */
static void check_buffer(const struct launch *j, const char *role, const void *p, size_t bytes,
                         const char *when) {
  int d = -1;
  enum dbl_mem_kind k = dbl_mem_find(p, bytes, &d);
  static const char *const what[] = {"device memory", "host memory", "freed device memory",
                                     "beyond the end of its device allocation"};
  if (k != DBL_MEM_DEVICE || d != j->device)
    dbl_fatal("kernel %s on device %d: its %s [%p, +%zu) is %s%s (of device %d) at %s: a "
              "real GPU would fault or corrupt memory", j->twin->name, j->device, role, p,
              bytes, what[k], k == DBL_MEM_DEVICE ? " of another device" : "", d, when);
}

static void check_buffers(const struct launch *j, const char *when) {
  if (!j->a.n) return; /* the grid-stride loop touches nothing */
  size_t db = (size_t)j->a.n * j->twin->dsize, sb = (size_t)j->a.n * j->twin->ssize;
  check_buffer(j, "destination", j->a.dst, db, when);
  check_buffer(j, "source", j->a.src, sb, when);
  uintptr_t d0 = (uintptr_t)j->a.dst, s0 = (uintptr_t)j->a.src;
  int same = d0 == s0 && db == sb;
  if (!same && d0 < s0 + sb && s0 < d0 + db)
    dbl_fatal("kernel %s: destination [%p, +%zu) and source [%p, +%zu) overlap without being "
              "the same buffer: the GPU's threads would race", j->twin->name, j->a.dst, db,
              j->a.src, sb);
}

static void run_launch(void *arg) {
  struct launch *j = arg;
  check_buffers(j, "the kernel's run");
  j->twin->fn(&j->a);
  free(j);
}

static int dims_ok(dim3 g, dim3 b) {
  unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
  return g.x && g.y && g.z && b.x && b.y && b.z && g.y <= 65535 && g.z <= 65535 &&
         g.x <= 0x7fffffffu && threads <= 1024 && b.z <= 64;
}

/* The C symbol: meshpg passes a cudaKernel_t cast to const void *
 * (groups/nccl/comm.c, mpg__nccl_launch_elementwise). */
cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                             size_t sharedMem, cudaStream_t stream) {
  dbl_cuda_enter("cudaLaunchKernel");
  pthread_mutex_lock(&L);
  struct dkern *k = kern_find(func);
  int unloaded = k && k->lib->unloaded;
  pthread_mutex_unlock(&L);
  if (!k) return dbl_cuda_error(cudaErrorInvalidDeviceFunction);
  if (unloaded)
    dbl_fatal("cudaLaunchKernel: kernel %s of a library already unloaded", k->twin->name);
  if (!dims_ok(gridDim, blockDim) || sharedMem > 48 * 1024)
    return dbl_cuda_error(cudaErrorInvalidConfiguration);
  if (!args) return dbl_cuda_error(cudaErrorInvalidValue);
  struct launch *j = malloc(sizeof *j);
  if (!j) return dbl_cuda_error(cudaErrorMemoryAllocation);
  j->twin = k->twin;
  memcpy(&j->a.dst, args[0], sizeof j->a.dst);
  memcpy(&j->a.src, args[1], sizeof j->a.src);
  memcpy(&j->a.n, args[2], sizeof j->a.n);
  memcpy(&j->a.scale, args[3], sizeof j->a.scale);
  j->device = dbl_stream_device(stream);
  if (j->device < 0) {
    free(j);
    return dbl_cuda_error(cudaErrorInvalidResourceHandle);
  }
  /* CUDA C++ Programming Guide, "Multi-Device System", "Stream and Event
   * Behavior": a kernel launch fails if it is issued to a stream that is
   * not associated with the current device (a memory copy succeeds). */
  if (stream && j->device != dbl_device_current()) {
    free(j);
    return dbl_cuda_error(cudaErrorInvalidResourceHandle);
  }
  check_buffers(j, "the launch");
  char what[192];
  snprintf(what, sizeof what, "kernel %s (n %llu, scale %g)", j->twin->name,
           (unsigned long long)j->a.n, j->a.scale);
  cudaError_t e = dbl_stream_submit(stream, what, 1, run_launch, j);
  if (e) free(j);
  return dbl_cuda_error(e);
}
