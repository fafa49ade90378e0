/* space.c - see space.h. Free space comes from statvfs (f_bavail: what an
 * unprivileged writer may use) of the data dir. The apply thread keeps a
 * budget, the bytes the log may take before it reaches the reserve, and
 * takes them off as it appends; it asks statvfs again when the budget
 * runs out, when half of it is spent, and at least every 100 ms (other
 * writers share the disk), but never while a checkpoint is written: then
 * the budget stays what it was at the marker, less what the log took since
 * (statvfs would show the checkpoint's own writes as space lost). */
#include "space.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "table.h"
#include "util.h"
#include "watchdog.h"

#define RECHECK_NS 100000000ull /* statvfs at least this often */
#define RESERVE_SLACK ((uint64_t)64 << 10)
#define ROOM_OK ((uint64_t)1 << 20) /* room that ends a refusal's report */

static uint64_t load(const atomic_uint_fast64_t *v) {
  return atomic_load_explicit(v, memory_order_relaxed);
}
static void store(atomic_uint_fast64_t *v, uint64_t x) {
  atomic_store_explicit(v, x, memory_order_relaxed);
}

/* The tables as they are now (their files are within a few percent of
 * their bytes in memory) or the last checkpoint, whichever is larger, and
 * an eighth more for growth during the write, headers and the MANIFEST. */
uint64_t embps_space_reserve(embps_space_t *s) {
  uint64_t base = embps_tables_total_bytes(), last = load(&s->ckpt_bytes);
  if (last > base)
    base = last;
  uint64_t r = base + base / 8 + RESERVE_SLACK;
  store(&s->reserve, r);
  return r;
}

/* The log size that starts a checkpoint, from the configuration, the last
 * checkpoint and the file system's size. */
static void set_limit(embps_space_t *s) {
  uint64_t limit = s->log_limit_cfg;
  if (limit == EMBPS_CHECKPOINT_LOG_AUTO) {
    uint64_t last = load(&s->ckpt_bytes), size = load(&s->size_bytes);
    limit = last > EMBPS_CHECKPOINT_LOG_MIN ? last : EMBPS_CHECKPOINT_LOG_MIN;
    if (size && limit > size / 4)
      limit = size / 4;
  }
  store(&s->limit, limit);
}

int embps_space_stat(embps_space_t *s) {
  struct statvfs st;
  if (statvfs(s->dir, &st))
    return -errno;
  store(&s->free_bytes, (uint64_t)st.f_bavail * st.f_frsize);
  store(&s->size_bytes, (uint64_t)st.f_blocks * st.f_frsize);
  return 0;
}

/* The room beyond the reserve, from a statvfs now (UINT64_MAX when the
 * file system cannot say: writes will find out); *free gets free bytes. */
static uint64_t room_now(embps_space_t *s, uint64_t *free) {
  uint64_t reserve = embps_space_reserve(s);
  if (embps_space_stat(s)) {
    *free = UINT64_MAX;
    return UINT64_MAX;
  }
  *free = load(&s->free_bytes);
  return *free > reserve ? *free - reserve : 0;
}

uint64_t embps_space_dir_bytes(const char *dir) {
  DIR *d = opendir(dir);
  uint64_t bytes = 0;
  if (!d)
    return 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[2200];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (!stat(path, &st) && S_ISREG(st.st_mode))
      bytes += (uint64_t)st.st_size;
  }
  closedir(d);
  return bytes;
}

void embps_space_init(embps_space_t *s, const char *dir, uint64_t limit_cfg,
                      uint64_t log_bytes, uint64_t ckpt_bytes) {
  memset(s, 0, sizeof *s);
  snprintf(s->dir, sizeof s->dir, "%s", dir);
  s->log_limit_cfg = limit_cfg;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  store(&s->logged, log_bytes); /* the replayed log counts from the start */
  store(&s->ckpt_bytes, ckpt_bytes);
  s->budget = s->check_budget = room_now(s, &s->seen_free);
  s->checked_ns = embps_now_ns();
  store(&s->room, s->budget);
  set_limit(s);
}

void embps_space_close(embps_space_t *s) {
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->cv);
}

/* Would a checkpoint now be due, with `logged` bytes logged in all? */
static int due_at(embps_space_t *s, uint64_t logged) {
  uint64_t since = logged - load(&s->ckpt_logged), limit = load(&s->limit);
  return since && ((limit && since >= limit) || atomic_load(&s->want) ||
                   load(&s->room) < since);
}

/* ------------------------------------------------------------ apply thread */

static void set_budget(embps_space_t *s, uint64_t budget) {
  s->budget = budget;
  store(&s->room, budget);
}

/* Sets the budget from statvfs now. */
static void refresh(embps_space_t *s) {
  set_budget(s, room_now(s, &s->seen_free));
  s->checked_ns = embps_now_ns();
  s->since_check = 0;
  s->check_budget = s->budget;
}

/* Waits until the checkpoint being written ends (it cannot need this
 * thread: its marker is behind), then takes the room it left. */
static void wait_checkpoint(embps_space_t *s) {
  atomic_fetch_add(&s->waits, 1);
  embps_watch_pause(); /* the checkpoint thread's work, not a wedge */
  pthread_mutex_lock(&s->mu);
  while (!atomic_load(&s->ckpt_ended))
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  embps_watch_resume();
  atomic_store(&s->ckpt_ended, 0);
  s->frozen = 0;
  refresh(s);
}

/* A checkpoint would free the log written since the last good one. */
static void want_room(embps_space_t *s) {
  if (load(&s->logged) > load(&s->ckpt_logged))
    atomic_store(&s->want, 1);
}

int embps_space_admit(embps_space_t *s, uint64_t bytes, char *msg,
                      size_t msg_len) {
  if (s->frozen && atomic_exchange(&s->ckpt_ended, 0)) {
    s->frozen = 0;
    s->checked_ns = 0;
  }
  if (!s->frozen &&
      (bytes > s->budget || s->since_check >= s->check_budget / 2 ||
       embps_now_ns() - s->checked_ns >= RECHECK_NS))
    refresh(s);
  if (bytes > s->budget && s->frozen)
    wait_checkpoint(s);
  if (bytes <= s->budget)
    return 0;
  atomic_fetch_add(&s->refused, 1);
  atomic_store(&s->state, EMBPS_SPACE_RESERVE);
  want_room(s);
  snprintf(msg, msg_len, "data dir %s: %" PRIu64 " bytes free, %" PRIu64
           " of them kept for the next checkpoint: push refused, nothing "
           "changed (pushes resume by themselves once a checkpoint or freed "
           "space makes room)", s->dir, s->seen_free, load(&s->reserve));
  return -1;
}

int embps_space_logged(embps_space_t *s, uint64_t bytes, int makes_rows) {
  uint64_t after = atomic_fetch_add(&s->logged, bytes) + bytes;
  set_budget(s, bytes < s->budget ? s->budget - bytes : 0);
  s->since_check += bytes;
  if (makes_rows)
    atomic_store(&s->state, EMBPS_SPACE_OK);
  return due_at(s, after) && !atomic_exchange(&s->kicked, 1);
}

int embps_space_write_failed(embps_space_t *s, int err) {
  if (err != ENOSPC && err != EDQUOT)
    return 0;
  atomic_fetch_add(&s->refused, 1);
  atomic_store(&s->write_errno, err);
  atomic_store(&s->state, EMBPS_SPACE_WRITE);
  set_budget(s, 0);
  s->check_budget = 0; /* statvfs again at the next write */
  want_room(s);
  return 1;
}

void embps_space_marker(embps_space_t *s) {
  atomic_store(&s->ckpt_ended, 0);
  refresh(s);
  s->frozen = 1;
  s->marker_logged = load(&s->logged);
}

/* ------------------------------------------------------------ checkpoints */

int embps_space_due(embps_space_t *s) {
  atomic_store(&s->kicked, 0); /* looked: the next crossing wakes again */
  return due_at(s, load(&s->logged));
}

const char *embps_space_reason(embps_space_t *s) {
  uint64_t since = load(&s->logged) - load(&s->ckpt_logged);
  uint64_t limit = load(&s->limit);
  return limit && since >= limit ? "the log's size" : "room in the data dir";
}

void embps_space_checkpointed(embps_space_t *s, int ok, uint64_t bytes) {
  if (ok) {
    /* marker_logged was written on the apply thread before the marker's
     * completion, which the checkpoint thread waited for under a lock */
    store(&s->ckpt_logged, s->marker_logged);
    if (bytes)
      store(&s->ckpt_bytes, bytes);
    atomic_store(&s->want, 0);
  }
  uint64_t free;
  store(&s->room, room_now(s, &free)); /* the apply thread's, until it looks */
  set_limit(s);
  pthread_mutex_lock(&s->mu);
  atomic_store(&s->ckpt_ended, 1);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------ any thread */

void embps_space_refusing(embps_space_t *s, char *buf, size_t len) {
  int state = atomic_load(&s->state);
  uint64_t free = 0;
  /* refused for the reserve: as long as there is still no room */
  if (state == EMBPS_SPACE_RESERVE && room_now(s, &free) >= ROOM_OK)
    state = EMBPS_SPACE_OK;
  if (state == EMBPS_SPACE_RESERVE)
    snprintf(buf, len, "data dir %s: full (%" PRIu64 " bytes free, %" PRIu64
             " kept for the next checkpoint): pushes refused until a "
             "checkpoint or freed space makes room", s->dir, free,
             load(&s->reserve));
  else if (state == EMBPS_SPACE_WRITE)
    snprintf(buf, len, "data dir %s: a log write failed (%s): pushes "
             "refused until a checkpoint or freed space makes room", s->dir,
             strerror(atomic_load(&s->write_errno)));
  else if (len)
    buf[0] = 0;
}
