/* watchdog.c - see watchdog.h. Slots are claimed and given back, and read
 * by /healthz and /metrics, under one lock (threads start and end rarely);
 * the heartbeat and the busy flag are relaxed atomics the thread stores
 * without it, so stamping costs one clock read and a store. */
#include "watchdog.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "util.h"

#define SLOTS 256

struct embps_watch {
  int live; /* mu */
  char name[32];
  int always_busy;
  atomic_int busy, paused;
  atomic_uint_fast64_t beat_ns;
};

static embps_watch_t slots[SLOTS];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local embps_watch_t *self;

embps_watch_t *embps_watch_start(const char *name, int always_busy) {
  embps_watch_t *w = NULL;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS && !w; i++) {
    if (slots[i].live)
      continue;
    w = &slots[i];
    snprintf(w->name, sizeof w->name, "%s", name);
    w->always_busy = always_busy;
    atomic_store(&w->busy, always_busy);
    atomic_store(&w->paused, 0);
    atomic_store(&w->beat_ns, embps_now_ns());
    w->live = 1;
    self = w;
  }
  pthread_mutex_unlock(&mu);
  return w;
}

void embps_watch_stop(embps_watch_t *w) {
  if (!w)
    return;
  if (self == w)
    self = NULL;
  pthread_mutex_lock(&mu);
  w->live = 0;
  pthread_mutex_unlock(&mu);
}

void embps_watch_beat(embps_watch_t *w) {
  if (w)
    atomic_store_explicit(&w->beat_ns, embps_now_ns(), memory_order_relaxed);
}

void embps_watch_busy(embps_watch_t *w, int busy) {
  if (!w)
    return;
  embps_watch_beat(w);
  atomic_store_explicit(&w->busy, busy || w->always_busy,
                        memory_order_relaxed);
}

void embps_watch_pause(void) {
  if (self)
    atomic_store(&self->paused, 1);
}

void embps_watch_resume(void) {
  if (self) {
    embps_watch_beat(self);
    atomic_store(&self->paused, 0);
  }
}

/* How long w has had work in hand without progress (0: idle). */
static double stalled_s(embps_watch_t *w, uint64_t now) {
  if (!atomic_load_explicit(&w->busy, memory_order_relaxed) ||
      atomic_load_explicit(&w->paused, memory_order_relaxed))
    return 0;
  uint64_t beat = atomic_load_explicit(&w->beat_ns, memory_order_relaxed);
  return now > beat ? (double)(now - beat) / 1e9 : 0;
}

void embps_watch_each(void (*fn)(const char *name, double seconds, void *ctx),
                      void *ctx) {
  uint64_t now = embps_now_ns();
  pthread_mutex_lock(&mu);
  for (int i = 0; i < SLOTS; i++)
    if (slots[i].live)
      fn(slots[i].name, stalled_s(&slots[i], now), ctx);
  pthread_mutex_unlock(&mu);
}

int embps_watch_check(uint64_t stall_ms, char *why, size_t why_len) {
  uint64_t now = embps_now_ns();
  int stalled = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; stall_ms && i < SLOTS && !stalled; i++) {
    double s = slots[i].live ? stalled_s(&slots[i], now) : 0;
    if (s * 1000 >= (double)stall_ms) {
      snprintf(why, why_len, "%s: no progress for %.1f s with work in hand",
               slots[i].name, s);
      stalled = 1;
    }
  }
  pthread_mutex_unlock(&mu);
  return stalled;
}
