/* A failed allocation on one thread, for the fault property tests
 * (test_fault_props.c, fault_props_mpi_worker.c).
 *
 * The programs that use it link meshpg's objects statically with
 * -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc (tests/faults/meson.build):
 * every allocation that meshpg's code (and the test's own) makes goes
 * through fault_alloc.c, which counts them per thread and fails the one
 * that fa_arm chose.  Allocations inside other libraries (libc, Open MPI,
 * the CUDA/NCCL double, Criterion) are not wrapped, and a thread that never
 * armed (meshpg's shared-memory workers, the MPI progress thread, the
 * double's stream executors, a watchdog) never fails: the countdown is
 * thread-local, so a rank's own thread is the only one that can fail. */
#ifndef MESHPG_TESTS_FAULT_ALLOC_H
#define MESHPG_TESTS_FAULT_ALLOC_H

#include <stddef.h>

/* On the calling thread: the n-th allocation from now (n >= 1) fails
 * (returns NULL); n <= 0 disarms. */
void fa_arm(long n);
/* Disarm on the calling thread; returns 1 when the armed failure happened
 * since the last fa_arm. */
int fa_disarm(void);
/* 1 when the armed failure happened since the last fa_arm (calling
 * thread). */
int fa_fired(void);
/* Allocations the calling thread made through the wrappers so far. */
long fa_count(void);
/* 1 when the program was linked with the wrappers (a call through
 * malloc reached __wrap_malloc). */
int fa_linked(void);

void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

#endif
