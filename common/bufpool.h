/* bufpool.h - a few large buffers kept for reuse.
 *
 * Requests and replies of a batch are megabytes, and they come and go at
 * every batch. malloc serves such sizes with a fresh mmap (past its mmap
 * threshold, at most 32 MiB) or returns them to the kernel when they sit at
 * the top of the heap, and either way every byte of the next buffer is
 * page-faulted in again, which in a virtual machine costs more than the
 * copy into it. A pool keeps the largest buffers given back (at most
 * EMBPS_BUFPOOL_SLOTS of them, max_bytes in all) and hands out the
 * smallest that fits. Thread-safe. */
#ifndef EMBPS_BUFPOOL_H
#define EMBPS_BUFPOOL_H
#include <pthread.h>
#include <stddef.h>

#define EMBPS_BUFPOOL_SLOTS 8

typedef struct {
  pthread_mutex_t lock;
  size_t min_bytes; /* smaller buffers are not kept */
  size_t max_bytes; /* the most kept in all */
  size_t kept;
  struct {
    void *p;
    size_t cap;
  } slot[EMBPS_BUFPOOL_SLOTS];
} embps_bufpool_t;

/* Buffers of fewer than min_bytes bytes are left to malloc; at most
 * max_bytes are kept. */
void embps_bufpool_init(embps_bufpool_t *pool, size_t min_bytes,
                        size_t max_bytes);
/* Frees every kept buffer. */
void embps_bufpool_close(embps_bufpool_t *pool);
/* A buffer of at least `bytes` (0 counts as 1): the smallest kept one that
 * fits, else a new one. *cap gets its size, to pass to embps_bufpool_give.
 * NULL when out of memory. */
void *embps_bufpool_take(embps_bufpool_t *pool, size_t bytes, size_t *cap);
/* Gives back p (cap bytes; NULL is ignored): kept in place of the smallest
 * kept buffer when that one is smaller and the total stays within
 * max_bytes, else freed. */
void embps_bufpool_give(embps_bufpool_t *pool, void *p, size_t cap);
#endif
