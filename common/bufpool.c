/* bufpool.c - a few large buffers kept for reuse (bufpool.h). */
#include "bufpool.h"

#include <stdlib.h>
#include <string.h>

void embps_bufpool_init(embps_bufpool_t *pool, size_t min_bytes,
                        size_t max_bytes) {
  memset(pool, 0, sizeof *pool);
  pthread_mutex_init(&pool->lock, NULL);
  pool->min_bytes = min_bytes;
  pool->max_bytes = max_bytes;
}

void embps_bufpool_close(embps_bufpool_t *pool) {
  for (size_t i = 0; i < EMBPS_BUFPOOL_SLOTS; i++)
    free(pool->slot[i].p);
  memset(pool->slot, 0, sizeof pool->slot);
  pool->kept = 0;
  pthread_mutex_destroy(&pool->lock);
}

void *embps_bufpool_take(embps_bufpool_t *pool, size_t bytes, size_t *cap) {
  if (!bytes)
    bytes = 1;
  void *p = NULL;
  if (bytes >= pool->min_bytes) {
    pthread_mutex_lock(&pool->lock);
    size_t best = EMBPS_BUFPOOL_SLOTS;
    for (size_t i = 0; i < EMBPS_BUFPOOL_SLOTS; i++)
      if (pool->slot[i].p && pool->slot[i].cap >= bytes &&
          (best == EMBPS_BUFPOOL_SLOTS ||
           pool->slot[i].cap < pool->slot[best].cap))
        best = i;
    if (best < EMBPS_BUFPOOL_SLOTS) {
      p = pool->slot[best].p;
      *cap = pool->slot[best].cap;
      pool->slot[best].p = NULL;
      pool->kept -= *cap;
    }
    pthread_mutex_unlock(&pool->lock);
  }
  if (!p) {
    p = malloc(bytes);
    *cap = bytes;
  }
  return p;
}

void embps_bufpool_give(embps_bufpool_t *pool, void *p, size_t cap) {
  if (!p)
    return;
  if (cap < pool->min_bytes) {
    free(p);
    return;
  }
  pthread_mutex_lock(&pool->lock);
  size_t low = 0;
  for (size_t i = 0; i < EMBPS_BUFPOOL_SLOTS; i++) {
    if (!pool->slot[i].p) {
      low = i;
      break;
    }
    if (pool->slot[i].cap < pool->slot[low].cap)
      low = i;
  }
  void *drop = p;
  const size_t out = pool->slot[low].p ? pool->slot[low].cap : 0;
  if ((!pool->slot[low].p || out < cap) &&
      pool->kept - out + cap <= pool->max_bytes) {
    drop = pool->slot[low].p;
    pool->slot[low].p = p;
    pool->slot[low].cap = cap;
    pool->kept += cap - out;
  }
  pthread_mutex_unlock(&pool->lock);
  free(drop); /* outside the lock: freeing a large buffer is a munmap */
}
