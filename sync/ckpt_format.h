/* The checkpoint format (docs/checkpoints.md): the metadata file's
 * encoding and decoding, and the checksum.  Shared by sync/ckpt*.c (save,
 * load) and tools/cmd_ckpt.c (meshpg ckpt info / export); the decoder is
 * fuzzed (tests/fuzz/fuzz_ckpt_meta.c).
 *
 * A checkpoint directory holds
 *   meta.mpgc          the metadata below, written last;
 *   data-RRRRR.bin     the chunks written by world rank R (only ranks that
 *                      write a chunk have a file), at the offsets the
 *                      metadata gives.
 *
 * The metadata is little-endian binary:
 *   header   magic "MPGCKPT\n" (8 bytes), u32 version (1), u32 flags (0),
 *            u64 length of the whole file, u64 save_id, i64 step,
 *            u32 world size, u32 nfiles, u32 ntensors, u32 nchunks,
 *            u64 nhashes, u64 block_bytes, u32 mesh text length, then the
 *            mesh text (UTF-8, no NUL; e.g. "pp=2,dp=2,tp=2 sync=shard");
 *   files    nfiles x { u32 rank, u64 bytes }
 *   tensors  ntensors x { u16 name length, name bytes (no NUL), u8 dtype
 *            (MPG__CKPT_DT_*), u8 kind (mpg_ckpt_kind), u8 ndim,
 *            ndim x u64 shape, u32 first chunk, u32 chunk count }
 *            in strictly increasing name order (bytewise);
 *   chunks   nchunks x { u32 tensor, u32 file (index into files),
 *            ndim x u64 box offset, ndim x u64 box shape (ndim of its
 *            tensor), u64 range offset, u64 range count (elements of the
 *            box, row-major), u64 file offset (bytes), u64 first hash }
 *            grouped by tensor (a tensor's chunks are consecutive, in the
 *            tensor order);
 *   hashes   nhashes x u64: chunk c's data (range count x element size
 *            bytes) is cut in blocks of block_bytes (the last one
 *            shorter); block b's XXH64 (seed 0) is hashes[first hash + b];
 *   trailer  u64 XXH64 (seed 0) of every byte before it.
 *
 * The decoder checks everything a reader relies on: the magic, the
 * version (newer: MPG_ERR_UNSUPPORTED), the length, the trailer, that
 * every count fits the file, names are non-empty and unique (sorted),
 * dtypes, kinds and ndim are in range, no extent is 0, every box lies in
 * its tensor's shape, every range in its box, range counts are > 0, every
 * chunk's bytes lie within its file's size, the hash ranges are within
 * nhashes and consecutive (chunk c's first hash is the sum of the block
 * counts before it), and the tensors' chunk ranges partition the chunks.
 * It does not check that the chunks cover the tensors (load reports what
 * it needs and cannot find). */
#ifndef MPG_SYNC_CKPT_FORMAT_H
#define MPG_SYNC_CKPT_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MPG__CKPT_MAGIC "MPGCKPT\n"
#define MPG__CKPT_VERSION 1u
#define MPG__CKPT_META "meta.mpgc"
#define MPG__CKPT_NAME_MAX 255

/* dtypes of the format: the public mpg_dtype values, then U8 (bytes). */
enum { MPG__CKPT_DT_U8 = 6, MPG__CKPT_DT_COUNT = 7 };
/* Element size of a format dtype (0 for an unknown one). */
size_t mpg__ckpt_dtype_size(int dtype);
/* "F32", "F64", "F16", "BF16", "I32", "I64", "U8" (safetensors' names);
 * "?" for an unknown one. */
const char *mpg__ckpt_dtype_name(int dtype);
/* "param", "state", "bytes" (an mpg_ckpt_kind), as `meshpg ckpt info`
 * prints it; "?" for an unknown one. */
const char *mpg__ckpt_kind_name(int kind);

typedef struct mpg__ckpt_file {
  uint32_t rank;  /* the file is data-%05u.bin of this rank */
  uint64_t bytes; /* its size */
} mpg__ckpt_file;

typedef struct mpg__ckpt_tensor {
  char *name; /* NUL-terminated */
  int dtype, kind, ndim;
  uint64_t shape[MPG_CKPT_MAX_NDIM];
  uint32_t first_chunk, nchunks;
} mpg__ckpt_tensor;

typedef struct mpg__ckpt_chunk {
  uint32_t tensor, file;
  uint64_t box_off[MPG_CKPT_MAX_NDIM], box_shape[MPG_CKPT_MAX_NDIM];
  uint64_t range_off, range_count;
  uint64_t file_off;
  uint64_t first_hash;
} mpg__ckpt_chunk;

typedef struct mpg__ckpt_meta {
  uint32_t version;
  uint64_t save_id;
  int64_t step;
  uint32_t world;
  uint64_t block_bytes;
  char *mesh; /* NUL-terminated */
  uint32_t nfiles, ntensors, nchunks;
  uint64_t nhashes;
  mpg__ckpt_file *files;
  mpg__ckpt_tensor *tensors;
  mpg__ckpt_chunk *chunks;
  uint64_t *hashes;
} mpg__ckpt_meta;

/* XXH64 of n bytes with `seed` (the published algorithm; XXH64("", 0) is
 * 0xef46db3751d8e999). */
uint64_t mpg__xxh64(const void *data, size_t n, uint64_t seed);

/* Blocks of a chunk of `bytes` bytes: ceil(bytes / block_bytes). */
uint64_t mpg__ckpt_nblocks(uint64_t bytes, uint64_t block_bytes);

/* Encode *m (valid as the decoder requires) into a malloc'ed buffer *out
 * of *len bytes, trailer included.  Returns MPG_OK; MPG_ERR_INVALID when
 * m breaks a rule the decoder checks (names unsorted, ...), naming it;
 * MPG_ERR_NOMEM. */
mpg_status mpg__ckpt_meta_encode(const mpg__ckpt_meta *m, unsigned char **out, size_t *len);

/* Decode buf[0..len) into *m (freed with mpg__ckpt_meta_free, also after a
 * failure).  `path` names the file in messages ("run/step-10/meta.mpgc").
 * Returns MPG_OK; MPG_ERR_INVALID naming the path, the field and the byte
 * offset ("run/x/meta.mpgc: chunk 3 of tensor h1.fc.w: box exceeds the
 * shape on axis 1 (offset 64 + 128 > 96)"); MPG_ERR_UNSUPPORTED for a
 * version newer than MPG__CKPT_VERSION (naming both); MPG_ERR_NOMEM.
 * Never reads outside buf; allocations are bounded by len. */
mpg_status mpg__ckpt_meta_decode(const unsigned char *buf, size_t len, const char *path,
                                 mpg__ckpt_meta *m);

/* Read and decode dir/meta.mpgc (ckpt_open.c, through
 * mpg__ckpt_reader_open: only a regular file, the header checked before
 * the body is read).
 * MPG_ERR_NOT_FOUND when dir or the file does not exist ("run/x is not a
 * checkpoint: no meta.mpgc"); MPG_ERR_IO for read errors and files that
 * are not regular; the decoder's errors. */
mpg_status mpg__ckpt_meta_read(const char *dir, mpg__ckpt_meta *m);

/* The first MPG__CKPT_HEADER_BYTES of a metadata file of `size` bytes,
 * checked before its body is read: the magic, the version, the flags, the
 * length field (== size) and that size is no more than the header's counts
 * allow.  hdr holds min(size, MPG__CKPT_HEADER_BYTES) bytes.  Returns
 * MPG_OK or the decoder's errors (MPG_ERR_INVALID, MPG_ERR_UNSUPPORTED). */
#define MPG__CKPT_HEADER_BYTES 76
mpg_status mpg__ckpt_meta_precheck(const unsigned char *hdr, uint64_t size, const char *path);

/* Reading a checkpoint directory (ckpt_open.c) as one snapshot: the
 * directory is opened once and meta.mpgc and every data file are opened
 * relative to that handle, as regular files only (O_NONBLOCK | O_NOFOLLOW,
 * then fstat: a FIFO, a device or a symbolic link is refused before any
 * read).  A save publishes a checkpoint by renaming a complete directory
 * over `dir` and only then removes the old one; a reader that finds a file
 * missing while `dir` names another directory than its handle was looking
 * at the old checkpoint being removed (mpg__ckpt_reader_moved), and starts
 * again on the new one. */
typedef struct mpg__ckpt_reader {
  const char *dir;   /* as given (messages) */
  int dfd;           /* the directory, -1 when closed */
  uint64_t dev, ino; /* its identity */
  mpg__ckpt_meta m;
  int *fds; /* per file of m, -1 until opened */
} mpg__ckpt_reader;

/* Open dir and read its metadata into r->m; *r is zeroed first and must be
 * closed (mpg__ckpt_reader_close) also after a failure.  Errors as
 * mpg__ckpt_meta_read. */
mpg_status mpg__ckpt_reader_open(mpg__ckpt_reader *r, const char *dir);

/* Data file `file` (an index into r->m.files), opened once relative to the
 * directory handle: a regular file of at least the metadata's size.
 * MPG_ERR_NOT_FOUND when missing; MPG_ERR_IO naming the path otherwise. */
mpg_status mpg__ckpt_reader_file(mpg__ckpt_reader *r, uint32_t file, int *fd);

/* Open every data file of r->m at once, when there are at most `most`:
 * the snapshot of the directory is then taken before any planning.  Best
 * effort: a file that cannot be opened is left for mpg__ckpt_reader_file
 * to report, if it is needed at all. */
void mpg__ckpt_reader_open_all(mpg__ckpt_reader *r, uint32_t most);
#define MPG__CKPT_EAGER_FILES 256

/* 1 when `dir` no longer names the directory r opened (a save published a
 * new checkpoint since), else 0. */
int mpg__ckpt_reader_moved(const mpg__ckpt_reader *r);

/* Close every descriptor and free the metadata; a closed reader (or one
 * whose open failed): nothing. */
void mpg__ckpt_reader_close(mpg__ckpt_reader *r);

/* How many times a reader starts again because a save replaced the
 * checkpoint under it before it gives up (MPG_ERR_IO). */
#define MPG__CKPT_READ_TRIES 16

/* Checks of a name for mpg_ckpt_add: printable UTF-8 (no control
 * character, C0, DEL or C1, no invalid or overlong sequence) and not
 * reserved ("__metadata__", the safetensors header's key).  NULL when
 * fine, else the rule broken (static text). */
const char *mpg__ckpt_name_rule(const char *name);

/* Free what decode or the caller allocated (names, mesh, arrays) and zero
 * *m; NULL or zeroed: nothing. */
void mpg__ckpt_meta_free(mpg__ckpt_meta *m);

/* Tensor index by name (binary search; the names are sorted), -1 when
 * absent. */
int mpg__ckpt_meta_find(const mpg__ckpt_meta *m, const char *name);

/* Elements of a box (product of box_shape[0..ndim)). */
uint64_t mpg__ckpt_box_elems(const uint64_t *box_shape, int ndim);

/* "dir/data-00003.bin" into buf. */
void mpg__ckpt_data_path(const char *dir, uint32_t rank, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
