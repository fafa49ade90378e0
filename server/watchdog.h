/* watchdog.h - liveness of the threads that serve (README "Monitoring",
 * /healthz): each I/O thread and the apply thread stamps a heartbeat as it
 * makes progress, and /healthz fails once one that has work in hand has
 * not progressed for --stall-timeout seconds, so an orchestrator restarts
 * a server whose apply or I/O thread is wedged (a deadlock, a lost
 * wake-up, a hung system call) although its HTTP thread still answers.
 *
 * What counts as work in hand, and as progress:
 *   apply thread  busy from taking a request off its queue until its run
 *     returns; idle while the queue is empty, and while it waits for a
 *     checkpoint to free the log (space.h: the checkpoint thread's work,
 *     which may take minutes on large tables; not a wedge of this thread).
 *     So one request running longer than the timeout fails /healthz: the
 *     longest ones, a 64 MiB push or import, take about a second.
 *   I/O threads  always busy: their loop wakes at least every 200 ms (the
 *     sweep timer) and stamps the heartbeat there; a loop stuck in a
 *     callback stops stamping.
 * The default timeout, 60 s, is far above either (a timer late by a
 * minute is a wedge, not load), so a slow machine does not make it flap.
 *
 * Watches are process-wide, like the /metrics counters: a fixed table of
 * slots claimed by threads as they start and given back as they end. */
#ifndef EMBPS_WATCHDOG_H
#define EMBPS_WATCHDOG_H
#include <stddef.h>
#include <stdint.h>

typedef struct embps_watch embps_watch_t;

/* Watches the calling thread as `name` (copied; e.g. "apply", "io-1"):
 * always_busy for a loop that stamps as it turns. NULL when every slot is
 * taken (the thread is then not watched). */
embps_watch_t *embps_watch_start(const char *name, int always_busy);
/* The thread ends: its slot is free again. NULL-safe. */
void embps_watch_stop(embps_watch_t *w);
/* Progress now. NULL-safe. */
void embps_watch_beat(embps_watch_t *w);
/* Work taken (busy 1) or done (0); both stamp the heartbeat. NULL-safe. */
void embps_watch_busy(embps_watch_t *w, int busy);
/* The calling thread waits for another thread's work (its watch, if any,
 * stops counting) until embps_watch_resume. */
void embps_watch_pause(void);
void embps_watch_resume(void);

/* 0 when every watched thread with work in hand progressed within
 * stall_ms; else 1 with why naming the first that did not ("apply: no
 * progress for 75.1 s with work in hand"). stall_ms 0: never stalled. */
int embps_watch_check(uint64_t stall_ms, char *why, size_t why_len);

/* Calls fn(name, seconds, ctx) for each watched thread: how long it has
 * had work in hand without progress (0 when idle). */
void embps_watch_each(void (*fn)(const char *name, double seconds, void *ctx),
                      void *ctx);
#endif
