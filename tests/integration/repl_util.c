/* repl_util.c - see repl_util.h. */
#define _GNU_SOURCE
#include "repl_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "frame.h"
#include "harness.h"
#include "internal.h" /* embps_client_create_peer_ */
#include "wire.h"

/* A client of the one server at addr whatever its place in its cluster
 * (a peer's: a member of a cluster of several answers it too), no
 * retries. */
static embps_client_t *client_of(const char *addr) {
  embps_client_t *c = NULL;
  char err[512];
  if (embps_client_create_peer_(addr, "", 0, 20000, &c, err, sizeof err))
    fprintf(stderr, "repl: cannot connect to %s: %s\n", addr, err);
  return c;
}

int repl_stats(const char *addr, embps_server_stats_t *out) {
  embps_client_t *c = client_of(addr);
  if (!c)
    return EMBPS_ECONN;
  embps_server_stats_t *s;
  size_t n;
  int rc = embps_stats(c, &s, &n);
  if (!rc) {
    *out = s[0];
    out->tables = NULL;
    out->n_tables = 0;
    out->members = NULL; /* freed below: not the caller's */
    out->n_members = 0;
    embps_stats_free(s, n);
  }
  embps_client_destroy(c);
  return rc;
}

int repl_wait_caught_up(const char *p, const char *f, int timeout_ms) {
  double until = it_now_ms() + timeout_ms;
  embps_server_stats_t a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  for (;;) {
    int ra = repl_stats(p, &a), rb = repl_stats(f, &b);
    if (!ra && !rb && a.applied_lsn == b.applied_lsn) {
      embps_server_stats_t again; /* the primary is not moving */
      if (!repl_stats(p, &again) && again.applied_lsn == a.applied_lsn)
        return 0;
    }
    if (it_now_ms() > until) {
      fprintf(stderr, "repl: %s at LSN %llu, its follower %s at LSN %llu "
              "after %d ms\n", p, (unsigned long long)a.applied_lsn, f,
              (unsigned long long)b.applied_lsn, timeout_ms);
      return -1;
    }
    it_sleep_ms(20);
  }
}

int repl_wait_in_sync(const char *p, unsigned n, int timeout_ms) {
  double until = it_now_ms() + timeout_ms;
  for (;;) {
    embps_server_stats_t s;
    if (!repl_stats(p, &s) && s.followers_in_sync >= n)
      return 0;
    if (it_now_ms() > until) {
      fprintf(stderr, "repl: %s has fewer than %u followers in sync after "
              "%d ms\n", p, n, timeout_ms);
      return -1;
    }
    it_sleep_ms(20);
  }
}

/* ------------------------------------------------------------ compare */

typedef struct {
  int64_t id;
  float *vals; /* dim x (1 + slots) */
} row_t;

static int by_id(const void *a, const void *b) {
  int64_t x = ((const row_t *)a)->id, y = ((const row_t *)b)->id;
  return (x > y) - (x < y);
}

/* Every row of table on c (server 0), sorted; *out malloc'd, rows and
 * their floats in one block each. */
static int scan_all(embps_client_t *c, const char *table, row_t **out,
                    size_t *n, float **block, size_t *per_row) {
  size_t cap = 0, floats = 0;
  *out = NULL;
  *block = NULL;
  *n = 0;
  uint64_t cursor = 0;
  for (;;) {
    embps_scan_chunk_t ch;
    int rc = embps_scan(c, 0, table, cursor, 0, EMBPS_SCAN_STATE, &ch);
    if (rc) {
      fprintf(stderr, "repl: scan of %s: %s\n", table,
              embps_client_last_error(c));
      return rc;
    }
    *per_row = (size_t)ch.dim * (1 + ch.state_slots);
    if (*n + ch.n > cap) {
      cap = (*n + ch.n) * 2 + 16;
      *out = realloc(*out, cap * sizeof **out);
      *block = realloc(*block, cap * *per_row * sizeof **block);
    }
    for (size_t i = 0; i < ch.n; i++) {
      float *dst = *block + (*n + i) * *per_row;
      memcpy(dst, ch.weights + i * ch.dim, ch.dim * sizeof *dst);
      if (ch.state_slots)
        memcpy(dst + ch.dim, ch.state + i * ch.state_slots * ch.dim,
               ch.state_slots * ch.dim * sizeof *dst);
      (*out)[*n + i].id = ch.ids[i];
    }
    *n += ch.n;
    floats = *per_row;
    int done = ch.done;
    cursor = ch.next_cursor;
    embps_scan_chunk_free(&ch);
    if (done)
      break;
  }
  for (size_t i = 0; i < *n; i++)
    (*out)[i].vals = *block + i * floats;
  if (*n) /* an empty table: *out may be NULL */
    qsort(*out, *n, sizeof **out, by_id);
  return 0;
}

static int compare_info(const embps_table_info_t *x,
                        const embps_table_info_t *y, const char *what,
                        int same_memory) {
  int diffs = 0;
  /* pulls, pushes (since the process started) and the longest eviction
   * stall are each server's own activity, not the table's state */
#define CMP_(type, f, merge, doc)                                              \
  if (strcmp(#f, "pulls") && strcmp(#f, "pushes") &&                         \
      strcmp(#f, "evict_stall_max_us") &&                                      \
      (same_memory || strcmp(#f, "bytes_used")) && x->f != y->f) {            \
    fprintf(stderr, "%s: table %s: %s %llu vs %llu\n", what, x->spec.name,    \
            #f, (unsigned long long)x->f, (unsigned long long)y->f);          \
    diffs++;                                                                   \
  }
  EMBPS_TABLE_INFO_FIELDS(CMP_)
#undef CMP_
  if (memcmp(&x->spec, &y->spec, sizeof x->spec)) {
    fprintf(stderr, "%s: table %s: specs differ\n", what, x->spec.name);
    diffs++;
  }
  return diffs;
}

int repl_compare(const char *a, const char *b, const char *what,
                 int same_memory) {
  embps_client_t *ca = client_of(a), *cb = client_of(b);
  int diffs = 0;
  embps_table_info_t *ta = NULL, *tb = NULL;
  size_t na = 0, nb = 0;
  if (!ca || !cb || embps_list_tables(ca, &ta, &na) ||
      embps_list_tables(cb, &tb, &nb)) {
    fprintf(stderr, "%s: cannot list the tables\n", what);
    diffs = 1;
    goto out;
  }
  if (na != nb) {
    fprintf(stderr, "%s: %zu tables vs %zu\n", what, na, nb);
    diffs++;
  }
  for (size_t i = 0; i < na; i++) {
    const embps_table_info_t *y = NULL;
    for (size_t j = 0; j < nb; j++)
      if (!strcmp(ta[i].spec.name, tb[j].spec.name))
        y = &tb[j];
    if (!y) {
      fprintf(stderr, "%s: table %s missing\n", what, ta[i].spec.name);
      diffs++;
      continue;
    }
    diffs += compare_info(&ta[i], y, what, same_memory);
    row_t *ra, *rb;
    float *ba, *bb;
    size_t ma, mb, pa = 0, pb = 0;
    if (scan_all(ca, ta[i].spec.name, &ra, &ma, &ba, &pa) ||
        scan_all(cb, ta[i].spec.name, &rb, &mb, &bb, &pb)) {
      diffs++;
      continue;
    }
    int shown = 0;
    if (ma != mb || pa != pb) {
      fprintf(stderr, "%s: table %s: %zu rows vs %zu\n", what,
              ta[i].spec.name, ma, mb);
      diffs++;
    }
    for (size_t r = 0; r < ma && r < mb; r++) {
      if (ra[r].id == rb[r].id &&
          !memcmp(ra[r].vals, rb[r].vals, pa * sizeof(float)))
        continue;
      diffs++;
      if (shown++ < 5)
        fprintf(stderr, "%s: table %s: row %lld vs %lld differ (first "
                "value %.9g vs %.9g)\n", what, ta[i].spec.name,
                (long long)ra[r].id, (long long)rb[r].id,
                (double)ra[r].vals[0], (double)rb[r].vals[0]);
    }
    free(ra);
    free(rb);
    free(ba);
    free(bb);
  }
out:
  embps_tables_free(ta, NULL);
  embps_tables_free(tb, NULL);
  embps_client_destroy(ca);
  embps_client_destroy(cb);
  return diffs;
}

/* ------------------------------------------------------------ raw pull */

/* Sends frame m (+ bulk) on fd and reads the reply into *body (malloc'd),
 * its header in *h. 0 or -1. */
static int call(int fd, const embps_msg_t *m, const void *bulk,
                size_t bulk_len, embps_frame_header_t *h, uint8_t **body) {
  uint8_t *frame;
  size_t len, off;
  if (embps_frame_build(m, 1, bulk_len, &frame, &len, &off))
    return -1;
  if (bulk_len)
    memcpy(frame + off, bulk, bulk_len);
  int rc = it_send_full(fd, frame, len);
  free(frame);
  uint8_t hdr[EMBPS_FRAME_HEADER_LEN];
  if (rc || it_recv_full(fd, hdr, sizeof hdr, 10000) ||
      embps_frame_header_decode(hdr, 1u << 30, h))
    return -1;
  *body = malloc(h->body_len ? h->body_len : 1);
  return it_recv_full(fd, *body, h->body_len, 10000) ? -1 : 0;
}

int repl_pull_lsn(const char *addr, const char *table, const int64_t *ids,
                  uint32_t n, uint32_t dim, float *out, uint64_t *lsn) {
  int port = atoi(strrchr(addr, ':') + 1);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_HELLO;
  m.u.hello.version = EMBPS_PROTOCOL_VERSION;
  embps_frame_header_t h;
  uint8_t *body = NULL;
  int rc = call(fd, &m, NULL, 0, &h, &body);
  free(body);
  body = NULL;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PULL;
  snprintf(m.u.pull.table, sizeof m.u.pull.table, "%s", table);
  m.u.pull.n_ids = n;
  m.u.pull.dim = dim;
  if (!rc)
    rc = call(fd, &m, ids, n * sizeof *ids, &h, &body);
  embps_msg_t r;
  if (!rc && h.kind == (EMBPS_KIND_PULL | EMBPS_KIND_REPLY) &&
      !embps_msg_unpack(h.kind, body, h.meta_len, &r) &&
      h.body_len == embps_bulk_offset(h.meta_len) + (size_t)n * dim * 4) {
    memcpy(out, body + embps_bulk_offset(h.meta_len), (size_t)n * dim * 4);
    *lsn = r.u.pull_reply.lsn;
  } else {
    rc = -1;
  }
  free(body);
  close(fd);
  return rc;
}
