/* space.h - the data dir's disk: when the log's size calls for a
 * checkpoint, and the room kept free so that a checkpoint can always be
 * written (README "Durability", "Disk").
 *
 * A checkpoint is what frees the log's space (the segments it covers are
 * deleted once it is durable), but it needs room itself: a full copy of
 * the tables, written while the previous one is kept. So a log that may
 * fill the disk leaves no way out but an operator. Two rules keep one:
 *
 *   log-size trigger  a checkpoint starts once the log written since the
 *     last good one reaches a limit (--checkpoint-log-bytes): by default
 *     the larger of 64 MiB and the last checkpoint's size (Redis's
 *     auto-aof-rewrite-percentage 100 with its 64 MB minimum), at most a
 *     quarter of the data dir's file system.
 *   reserve  the log may only grow into the room free beyond what the
 *     next checkpoint needs (the tables' bytes or the last checkpoint's,
 *     whichever is larger, plus an eighth and 64 KiB). A checkpoint also
 *     starts once that room is smaller than the log written since the
 *     last one (writing as much again would not fit), so it begins
 *     before the disk is full. While a checkpoint is written, the log
 *     grows only into what was free beyond the reserve at its marker (the
 *     two never compete for the same bytes); a push that would pass it
 *     waits on the apply thread until the checkpoint ends and has freed
 *     the log (the marker is behind it, so nothing waits for the apply
 *     thread meanwhile; pulls go on). With no checkpoint running, such a
 *     push is refused, nothing changed, and a checkpoint is asked for:
 *     pushes resume by themselves once there is room.
 *
 * Records that make no rows (create, alter, drop, evict) are not held to
 * the reserve: they are small, and a drop is how an operator makes room.
 * A write that fails for want of space (ENOSPC, EDQUOT: another writer
 * filled the disk, or the file system has quotas statvfs does not show)
 * is treated as a refusal too.
 *
 * Threads: the apply thread admits and counts log writes and takes the
 * marker's snapshot; the checkpoint thread reports checkpoints and asks
 * whether one is due; any thread reads the figures (atomics). */
#ifndef EMBPS_SPACE_H
#define EMBPS_SPACE_H
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* --checkpoint-log-bytes auto (the default). */
#define EMBPS_CHECKPOINT_LOG_AUTO UINT64_MAX
/* auto: the smallest log that starts a checkpoint */
#define EMBPS_CHECKPOINT_LOG_MIN ((uint64_t)64 << 20)

typedef enum {
  EMBPS_SPACE_OK = 0,
  EMBPS_SPACE_RESERVE = 1, /* a write would reach into the reserve */
  EMBPS_SPACE_WRITE = 2,   /* a write failed for want of space */
} embps_space_state_t;

typedef struct {
  char dir[1024];
  uint64_t log_limit_cfg; /* --checkpoint-log-bytes (AUTO, 0: off, N) */
  /* apply thread only */
  uint64_t budget;       /* bytes the log may still take beyond the reserve */
  uint64_t checked_ns;   /* when budget was last set from statvfs */
  uint64_t since_check;  /* bytes logged since */
  uint64_t check_budget; /* budget then */
  int frozen;            /* a checkpoint is written: budget as at its marker */
  uint64_t marker_logged; /* `logged` at the last marker */
  uint64_t seen_free;     /* free bytes at the last statvfs of its own */
  pthread_mutex_t mu;     /* with cv: waiting for a checkpoint's end */
  pthread_cond_t cv;
  /* shared */
  atomic_uint_fast64_t logged;      /* bytes appended to the log, in all */
  atomic_uint_fast64_t ckpt_logged; /* `logged` at the last good marker */
  atomic_uint_fast64_t limit;       /* log bytes that start a checkpoint */
  atomic_uint_fast64_t reserve;     /* bytes kept free for a checkpoint */
  atomic_uint_fast64_t room;        /* the apply thread's budget */
  atomic_uint_fast64_t ckpt_bytes;  /* the last checkpoint's size */
  atomic_uint_fast64_t free_bytes, size_bytes; /* the last statvfs */
  atomic_uint_fast64_t refused;     /* log writes refused for space */
  atomic_int state;                 /* embps_space_state_t */
  atomic_int write_errno;           /* EMBPS_SPACE_WRITE: the errno */
  atomic_int want;                  /* a checkpoint would make room */
  atomic_int kicked;                /* the checkpoint thread was woken */
  atomic_int ckpt_ended;            /* apply thread: unfreeze, refresh */
  atomic_uint_fast64_t waits;       /* pushes that waited for room */
} embps_space_t;

/* Sets s up for the data dir dir: limit_cfg is --checkpoint-log-bytes,
 * log_bytes the log on disk (replayed, not yet covered by a checkpoint),
 * ckpt_bytes the size of the checkpoint restored (0: none). */
void embps_space_init(embps_space_t *s, const char *dir, uint64_t limit_cfg,
                      uint64_t log_bytes, uint64_t ckpt_bytes);
void embps_space_close(embps_space_t *s);

/* ---- apply thread ---- */
/* May the log take `bytes` more for a record that makes rows? Waits for
 * the checkpoint being written when only its end makes room. 0, or -1
 * with msg (the push is refused; s counts it and asks for a checkpoint
 * when one would free log). */
int embps_space_admit(embps_space_t *s, uint64_t bytes, char *msg,
                      size_t msg_len);
/* `bytes` were appended to the log (any record). Returns 1 when the
 * checkpoint thread should be woken: a checkpoint is due now (the log's
 * size, or the room left) and it was not woken for it yet. */
int embps_space_logged(embps_space_t *s, uint64_t bytes, int makes_rows);
/* A log write failed with errno err. Returns 1 when it was for want of
 * space (counted as a refusal; a checkpoint is asked for), else 0. */
int embps_space_write_failed(embps_space_t *s, int err);
/* At a checkpoint's marker: the budget for the log while the checkpoint
 * is written is what is free now beyond the reserve. */
void embps_space_marker(embps_space_t *s);

/* ---- checkpoint thread ---- */
/* Is a checkpoint due for the log's size or for room? The caller looks
 * with the lock the apply thread takes to wake it held, so a later
 * crossing wakes it again. */
int embps_space_due(embps_space_t *s);
/* What a due checkpoint is for: "the log's size" or "room in the data
 * dir" (static text). */
const char *embps_space_reason(embps_space_t *s);
/* The checkpoint begun at the last marker ended: ok (then bytes is its
 * size, 0 when it existed already) or failed. */
void embps_space_checkpointed(embps_space_t *s, int ok, uint64_t bytes);

/* ---- any thread ---- */
/* Why pushes are refused for space now, or "" (written into buf). */
void embps_space_refusing(embps_space_t *s, char *buf, size_t len);
/* What the next checkpoint needs free, as the tables are now (also kept
 * in s->reserve). */
uint64_t embps_space_reserve(embps_space_t *s);
/* Refreshes free_bytes and size_bytes from statvfs. 0 or -errno. */
int embps_space_stat(embps_space_t *s);
/* Bytes of the regular files in dir (not recursive). */
uint64_t embps_space_dir_bytes(const char *dir);
#endif
