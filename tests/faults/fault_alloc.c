/* The allocation wrappers of fault_alloc.h (linked with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc). */
#include "fault_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);

static _Thread_local long countdown; /* 0: disarmed */
static _Thread_local long count;
static _Thread_local int fired;
static atomic_int linked;

static int hit(void) {
  count++;
  if (countdown > 0 && --countdown == 0) {
    fired = 1;
    return 1;
  }
  return 0;
}

void *__wrap_malloc(size_t n) {
  atomic_store_explicit(&linked, 1, memory_order_relaxed);
  return hit() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size) {
  atomic_store_explicit(&linked, 1, memory_order_relaxed);
  return hit() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n) {
  atomic_store_explicit(&linked, 1, memory_order_relaxed);
  return hit() ? NULL : __real_realloc(p, n);
}

void fa_arm(long n) {
  countdown = n > 0 ? n : 0;
  fired = 0;
}

int fa_disarm(void) {
  countdown = 0;
  return fired;
}

int fa_fired(void) { return fired; }

long fa_count(void) { return count; }

int fa_linked(void) {
  /* One allocation through the wrapper, if it is linked. */
  void *volatile p = malloc(1);
  free(p);
  return atomic_load_explicit(&linked, memory_order_relaxed);
}
