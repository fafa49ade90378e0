/* feed.c - see feed.h. The backlog is a ring of records in LSN order
 * (ring[head] holds `first`, the one after the last holds `next`), each
 * record reference counted: a reply being built holds its records while
 * the apply thread goes on and the ring may drop them. A follower's
 * session (by its name) keeps its stream's cursor, the FETCHes held for
 * it in arrival order, and what it acknowledged. */
#include "feed.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "le.h"
#include "server.h"

#define TICK_MS 100          /* the feed thread looks at least this often */
#define WAIT_MS_MAX 5000     /* a FETCH held at most this long */
#define MAX_BYTES_MIN 4096   /* a FETCH's reply bound, at least */

typedef struct rec {
  atomic_uint refs;
  uint64_t lsn, at_ns; /* at_ns: when it was appended (lag in ms) */
  size_t len;          /* header and payload */
  uint8_t bytes[];
} rec_t;

typedef struct {
  int used;
  uint64_t id; /* the follower process */
  char name[EMBPS_ADDR_MAX];
  uint64_t stream, cursor; /* the next LSN its stream gets */
  uint64_t applied, durable;
  uint64_t seen_ns, caught_ns; /* last FETCH; last time it had all ours */
  uint64_t bytes;
  embps_wal_cursor_t log_hint; /* where its last read of the log ended */
  embps_request_t *held_head, *held_tail;
} sess_t;

struct embps_feed {
  embps_server_t *srv;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* the feed thread; CLOCK_MONOTONIC */
  pthread_t thread;
  int started, stopping, draining;
  atomic_int active;
  uint64_t last_fetch_ns; /* idle deactivation */
  /* backlog */
  rec_t **ring;
  size_t cap, head, n;
  uint64_t first, next; /* next 0: whatever is appended first */
  size_t bytes, max_bytes;
  uint64_t pins[EMBPS_FEED_PINS_MAX]; /* first LSN kept; 0: free */
  embps_history_t hist;
  /* the log (--data-dir): records older than the backlog */
  embps_wal_t *wal;
  char log_dir[1100];
  sess_t sess[EMBPS_FEED_FOLLOWERS_MAX];
  size_t n_held;
  /* acknowledgements */
  embps_request_t *wait_head, *wait_tail; /* rising ack_lsn */
  uint64_t acked; /* the LSN sync_n followers hold durable */
  uint32_t sync_n, in_sync;
  uint64_t sync_timeout_ns;
  uint64_t retain_ns; /* --repl-retain-ms */
  atomic_uint_fast64_t shipped;
  /* --sync-degrade-ms (feed.h "Degrading"); mu */
  uint64_t degrade_ns;   /* 0: strict */
  int degraded;          /* acknowledging without followers now */
  uint64_t short_since;  /* fewer than sync_n in sync since (0: enough) */
  uint64_t strict_from;  /* acks wait again from the record after this */
  int want;              /* the state asked of the recorder */
  uint64_t want_gen;     /* that request's number */
  int recorded;          /* the recorder said want_gen (degraded) holds */
  uint64_t degradations;
  int must_record;        /* --coordinator: degrade only once recorded */
  embps_feed_record_fn record;
  void *record_ctx;
};

static void rec_put(rec_t *r) {
  if (atomic_fetch_sub(&r->refs, 1) == 1)
    free(r);
}

static rec_t *ring_at(const embps_feed_t *f, size_t i) {
  return f->ring[(f->head + i) % f->cap];
}

/* The primary's last LSN: records appended, or applied. mu held. */
static uint64_t last_lsn_locked(const embps_feed_t *f) {
  uint64_t a = f->srv->apply ? embps_apply_lsn(f->srv->apply) : 0;
  uint64_t b = f->next ? f->next - 1 : 0;
  return a > b ? a : b;
}

/* ------------------------------------------------------------ backlog */

/* Drops records from the front while over the bound and unpinned. Past
 * twice the bound the pins let go (a pin must not grow the backlog without
 * end: a follower whose copy wanted those records copies again). */
static void trim_locked(embps_feed_t *f) {
  uint64_t keep = UINT64_MAX;
  if (f->bytes > 2 * f->max_bytes) {
    for (int i = 0; i < EMBPS_FEED_PINS_MAX; i++) {
      if (!f->pins[i] || f->pins[i] == UINT64_MAX)
        continue;
      LOG_WARN("replication backlog: past twice --repl-backlog-bytes (%zu) "
               "while a snapshot session keeps the records from LSN %" PRIu64
               ": they are let go (a follower copying it will copy again)",
               f->max_bytes, f->pins[i]);
      f->pins[i] = UINT64_MAX; /* still taken, keeping nothing */
    }
  }
  for (int i = 0; i < EMBPS_FEED_PINS_MAX; i++)
    if (f->pins[i] && f->pins[i] < keep)
      keep = f->pins[i];
  while (f->n && f->bytes > f->max_bytes && f->first < keep) {
    rec_t *r = ring_at(f, 0);
    f->bytes -= r->len;
    f->head = (f->head + 1) % f->cap;
    f->n--;
    f->first++;
    rec_put(r);
  }
}

static void clear_locked(embps_feed_t *f) {
  for (size_t i = 0; i < f->n; i++)
    rec_put(ring_at(f, i));
  f->n = f->head = 0;
  f->bytes = 0;
  f->first = f->next = 0;
}

/* Appends r (taken) at the end of the ring. 0 or -ENOMEM. */
static int push_locked(embps_feed_t *f, rec_t *r) {
  if (f->n == f->cap) {
    size_t cap = f->cap ? 2 * f->cap : 1024;
    rec_t **ring = malloc(cap * sizeof *ring);
    if (!ring)
      return -ENOMEM;
    for (size_t i = 0; i < f->n; i++)
      ring[i] = ring_at(f, i);
    free(f->ring);
    f->ring = ring;
    f->cap = cap;
    f->head = 0;
  }
  if (!f->n)
    f->first = r->lsn;
  f->ring[(f->head + f->n) % f->cap] = r;
  f->n++;
  f->bytes += r->len;
  f->next = r->lsn + 1;
  return 0;
}

void embps_feed_append(embps_feed_t *f, const uint8_t head[EMBPS_WAL_HEADER_BYTES],
                       const struct iovec *parts, int n_parts) {
  size_t len = EMBPS_WAL_HEADER_BYTES;
  for (int i = 0; i < n_parts; i++)
    len += parts[i].iov_len;
  rec_t *r = malloc(sizeof *r + len);
  if (r) {
    atomic_init(&r->refs, 1);
    r->lsn = embps_get64(head + 8);
    r->at_ns = embps_now_ns();
    r->len = len;
    memcpy(r->bytes, head, EMBPS_WAL_HEADER_BYTES);
    size_t off = EMBPS_WAL_HEADER_BYTES;
    for (int i = 0; i < n_parts; i++) {
      if (parts[i].iov_len) /* an empty part may have no base */
        memcpy(r->bytes + off, parts[i].iov_base, parts[i].iov_len);
      off += parts[i].iov_len;
    }
  }
  pthread_mutex_lock(&f->mu);
  if (!atomic_load(&f->active)) { /* deactivated meanwhile */
    pthread_mutex_unlock(&f->mu);
    free(r);
    return;
  }
  if (r && f->next && r->lsn < f->next) { /* before the backlog began */
    pthread_mutex_unlock(&f->mu);
    free(r);
    return;
  }
  if (r && f->next && r->lsn > f->next) { /* a gap: start again from r */
    LOG_WARN("replication backlog: LSN %" PRIu64 " after %" PRIu64
             ": the backlog starts again there", r->lsn, f->next - 1);
    clear_locked(f);
  }
  if (!r || push_locked(f, r)) {
    /* a hole: followers before it need a snapshot */
    LOG_WARN("replication backlog: out of memory for a record: followers "
             "behind it will need a snapshot");
    clear_locked(f);
    free(r);
  } else {
    trim_locked(f);
  }
  if (f->n_held)
    pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

void embps_feed_set_log(embps_feed_t *f, const char *log_dir,
                        embps_wal_t *wal) {
  pthread_mutex_lock(&f->mu);
  snprintf(f->log_dir, sizeof f->log_dir, "%s", log_dir);
  f->wal = wal;
  pthread_mutex_unlock(&f->mu);
}

int embps_feed_active(const embps_feed_t *f) {
  return f && atomic_load_explicit(&f->active, memory_order_relaxed);
}

void embps_feed_promoted(embps_feed_t *f) {
  pthread_mutex_lock(&f->mu);
  /* a new epoch starts strict: nothing of the last one's is recorded */
  f->degraded = f->want = f->recorded = 0;
  f->want_gen++;
  f->short_since = f->strict_from = 0;
  clear_locked(f);
  atomic_store(&f->active, 1);
  f->last_fetch_ns = embps_now_ns();
  pthread_mutex_unlock(&f->mu);
}

/* Activates the feed (from a FETCH or a pin): the backlog starts with
 * the next record appended. mu held. */
static void activate_locked(embps_feed_t *f) {
  f->last_fetch_ns = embps_now_ns();
  if (atomic_load(&f->active))
    return;
  clear_locked(f);
  atomic_store(&f->active, 1);
  LOG_INFO("replication feed active from LSN %" PRIu64 " (backlog up to "
           "%zu bytes)", last_lsn_locked(f) + 1, f->max_bytes);
}

int embps_feed_pin(embps_feed_t *f, uint64_t from, uint32_t *pin) {
  pthread_mutex_lock(&f->mu);
  activate_locked(f);
  int rc = EMBPS_ELIMIT;
  uint64_t last = last_lsn_locked(f);
  if (from <= last && !(f->n && from >= f->first)) {
    rc = EMBPS_ESNAPSHOT;
  } else {
    for (uint32_t i = 0; i < EMBPS_FEED_PINS_MAX; i++) {
      if (!f->pins[i]) {
        f->pins[i] = from ? from : 1;
        *pin = i;
        rc = 0;
        break;
      }
    }
  }
  pthread_mutex_unlock(&f->mu);
  return rc;
}

void embps_feed_unpin(embps_feed_t *f, uint32_t pin) {
  pthread_mutex_lock(&f->mu);
  if (pin < EMBPS_FEED_PINS_MAX)
    f->pins[pin] = 0;
  trim_locked(f);
  pthread_mutex_unlock(&f->mu);
}

int embps_feed_pinned_records(embps_feed_t *f, uint32_t pin, uint64_t after,
                              uint64_t upto,
                              int (*put)(void *ctx, const void *p, size_t n,
                                         char *err, size_t err_len),
                              void *ctx, char *err, size_t err_len) {
  if (upto <= after)
    return 0;
  const size_t n = (size_t)(upto - after);
  rec_t **v = malloc(n * sizeof *v);
  if (!v) {
    snprintf(err, err_len, "out of memory for %zu records", n);
    return -1;
  }
  pthread_mutex_lock(&f->mu);
  const int kept = pin < EMBPS_FEED_PINS_MAX && f->pins[pin] &&
                   f->pins[pin] != UINT64_MAX && f->n &&
                   after + 1 >= f->first && upto < f->first + f->n;
  for (size_t i = 0; kept && i < n; i++) {
    v[i] = ring_at(f, (size_t)(after + 1 + i - f->first));
    atomic_fetch_add(&v[i]->refs, 1);
  }
  pthread_mutex_unlock(&f->mu);
  if (!kept) {
    free(v);
    snprintf(err, err_len, "the replication backlog no longer holds the "
             "records after LSN %" PRIu64 " (past twice --repl-backlog-bytes "
             "while they were copied): take the snapshot again, or give "
             "the server a --data-dir", after);
    return -1;
  }
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    if (!rc)
      rc = put(ctx, v[i]->bytes, v[i]->len, err, err_len);
    rec_put(v[i]);
  }
  free(v);
  return rc;
}

/* ------------------------------------------------------------ history */

int embps_feed_set_history(embps_feed_t *f, const embps_history_t *h) {
  pthread_mutex_lock(&f->mu);
  int rc = embps_history_copy(&f->hist, h);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

int embps_feed_history(embps_feed_t *f, embps_history_t *out) {
  embps_history_init(out);
  if (!f)
    return 0;
  pthread_mutex_lock(&f->mu);
  int rc = embps_history_copy(out, &f->hist);
  pthread_mutex_unlock(&f->mu);
  return rc;
}

uint32_t embps_feed_epoch(embps_feed_t *f) {
  if (!f)
    return 0;
  pthread_mutex_lock(&f->mu);
  uint32_t e = embps_history_epoch(&f->hist);
  pthread_mutex_unlock(&f->mu);
  return e;
}

/* ------------------------------------------------------------ sessions */

static int sess_fetching(const sess_t *s, uint64_t now) {
  return s->used &&
         (s->held_head || now - s->seen_ns < EMBPS_FEED_SEEN_MS * 1000000ull);
}

static int sess_in_sync(const sess_t *s, uint64_t now) {
  return sess_fetching(s, now) &&
         now - s->caught_ns < EMBPS_FEED_INSYNC_MS * 1000000ull;
}

/* The session of follower `name` (id: its process), made if new in a
 * free slot, else in place of the one seen longest ago that no longer
 * fetches. NULL when every slot is taken by a fetching follower. */
static sess_t *sess_get(embps_feed_t *f, const char *name, uint64_t id,
                        uint64_t now) {
  sess_t *spare = NULL, *oldest = NULL;
  for (int i = 0; i < EMBPS_FEED_FOLLOWERS_MAX; i++) {
    sess_t *s = &f->sess[i];
    if (s->used && !strcmp(s->name, name)) {
      if (s->id != id) { /* restarted: what it said before is void */
        s->id = id;
        s->applied = s->durable = 0;
        s->stream = 0;
      }
      return s;
    }
    if (!s->used && !spare)
      spare = s;
    else if (s->used && !sess_fetching(s, now) &&
             (!oldest || s->seen_ns < oldest->seen_ns))
      oldest = s;
  }
  if (!spare && !(spare = oldest))
    return NULL;
  if (spare->used)
    LOG_INFO("follower %s forgotten for %s", spare->name, name);
  memset(spare, 0, sizeof *spare);
  spare->used = 1;
  spare->id = id;
  snprintf(spare->name, sizeof spare->name, "%s", name);
  LOG_INFO("follower %s fetching", name);
  return spare;
}

/* Whether s's stream wants records the backlog no longer holds. mu held. */
static int gone_locked(const embps_feed_t *f, const sess_t *s) {
  return s->cursor <= last_lsn_locked(f) &&
         !(f->n && s->cursor >= f->first && s->cursor < f->first + f->n);
}

/* Fails req: its stream's next record s->cursor is no longer held. */
static void fail_gone(embps_feed_t *f, embps_request_t *req, uint64_t lsn,
                      uint64_t first, uint64_t n) {
  embps_request_fail(f->srv, req, EMBPS_ESNAPSHOT, "records from LSN %"
                     PRIu64 " are no longer held here (the backlog holds "
                     "%" PRIu64 "..%" PRIu64 "; --repl-backlog-bytes %zu): "
                     "%s needs a snapshot", lsn, n ? first : 0,
                     n ? first + n - 1 : 0, f->max_bytes,
                     req->msg.u.fetch.name);
}

/* Lag of s in ms, as seen now: 0 when it applied our last record, else
 * the age of the first record it lacks (when still held). mu held. */
static uint64_t lag_ms_locked(const embps_feed_t *f, const sess_t *s,
                              uint64_t now) {
  uint64_t last = last_lsn_locked(f);
  if (s->applied >= last)
    return 0;
  uint64_t want = s->applied + 1;
  if (f->n && want >= f->first && want < f->first + f->n) {
    uint64_t at = ring_at(f, (size_t)(want - f->first))->at_ns;
    return now > at ? (now - at) / 1000000 : 0;
  }
  return now > s->seen_ns ? (now - s->seen_ns) / 1000000 : 0;
}

/* ------------------------------------------------------------ acks */

/* Recomputes `acked` and `in_sync`. Returns 1 when the gate just opened
 * (kick the apply thread). mu held. */
static int recount_locked(embps_feed_t *f, uint64_t now) {
  uint64_t durable[EMBPS_FEED_FOLLOWERS_MAX];
  uint32_t n = 0, in_sync = 0;
  for (int i = 0; i < EMBPS_FEED_FOLLOWERS_MAX; i++) {
    const sess_t *s = &f->sess[i];
    if (!sess_fetching(s, now))
      continue;
    durable[n++] = s->durable;
    in_sync += sess_in_sync(s, now);
  }
  if (f->sync_n && n >= f->sync_n) { /* the sync_n-th largest */
    for (uint32_t i = 0; i < f->sync_n; i++)
      for (uint32_t j = i + 1; j < n; j++)
        if (durable[j] > durable[i]) {
          uint64_t t = durable[i];
          durable[i] = durable[j];
          durable[j] = t;
        }
    if (durable[f->sync_n - 1] > f->acked)
      f->acked = durable[f->sync_n - 1];
  }
  int opened = f->sync_n && in_sync >= f->sync_n && f->in_sync < f->sync_n;
  f->in_sync = in_sync;
  return opened;
}

/* Unlinks the waiters whose LSN is acknowledged into *done (linked by
 * next). mu held. */
static embps_request_t *take_acked_locked(embps_feed_t *f) {
  embps_request_t *done = NULL, **tail = &done;
  while (f->wait_head && f->wait_head->ack_lsn <= f->acked) {
    embps_request_t *r = f->wait_head;
    f->wait_head = r->next;
    r->next = NULL;
    *tail = r;
    tail = &r->next;
  }
  if (!f->wait_head)
    f->wait_tail = NULL;
  return done;
}

static void complete_list(embps_request_t *r) {
  while (r) {
    embps_request_t *next = r->next;
    r->next = NULL;
    r->complete(r);
    r = next;
  }
}

int embps_feed_syncs(const embps_feed_t *f) {
  return f && f->sync_n &&
         atomic_load(&f->srv->role) == EMBPS_ROLE_PRIMARY;
}

void embps_feed_wait(embps_feed_t *f, embps_request_t *req, uint64_t lsn) {
  req->ack_lsn = lsn;
  req->next = NULL;
  pthread_mutex_lock(&f->mu);
  if (lsn <= f->acked || f->degraded) {
    pthread_mutex_unlock(&f->mu);
    req->complete(req);
    return;
  }
  if (f->draining) {
    pthread_mutex_unlock(&f->mu);
    embps_request_fail(f->srv, req, EMBPS_ESHUTDOWN, "applied at LSN %"
                       PRIu64 " but the server is stopping before %u "
                       "follower(s) acknowledged it", lsn, f->sync_n);
    req->complete(req);
    return;
  }
  req->deadline_ns = embps_now_ns() + f->sync_timeout_ns;
  /* usually the last; inserted in LSN order whatever thread comes first */
  embps_request_t **at = &f->wait_head;
  if (f->wait_tail && f->wait_tail->ack_lsn <= lsn)
    at = &f->wait_tail->next;
  else
    while (*at && (*at)->ack_lsn <= lsn)
      at = &(*at)->next;
  req->next = *at;
  *at = req;
  if (!req->next)
    f->wait_tail = req;
  pthread_cond_signal(&f->cv); /* its deadline */
  pthread_mutex_unlock(&f->mu);
}

/* Fails the waiters past their deadline (or all, draining) into *out.
 * mu held. */
static embps_request_t *take_expired_locked(embps_feed_t *f, uint64_t now,
                                            int all) {
  embps_request_t *out = NULL, **tail = &out, **at = &f->wait_head;
  f->wait_tail = NULL;
  while (*at) {
    embps_request_t *r = *at;
    if (all || now >= r->deadline_ns) {
      *at = r->next;
      r->next = NULL;
      *tail = r;
      tail = &r->next;
    } else {
      f->wait_tail = r;
      at = &r->next;
    }
  }
  return out;
}

/* ------------------------------------------------------------ degrading */

/* What one look at --sync-degrade-ms decided, done outside mu. */
typedef struct {
  int call;                 /* ask the recorder for `degraded` at lsn, gen */
  int degraded;
  uint64_t lsn, gen;
  embps_request_t *acked;   /* waiters a degradation acknowledges */
  int kick;                 /* parked writes may go */
} degrade_t;

/* feed.h "Degrading", one step. mu held. */
static void degrade_locked(embps_feed_t *f, uint64_t now, degrade_t *d) {
  memset(d, 0, sizeof *d);
  if (!f->degrade_ns || !f->sync_n || f->draining || f->stopping ||
      atomic_load(&f->srv->role) != EMBPS_ROLE_PRIMARY)
    return;
  const int enough = f->in_sync >= f->sync_n;
  const uint64_t last = last_lsn_locked(f);
  if (f->degraded) {
    if (!enough)
      return;
    /* acknowledgements wait for the followers again, from the next
       record on; the strict state is recorded once they hold all */
    f->degraded = 0;
    f->strict_from = last;
    f->short_since = 0;
    LOG_INFO("replication: %u follower(s) in sync again: writes after LSN %"
             PRIu64 " are acknowledged once they hold them (no longer "
             "degraded)", f->in_sync, last);
    return;
  }
  if (enough) {
    f->short_since = 0;
    if (f->want && f->acked >= f->strict_from) {
      f->want = f->recorded = 0;
      f->want_gen++;
      d->call = f->record != NULL;
      d->lsn = f->acked;
      d->gen = f->want_gen;
    }
    return;
  }
  if (!f->short_since)
    f->short_since = now;
  if (now - f->short_since < f->degrade_ns)
    return;
  if (!f->want) {
    f->want = 1;
    f->want_gen++;
    f->recorded = !f->must_record; /* without a coordinator: on its own */
    d->call = f->record != NULL;
    d->degraded = 1;
    d->lsn = last;
    d->gen = f->want_gen;
    if (f->must_record)
      LOG_WARN("replication: %u of %u follower(s) in sync for %" PRIu64
               " ms (--sync-degrade-ms): recording in the coordinator that "
               "this epoch is degraded before acknowledging without them",
               f->in_sync, f->sync_n, f->degrade_ns / 1000000);
  }
  if (!f->recorded)
    return;
  f->degraded = 1;
  f->degradations++;
  LOG_WARN("replication: %u of %u follower(s) in sync for %" PRIu64 " ms "
           "(--sync-degrade-ms): degraded, acknowledging writes without "
           "them from LSN %" PRIu64 " until they are back in sync%s",
           f->in_sync, f->sync_n, (now - f->short_since) / 1000000, last,
           f->must_record ? " (no follower can be elected meanwhile)"
                     : " (a follower promoted meanwhile may lack them)");
  d->acked = f->wait_head; /* every waiter is acknowledged now */
  f->wait_head = f->wait_tail = NULL;
  d->kick = 1;
}

/* Does what degrade_locked decided (mu not held; the recorder was asked
 * under it, so that embps_feed_set_recorder(f, NULL, NULL) returns only
 * once no call to the old one is under way). */
static void degrade_act(embps_feed_t *f, degrade_t *d) {
  if (d->kick)
    embps_apply_kick(f->srv->apply);
  complete_list(d->acked);
}

void embps_feed_set_recorder(embps_feed_t *f, embps_feed_record_fn fn,
                             void *ctx) {
  pthread_mutex_lock(&f->mu);
  f->record = fn;
  f->record_ctx = ctx;
  pthread_mutex_unlock(&f->mu);
}

void embps_feed_recorded(embps_feed_t *f, uint64_t gen) {
  pthread_mutex_lock(&f->mu);
  if (gen == f->want_gen && f->want) {
    f->recorded = 1;
    pthread_cond_signal(&f->cv); /* degrade at once */
  }
  pthread_mutex_unlock(&f->mu);
}

int embps_feed_degrade_figures(struct embps_server *srv, int *degraded,
                               uint64_t *degradations) {
  embps_feed_t *f = srv->feed;
  *degraded = 0;
  *degradations = 0;
  if (!f || !f->degrade_ns)
    return 0;
  pthread_mutex_lock(&f->mu);
  *degraded = f->degraded;
  *degradations = f->degradations;
  pthread_mutex_unlock(&f->mu);
  return 1;
}

/* ------------------------------------------------------------ gate */

int embps_feed_gate(embps_feed_t *f, embps_apply_ctx_t *ctx,
                    embps_request_t *req) {
  if (!f || !f->sync_n)
    return 1;
  pthread_mutex_lock(&f->mu);
  uint64_t now = embps_now_ns();
  recount_locked(f, now);
  const uint32_t in_sync = f->in_sync;
  const int draining = f->draining, degraded = f->degraded;
  pthread_mutex_unlock(&f->mu);
  const int open = (in_sync >= f->sync_n || degraded) && !draining;
  if (open && !embps_apply_has_parked(ctx)) {
    req->deadline_ns = 0;
    return 1;
  }
  if (open) /* those parked before it go first: now */
    embps_apply_kick(f->srv->apply);
  if (!req->deadline_ns)
    req->deadline_ns = now + f->sync_timeout_ns;
  if (draining || embps_apply_draining(ctx)) {
    embps_request_fail(f->srv, req, EMBPS_ESHUTDOWN, "server stopping; "
                       "refused, nothing changed");
  } else if (now >= req->deadline_ns) {
    LOG_WARN("replication: a write refused after --sync-timeout-ms %" PRIu64
             ": %u follower(s) in sync, %u needed",
             f->sync_timeout_ns / 1000000, in_sync, f->sync_n);
    embps_request_fail(f->srv, req, EMBPS_ENOREPLICAS, "refused, nothing "
                       "changed: --sync-followers %u needs %u follower(s) "
                       "in sync, %u were for %" PRIu64 " ms",
                       f->sync_n, f->sync_n, in_sync,
                       f->sync_timeout_ns / 1000000);
  } else {
    embps_apply_park(ctx, req, req->deadline_ns);
    return 0;
  }
  req->deadline_ns = 0;
  req->complete(req);
  return 0;
}

/* ------------------------------------------------------------ replies */

typedef struct {
  rec_t **v;
  size_t n, cap;
  uint64_t first;
} batch_t;

/* Takes into b the records of s's stream from its cursor, up to
 * max_bytes (at least one), and advances the cursor. mu held. */
static int batch_take_locked(embps_feed_t *f, sess_t *s, uint64_t max_bytes,
                             batch_t *b, uint64_t now) {
  b->n = 0;
  b->first = s->cursor;
  size_t bytes = 0;
  while (f->n && s->cursor >= f->first && s->cursor < f->first + f->n) {
    rec_t *r = ring_at(f, (size_t)(s->cursor - f->first));
    if (b->n && bytes + r->len > max_bytes)
      break;
    if (b->n == b->cap) {
      size_t cap = b->cap ? 2 * b->cap : 64;
      rec_t **v = realloc(b->v, cap * sizeof *v);
      if (!v)
        break;
      b->v = v;
      b->cap = cap;
    }
    atomic_fetch_add(&r->refs, 1);
    b->v[b->n++] = r;
    bytes += r->len;
    s->cursor++;
  }
  if (s->cursor >= last_lsn_locked(f) + 1)
    s->caught_ns = now;
  s->bytes += bytes;
  return b->n || max_bytes == 0 ? 0 : -1;
}

/* What a reply says besides its records, taken under mu. */
typedef struct {
  uint64_t last_lsn, lag_ms;
  uint32_t epoch;
  embps_history_t hist;
} info_t;

static void info_take_locked(embps_feed_t *f, const sess_t *s, info_t *i,
                             uint64_t now) {
  i->last_lsn = last_lsn_locked(f);
  i->lag_ms = s ? lag_ms_locked(f, s, now) : 0;
  i->epoch = embps_history_epoch(&f->hist);
  embps_history_init(&i->hist);
  if (embps_history_copy(&i->hist, &f->hist))
    i->hist.n = 0; /* out of memory: a reply without it is refused below */
}

/* Sets req's reply for n records of `bytes` bytes from LSN first: the
 * bulk, to fill, or NULL (req failed). Releases i. */
static uint8_t *reply_start(embps_feed_t *f, embps_request_t *req,
                            uint64_t first, uint32_t n, size_t bytes,
                            info_t *i) {
  embps_server_t *srv = f->srv;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  embps_fetch_reply_t *r = &m.u.fetch_reply;
  r->first_lsn = first;
  r->n_records = n;
  r->last_lsn = i->last_lsn;
  r->epoch = i->epoch;
  r->lag_ms = i->lag_ms;
  r->history = i->hist.v;
  r->n_history = i->hist.n;
  r->shards = srv->cfg.shards;
  r->cluster_size = srv->cfg.cluster_size;
  r->cluster_index = srv->cfg.cluster_index;
  uint8_t *out = !i->hist.n && i->epoch
                     ? NULL
                     : embps_request_reply(srv, req, EMBPS_KIND_FETCH, &m,
                                           bytes);
  if (!out && !req->reply)
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory for a fetch "
                       "reply");
  if (out)
    atomic_fetch_add(&f->shipped, bytes);
  embps_history_close(&i->hist);
  return out;
}

/* Sets req's reply: the records of b (released), from b->first. */
static void reply_batch(embps_feed_t *f, embps_request_t *req, batch_t *b,
                        info_t *i) {
  size_t bytes = 0;
  for (size_t k = 0; k < b->n; k++)
    bytes += b->v[k]->len;
  uint8_t *out = reply_start(f, req, b->first, (uint32_t)b->n, bytes, i);
  for (size_t k = 0; k < b->n; k++) {
    if (out) {
      memcpy(out, b->v[k]->bytes, b->v[k]->len);
      out += b->v[k]->len;
    }
    rec_put(b->v[k]);
  }
  b->n = 0;
}

/* ------------------------------------------------------------ fetch */

/* The checks of a stream's first FETCH: its follower's log (up to
 * from_lsn - 1, its history) must be a prefix of ours, and from_lsn
 * still held. 0, or an error code with req failed. mu held. */
static int check_start_locked(embps_feed_t *f, embps_request_t *req) {
  const embps_fetch_t *q = &req->msg.u.fetch;
  embps_history_t theirs = {.v = q->history, .n = q->n_history,
                            .cap = q->n_history};
  const uint64_t have = q->from_lsn - 1, last = last_lsn_locked(f);
  uint64_t common = embps_history_common(&theirs, have, &f->hist, last);
  if (common < have) {
    embps_request_fail_at(f->srv, req, EMBPS_EDIVERGED, common, "the log of "
                          "%s diverges from this primary's after LSN %"
                          PRIu64 ": it holds up to LSN %" PRIu64 " (epoch "
                          "%u), this primary has epoch %u from LSN %" PRIu64
                          " and its last LSN is %" PRIu64, q->name, common,
                          have,
                       embps_history_epoch_at(&theirs, have),
                       embps_history_epoch_at(&f->hist, common + 1),
                       common + 1, last);
    return EMBPS_EDIVERGED;
  }
  if (!f->wal && q->from_lsn <= last &&
      !(f->n && q->from_lsn >= f->first && q->from_lsn < f->first + f->n)) {
    fail_gone(f, req, q->from_lsn, f->first, f->n);
    return EMBPS_ESNAPSHOT; /* with a data dir, its log may hold them */
  }
  return 0;
}

/* Answers req, whose stream s wants records the backlog no longer holds,
 * from this server's log (--data-dir): the records from its cursor up to
 * the backlog's first (or our last), up to the FETCH's max_bytes; or
 * EMBPS_ESNAPSHOT when the log no longer holds them either (a checkpoint
 * deleted their segment). mu held on entry, released. */
static void from_log_unlock(embps_feed_t *f, sess_t *s, embps_request_t *req,
                            uint64_t now) {
  const uint64_t from = s->cursor, stream = s->stream;
  const uint64_t bfirst = f->first, bn = f->n;
  uint64_t upto = bn && bfirst > from ? bfirst - 1 : last_lsn_locked(f);
  const uint64_t max = req->msg.u.fetch.max_bytes < MAX_BYTES_MIN
                           ? MAX_BYTES_MIN
                           : req->msg.u.fetch.max_bytes;
  embps_wal_cursor_t hint = s->log_hint;
  pthread_mutex_unlock(&f->mu);
  const uint64_t written = embps_wal_written(f->wal);
  if (upto > written)
    upto = written;
  uint8_t *buf;
  size_t len;
  uint32_t n;
  char err[1200];
  int rc = embps_wal_read(f->log_dir, from, upto, max, &hint,
                          &buf, &len, &n, err, sizeof err);
  pthread_mutex_lock(&f->mu);
  const int current = s->used && s->stream == stream && s->cursor == from;
  if (!rc && current) {
    s->cursor += n;
    s->bytes += len;
    s->log_hint = hint;
    if (s->cursor >= last_lsn_locked(f) + 1)
      s->caught_ns = now;
  }
  info_t i;
  info_take_locked(f, s, &i, now);
  pthread_mutex_unlock(&f->mu);
  if (rc == 1) {
    fail_gone(f, req, from, bfirst, bn);
  } else if (rc) {
    LOG_WARN("replication: records for %s from LSN %" PRIu64 " not read "
             "from the log: %s", req->msg.u.fetch.name, from, err);
    embps_request_fail(f->srv, req, EMBPS_EIO, "records from LSN %" PRIu64
                       " could not be read from the log: %s", from, err);
  } else if (!current) {
    embps_request_fail(f->srv, req, EMBPS_EINVAL, "fetch of stream %016"
                       PRIx64 ", which is not this follower's current one",
                       stream);
  } else {
    uint8_t *out = reply_start(f, req, from, n, len, &i);
    if (out)
      memcpy(out, buf, len);
  }
  if (rc || !current)
    embps_history_close(&i.hist);
  free(buf);
}

/* Answers every FETCH held for s with an empty reply (a stream replaced,
 * shutdown). They complete on the calling thread. mu held, released and
 * taken again. */
static void flush_held_locked(embps_feed_t *f, sess_t *s) {
  while (s->held_head) {
    embps_request_t *req = s->held_head;
    s->held_head = req->next;
    if (!s->held_head)
      s->held_tail = NULL;
    req->next = NULL;
    f->n_held--;
    batch_t b = {0};
    b.first = s->cursor;
    info_t i;
    info_take_locked(f, s, &i, embps_now_ns());
    pthread_mutex_unlock(&f->mu);
    reply_batch(f, req, &b, &i);
    req->complete(req);
    pthread_mutex_lock(&f->mu);
  }
}

int embps_feed_fetch(embps_feed_t *f, embps_request_t *req) {
  const embps_fetch_t *q = &req->msg.u.fetch;
  const uint64_t now = embps_now_ns();
  char name[EMBPS_ADDR_MAX];
  snprintf(name, sizeof name, "%s", q->name[0] ? q->name : "?");
  if (!q->name[0])
    snprintf(name, sizeof name, "follower %016" PRIx64, q->follower_id);
  pthread_mutex_lock(&f->mu);
  if (f->draining) {
    pthread_mutex_unlock(&f->mu);
    embps_request_fail(f->srv, req, EMBPS_ESHUTDOWN, "server stopping");
    return 0;
  }
  if (!q->max_bytes) { /* a probe (a follower before its restore) */
    if (!q->from_lsn || !check_start_locked(f, req)) {
      batch_t b = {0};
      b.first = q->from_lsn;
      info_t i;
      info_take_locked(f, NULL, &i, now);
      pthread_mutex_unlock(&f->mu);
      reply_batch(f, req, &b, &i);
      return 0;
    }
    pthread_mutex_unlock(&f->mu);
    return 0;
  }
  activate_locked(f);
  sess_t *s = sess_get(f, name, q->follower_id, now);
  if (!s) {
    pthread_mutex_unlock(&f->mu);
    embps_request_fail(f->srv, req, EMBPS_ELIMIT, "%d followers fetch "
                       "already", EMBPS_FEED_FOLLOWERS_MAX);
    return 0;
  }
  s->seen_ns = now;
  if (q->durable_lsn > s->durable)
    s->durable = q->durable_lsn;
  s->applied = q->applied_lsn;
  if (q->from_lsn) { /* a stream begins */
    int rc = check_start_locked(f, req);
    if (rc) {
      pthread_mutex_unlock(&f->mu);
      return 0;
    }
    if (s->stream != q->stream)
      flush_held_locked(f, s); /* an older connection's */
    s->stream = q->stream;
    s->cursor = q->from_lsn;
  } else if (q->stream != s->stream) {
    pthread_mutex_unlock(&f->mu);
    embps_request_fail(f->srv, req, EMBPS_EINVAL, "fetch of stream %016"
                       PRIx64 ", which is not this follower's current one",
                       q->stream);
    return 0;
  }
  if (!s->held_head && gone_locked(f, s)) {
    if (f->wal) {
      from_log_unlock(f, s, req, now);
      return 0;
    }
    fail_gone(f, req, s->cursor, f->first, f->n);
    pthread_mutex_unlock(&f->mu);
    return 0;
  }
  int opened = recount_locked(f, now);
  embps_request_t *acked = take_acked_locked(f);
  int held = 0;
  batch_t b = {0};
  info_t i;
  if (s->held_head || batch_take_locked(f, s,
                                        q->max_bytes < MAX_BYTES_MIN
                                            ? MAX_BYTES_MIN
                                            : q->max_bytes,
                                        &b, now)) {
    uint32_t wait = q->wait_ms < WAIT_MS_MAX ? q->wait_ms : WAIT_MS_MAX;
    req->deadline_ns = now + (uint64_t)wait * 1000000u;
    req->next = NULL;
    if (s->held_tail)
      s->held_tail->next = req;
    else
      s->held_head = req;
    s->held_tail = req;
    f->n_held++;
    s->caught_ns = now; /* it waits for our next record */
    held = 1;
    pthread_cond_signal(&f->cv);
  } else {
    info_take_locked(f, s, &i, now);
  }
  pthread_mutex_unlock(&f->mu);
  if (!held)
    reply_batch(f, req, &b, &i);
  free(b.v);
  if (opened)
    embps_apply_kick(f->srv->apply);
  complete_list(acked);
  return held;
}

/* ------------------------------------------------------------ the thread */

/* Serves one held FETCH that can be answered now (records came, its
 * deadline passed, or shutdown); returns 0 when none can. mu held,
 * released while the reply is built. */
static int serve_one_locked(embps_feed_t *f, uint64_t now, uint64_t *wake) {
  for (int k = 0; k < EMBPS_FEED_FOLLOWERS_MAX; k++) {
    sess_t *s = &f->sess[k];
    embps_request_t *req = s->held_head;
    if (!req)
      continue;
    batch_t b = {0};
    uint64_t max = req->msg.u.fetch.max_bytes;
    const int gone = gone_locked(f, s);
    int has = !gone && batch_take_locked(f, s, max < MAX_BYTES_MIN
                                                   ? MAX_BYTES_MIN
                                                   : max,
                                         &b, now) == 0;
    if (!has && !gone && now < req->deadline_ns && !f->draining &&
        !f->stopping) {
      if (req->deadline_ns < *wake)
        *wake = req->deadline_ns;
      free(b.v);
      continue;
    }
    s->held_head = req->next;
    if (!s->held_head)
      s->held_tail = NULL;
    req->next = NULL;
    f->n_held--;
    info_t i;
    const uint64_t cursor = s->cursor, first = f->first, n = f->n;
    info_take_locked(f, s, &i, now);
    pthread_mutex_unlock(&f->mu);
    if (gone) {
      fail_gone(f, req, cursor, first, n);
      embps_history_close(&i.hist);
    } else {
      reply_batch(f, req, &b, &i);
    }
    free(b.v);
    req->complete(req);
    pthread_mutex_lock(&f->mu);
    return 1;
  }
  return 0;
}

static void *feed_main(void *arg) {
  embps_feed_t *f = arg;
  pthread_mutex_lock(&f->mu);
  for (;;) {
    uint64_t now = embps_now_ns();
    uint64_t wake = now + TICK_MS * 1000000ull;
    while (serve_one_locked(f, now, &wake))
      now = embps_now_ns();
    int opened = recount_locked(f, now);
    degrade_t dg;
    degrade_locked(f, now, &dg);
    if (dg.call)
      f->record(f->record_ctx, dg.degraded, dg.lsn, dg.gen);
    embps_request_t *acked = take_acked_locked(f);
    embps_request_t *late =
        take_expired_locked(f, now, f->draining || f->stopping);
    for (embps_request_t *r = f->wait_head; r; r = r->next)
      if (r->deadline_ns < wake)
        wake = r->deadline_ns;
    if (!f->sync_n && atomic_load(&f->active) && !f->n_held &&
        now - f->last_fetch_ns > EMBPS_FEED_IDLE_S * 1000000000ull) {
      int pinned = 0;
      for (int i = 0; i < EMBPS_FEED_PINS_MAX; i++)
        pinned |= f->pins[i] != 0;
      if (!pinned) {
        atomic_store(&f->active, 0);
        clear_locked(f);
        LOG_INFO("replication feed idle for %d s: backlog freed",
                 EMBPS_FEED_IDLE_S);
      }
    }
    const uint32_t in_sync = f->in_sync, need = f->sync_n;
    const uint64_t acked_lsn = f->acked;
    const int stopping = f->stopping, draining = f->draining;
    pthread_mutex_unlock(&f->mu);
    if (opened)
      embps_apply_kick(f->srv->apply);
    degrade_act(f, &dg);
    complete_list(acked);
    if (late && !draining && !stopping)
      LOG_WARN("replication: a write at LSN %" PRIu64 " waited %" PRIu64
               " ms (--sync-timeout-ms) for %u follower(s) and was not "
               "acknowledged (%u in sync, acknowledged up to LSN %" PRIu64
               ")", late->ack_lsn, f->sync_timeout_ns / 1000000, need,
               in_sync, acked_lsn);
    while (late) {
      embps_request_t *r = late;
      late = r->next;
      r->next = NULL;
      if (draining || stopping)
        embps_request_fail(f->srv, r, EMBPS_ESHUTDOWN, "applied at LSN %"
                           PRIu64 " but the server is stopping before %u "
                           "follower(s) acknowledged it", r->ack_lsn, need);
      else
        /* the error's LSN says it was applied (the gate's refusal: 0) */
        embps_request_fail_at(f->srv, r, EMBPS_ENOREPLICAS, r->ack_lsn,
                              "applied here at LSN %" PRIu64 " but not "
                              "acknowledged by %u follower(s) within "
                              "--sync-timeout-ms %" PRIu64 " (%u in sync): "
                              "it is lost if this server is; retry it (the "
                              "same client id and seq are acknowledged as a "
                              "duplicate once followers have it)",
                              r->ack_lsn, need, f->sync_timeout_ns / 1000000,
                              in_sync);
      r->complete(r);
    }
    pthread_mutex_lock(&f->mu);
    if (f->stopping && !f->n_held && !f->wait_head)
      break;
    now = embps_now_ns();
    if (wake > now && !f->stopping) {
      struct timespec ts = {(time_t)(wake / 1000000000u),
                            (long)(wake % 1000000000u)};
      pthread_cond_timedwait(&f->cv, &f->mu, &ts);
    }
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

/* ------------------------------------------------------------ lifecycle */

int embps_feed_create(embps_server_t *srv, embps_feed_t **out) {
  embps_feed_t *f = calloc(1, sizeof *f);
  if (!f)
    return -ENOMEM;
  f->srv = srv;
  f->max_bytes = srv->cfg.repl_backlog_bytes;
  f->sync_n = srv->cfg.sync_followers;
  f->sync_timeout_ns = (uint64_t)srv->cfg.sync_timeout_ms * 1000000ull;
  f->retain_ns = (uint64_t)srv->cfg.repl_retain_ms * 1000000ull;
  f->degrade_ns = (uint64_t)srv->cfg.sync_degrade_ms * 1000000ull;
  f->must_record = srv->cfg.coordinator[0] != 0;
  embps_history_init(&f->hist);
  pthread_mutex_init(&f->mu, NULL);
  pthread_condattr_t attr;
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&f->cv, &attr);
  pthread_condattr_destroy(&attr);
  if (f->sync_n && !srv->cfg.follow[0] && !srv->cfg.coordinator[0])
    /* a primary from the start: acks need every record */
    atomic_store(&f->active, 1);
  f->last_fetch_ns = embps_now_ns();
  int rc = pthread_create(&f->thread, NULL, feed_main, f);
  if (rc) {
    pthread_mutex_destroy(&f->mu);
    pthread_cond_destroy(&f->cv);
    free(f);
    return -rc;
  }
  f->started = 1;
  *out = f;
  return 0;
}

void embps_feed_drain(embps_feed_t *f) {
  if (!f)
    return;
  pthread_mutex_lock(&f->mu);
  f->draining = 1;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
}

void embps_feed_destroy(embps_feed_t *f) {
  if (!f)
    return;
  pthread_mutex_lock(&f->mu);
  f->stopping = 1;
  pthread_cond_signal(&f->cv);
  pthread_mutex_unlock(&f->mu);
  if (f->started)
    pthread_join(f->thread, NULL);
  clear_locked(f);
  free(f->ring);
  embps_history_close(&f->hist);
  pthread_mutex_destroy(&f->mu);
  pthread_cond_destroy(&f->cv);
  free(f);
}

uint64_t embps_feed_retain(embps_feed_t *f) {
  uint64_t keep = UINT64_MAX;
  if (!f)
    return keep;
  const uint64_t now = embps_now_ns();
  pthread_mutex_lock(&f->mu);
  for (int k = 0; k < EMBPS_FEED_FOLLOWERS_MAX; k++) {
    const sess_t *s = &f->sess[k];
    if (s->used && now - s->seen_ns < f->retain_ns &&
        s->applied < keep)
      keep = s->applied;
  }
  pthread_mutex_unlock(&f->mu);
  return keep;
}

/* ------------------------------------------------------------ figures */

void embps_feed_stats(embps_feed_t *f, embps_server_stats_t *s) {
  if (!f)
    return;
  pthread_mutex_lock(&f->mu);
  uint64_t now = embps_now_ns(), last = last_lsn_locked(f);
  for (int i = 0; i < EMBPS_FEED_FOLLOWERS_MAX; i++) {
    const sess_t *x = &f->sess[i];
    if (!sess_fetching(x, now))
      continue;
    s->followers++;
    s->followers_in_sync += sess_in_sync(x, now);
    uint64_t rec = last > x->applied ? last - x->applied : 0;
    uint64_t ms = lag_ms_locked(f, x, now);
    if (rec > s->lag_records)
      s->lag_records = rec;
    if (ms > s->lag_ms)
      s->lag_ms = ms;
  }
  s->sync_degraded = (uint32_t)f->degraded;
  pthread_mutex_unlock(&f->mu);
  s->bytes_shipped += atomic_load(&f->shipped);
}

size_t embps_feed_followers(embps_feed_t *f, embps_follower_info_t *v,
                            size_t cap) {
  size_t n = 0;
  if (!f)
    return 0;
  pthread_mutex_lock(&f->mu);
  uint64_t now = embps_now_ns(), last = last_lsn_locked(f);
  for (int i = 0; i < EMBPS_FEED_FOLLOWERS_MAX && n < cap; i++) {
    const sess_t *x = &f->sess[i];
    if (!sess_fetching(x, now))
      continue;
    embps_follower_info_t *o = &v[n++];
    snprintf(o->name, sizeof o->name, "%s", x->name);
    o->applied_lsn = x->applied;
    o->durable_lsn = x->durable;
    o->lag_records = last > x->applied ? last - x->applied : 0;
    o->lag_ms = lag_ms_locked(f, x, now);
    o->bytes_shipped = x->bytes;
    o->in_sync = sess_in_sync(x, now);
  }
  pthread_mutex_unlock(&f->mu);
  return n;
}
