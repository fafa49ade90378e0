/* client.c - libembps's API operations: creating a client, the table
 * calls, pull and push split by server, scan and write_rows, each a ticket
 * run by the transport (transport.c, internal.h).
 *
 * Pulls: the ids are deduplicated, grouped by owning server (jump hash),
 * and each server's part carries its contiguous run of unique ids; the
 * rows come back into the ticket's unique-row buffer and, once every part
 * is in, are expanded back to the caller's order.
 *
 * Push atomicity across servers: everything a server could refuse (dims,
 * counts, non-finite values, ranges) is checked here first, against a cached
 * description of the table, so a push is sent to all servers or to none.
 * Every push is sent to every server, even with no rows for it, so each
 * server's step counter (Adam's t) stays the same as the table's.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "abi.h"
#include "bufpool.h"
#include "embps/embps.h"
#include "embps/nn.h"
#include "internal.h"
#include "merge.h"
#include "util.h"
#include "wire.h"

#define DEFAULT_TIMEOUT_MS 30000
#define DEFAULT_RETRY_MS 30000
/* Pushes kept owed (transport.c) at most: past these, pushes are refused
 * until a server comes back or embps_push_resume completes them. */
#define OWED_MAX 1024
#define OWED_BYTES_MAX ((size_t)256 << 20)


/* ------------------------------------------------------------ create */

static int load_token(embps_client_t *c, const char *token, char *err,
                      size_t err_len) {
  if (token) {
    size_t n = strlen(token);
    if (n > EMBPS_TOKEN_MAX) {
      snprintf(err, err_len, "token longer than %d bytes", EMBPS_TOKEN_MAX);
      return EMBPS_EINVAL;
    }
    memcpy(c->token, token, n);
    c->token_len = n;
    return 0;
  }
  const char *path = getenv("EMBPS_TOKEN_FILE");
  if (!path || !*path)
    return 0;
  char *data;
  size_t len;
  int rc = embps_read_file(path, &data, &len);
  if (rc) {
    snprintf(err, err_len, "EMBPS_TOKEN_FILE %s: %s", path, strerror(-rc));
    return rc;
  }
  len = embps_token_first_line(data, len); /* a second line: a rotation */
  if (len > EMBPS_TOKEN_MAX) {
    free(data);
    snprintf(err, err_len, "token in %s longer than %d bytes", path,
             EMBPS_TOKEN_MAX);
    return EMBPS_EINVAL;
  }
  memcpy(c->token, data, len);
  c->token_len = len;
  free(data);
  return 0;
}

/* Connects connection ki at creation. A member whose servers answer but
 * none is primary yet (an election is on: EMBPS_ENOTPRIMARY) is asked
 * again after the member backoff within the client's retry window, as a
 * request to it would be; any other failure is returned at once. */
static int connect_first(embps_client_t *c, uint32_t ki) {
  const uint64_t until =
      embps_now_ns() +
      (c->retry_ms > 0 ? (uint64_t)c->retry_ms * 1000000ULL : 0);
  int rc;
  while ((rc = embps_client_connect_(c, ki)) == EMBPS_ENOTPRIMARY) {
    const uint64_t now = embps_now_ns();
    if (now >= until)
      break;
    uint64_t at = c->conns[ki].retry_at_ns;
    if (at > until)
      at = until;
    if (at > now) {
      const uint64_t ns = at - now;
      nanosleep(&(struct timespec){.tv_sec = (time_t)(ns / 1000000000ULL),
                                   .tv_nsec = (long)(ns % 1000000000ULL)},
                NULL);
    }
  }
  return rc;
}

int embps_client_create(const embps_client_options_t *opts,
                        embps_client_t **out, char *errbuf,
                        size_t errbuf_len) {
  return embps_client_create_member(opts, UINT32_MAX, out, errbuf,
                                    errbuf_len);
}

int embps_client_create_member(const embps_client_options_t *opts,
                               uint32_t member, embps_client_t **out,
                               char *errbuf, size_t errbuf_len) {
  char local[512];
  if (!errbuf) {
    errbuf = local;
    errbuf_len = sizeof local;
  }
  errbuf[0] = 0;
  *out = NULL;
  embps_client_options_t o; /* the caller's, at this library's size */
  embps_client_options_init(&o);
  if (opts) {
    int rc = embps_struct_read(&o, sizeof o, opts, "embps_client_options_t",
                               "embps_client_options_init()", errbuf,
                               errbuf_len);
    if (rc)
      return rc;
  }
  opts = &o;
  embps_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(errbuf, errbuf_len, "out of memory");
    return -ENOMEM;
  }
  embps_dedup_init(&c->dedup);
  embps_bufpool_init(&c->pool, 64 << 10, (size_t)256 << 20);
  const char *servers = opts->servers;
  if (!servers)
    servers = getenv("EMBPS_SERVERS");
  if (!servers || !*servers)
    servers = "127.0.0.1:7070";
  c->timeout_ms = opts->timeout_ms > 0 ? opts->timeout_ms : DEFAULT_TIMEOUT_MS;
  c->retry_ms = !opts->retry_ms     ? DEFAULT_RETRY_MS
                : opts->retry_ms < 0 ? -1
                                     : opts->retry_ms;
  int rc = 0;
  if (opts->read_from != EMBPS_READ_PRIMARY &&
      opts->read_from != EMBPS_READ_FOLLOWER) {
    snprintf(errbuf, errbuf_len, "read_from %d is neither "
             "EMBPS_READ_PRIMARY (0) nor EMBPS_READ_FOLLOWER (1)",
             opts->read_from);
    rc = EMBPS_EINVAL;
  }
  c->read_from = opts->read_from;
  c->servers_as_listed = opts->servers_as_listed != 0;
  if (!rc)
    rc = embps_servers_parse_(c, servers, errbuf, errbuf_len);
  c->member = member;
  if (!rc && member != UINT32_MAX && member >= c->n) {
    snprintf(errbuf, errbuf_len, "member %u: the server list has %u "
             "entries", member, c->n);
    rc = EMBPS_EINVAL;
  }
  if (!rc)
    rc = load_token(c, opts->token, errbuf, errbuf_len);
  if (!rc && getrandom(&c->client_id, sizeof c->client_id, 0) !=
                 (ssize_t)sizeof c->client_id)
    c->client_id = embps_now_ns() ^ ((uint64_t)getpid() << 32);
  c->client_id |= 1; /* 0 means "no exactly-once" on the wire */
  /* each member's primary, or where its reads go when they go to a
   * follower (its primary then on its first write) */
  static const embps_ticket_t reads = {.reads = 1};
  for (uint32_t i = 0; !rc && i < c->n; i++) {
    rc = member < c->n && i != member
             ? 0
             : connect_first(c, embps_client_conn_for_(c, i, &reads));
    if (rc)
      snprintf(errbuf, errbuf_len, "%s", c->last_error);
  }
  if (rc) {
    embps_client_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

void embps_client_destroy(embps_client_t *c) {
  if (!c)
    return;
  for (uint32_t i = 0; i < c->n_conns; i++)
    embps_conn_drop_(&c->conns[i], EMBPS_ECONN, "client destroyed", 0);
  embps_owed_free_all_(c);
  embps_servers_free_(c);
  free(c->tables);
  embps_dedup_close(&c->dedup);
  embps_bufpool_close(&c->pool);
  free(c);
}

const char *embps_client_last_error(const embps_client_t *c) {
  return c ? c->last_error : "no client";
}

size_t embps_client_n_servers(const embps_client_t *c) { return c->n; }

/* ------------------------------------------------------------ simple ops */

/* Sets up m as a request of kind about table `name` (in m->u.name): 0, or
 * EMBPS_EINVAL (c's last error set) for a name no table can have. */
static int name_msg(embps_client_t *c, embps_msg_t *m, uint16_t kind,
                    const char *name) {
  memset(m, 0, sizeof *m);
  m->kind = kind;
  if (!name || !*name || strlen(name) >= sizeof m->u.name)
    return embps_client_error_(c, EMBPS_EINVAL, "bad table name");
  strcpy(m->u.name, name);
  return 0;
}

/* Sends m to every server (or only server `only` if < n) and waits. *out
 * is the ticket (caller frees; NULL only when out of memory): part i holds
 * server i's reply, an ERROR reply included, or none after a connection
 * failure. max_reply: the largest reply body m can produce (0: what its
 * kind allows). reads: a follower may answer (embps_client_conn_for_).
 * Returns the first error. */
static int broadcast_each(embps_client_t *c, const embps_msg_t *m,
                          uint32_t only, size_t max_reply, int reads,
                          embps_ticket_t **out) {
  if (only >= c->n && c->member < c->n) /* embps_client_create_member */
    only = c->member;
  uint32_t n = only < c->n ? 1 : c->n;
  embps_ticket_t *t = embps_ticket_new_(OP_SIMPLE, n);
  *out = t;
  if (!t)
    return embps_client_error_(c, -ENOMEM, "out of memory");
  t->reads = (uint8_t)reads;
  if (m->kind == EMBPS_KIND_DESCRIBE || m->kind == EMBPS_KIND_LIST ||
      m->kind == EMBPS_KIND_STATS ||
      m->kind == EMBPS_KIND_ALTER ||
      m->kind == EMBPS_KIND_SCAN) /* reads, or sets absolute values */
    embps_ticket_allow_retry_(c, t);
  int rc = 0;
  for (uint32_t i = 0; i < n && !rc; i++) {
    t->parts[i].max_reply = max_reply;
    rc = embps_part_send_msg_(c, only < c->n ? only : i, &t->parts[i], m);
    if (rc) /* parts never sent count as done */
      t->n_done += n - i;
  }
  int run = embps_ticket_run_(c, t);
  if (!rc)
    rc = run;
  if (rc && t->error[0])
    embps_client_error_(c, rc, "%s", t->error);
  return rc;
}

/* broadcast_each; on success *out is the ticket, holding one reply per
 * part (caller frees). */
static int broadcast(embps_client_t *c, const embps_msg_t *m, uint32_t only,
                     embps_ticket_t **out) {
  int rc = broadcast_each(c, m, only, 0, 0, out);
  if (rc) {
    embps_ticket_free_(*out);
    *out = NULL;
  }
  return rc;
}

static void forget_table(embps_client_t *c, const char *name) {
  for (size_t i = 0; i < c->n_tables; i++) {
    if (strcmp(c->tables[i].name, name) == 0) {
      c->tables[i] = c->tables[--c->n_tables];
      return;
    }
  }
}

/* Writes the first field in which `have` (a server's) differs from `want`
 * as "lr 0.1, not 0.01" into buf; returns 0 when the specs are the same. */
static int spec_diff(const embps_table_spec_t *have,
                     const embps_table_spec_t *want, char *buf, size_t len) {
  if (have->optimizer != want->optimizer)
    return snprintf(buf, len, "optimizer %s, not %s",
                    embps_optimizer_name(have->optimizer),
                    embps_optimizer_name(want->optimizer)), 1;
  if (have->dtype != want->dtype)
    return snprintf(buf, len, "dtype %s, not %s", embps_dtype_name(have->dtype),
                    embps_dtype_name(want->dtype)), 1;
#define DIFF_INT_(f)                                                           \
  if (have->f != want->f)                                                      \
    return snprintf(buf, len, #f " %lld, not %lld", (long long)have->f,        \
                    (long long)want->f), 1;
#define DIFF_NUM_ DIFF_INT_
#define DIFF_FLAG_ DIFF_INT_
#define DIFF_ENUM_ DIFF_INT_
#define DIFF_REAL_(f)                                                          \
  if (have->f != want->f)                                                      \
    return snprintf(buf, len, #f " %.9g, not %.9g", have->f, want->f), 1;
#define DIFF_(type, f, kind, doc) DIFF_##kind##_(f)
  if (have->dim != want->dim)
    return snprintf(buf, len, "dim %u, not %u", have->dim, want->dim), 1;
  EMBPS_TABLE_SPEC_FIELDS(DIFF_)
#undef DIFF_
#undef DIFF_INT_
#undef DIFF_NUM_
#undef DIFF_FLAG_
#undef DIFF_ENUM_
#undef DIFF_REAL_
  return 0;
}

/* Writes "server 1 (H:P), server 3 (H:P)" for the servers s < n with
 * mask[s] == want into buf: at most 4 by name, then "and K more". */
static void name_servers(const embps_client_t *c, const uint8_t *mask,
                         uint8_t want, uint32_t n, char *buf, size_t len) {
  size_t used = 0;
  uint32_t named = 0, more = 0;
  buf[0] = 0;
  for (uint32_t s = 0; s < n; s++) {
    if (mask[s] != want)
      continue;
    if (named == 4) {
      more++;
      continue;
    }
    int w = snprintf(buf + used, len - used, "%sserver %u (%s)",
                     named ? ", " : "", s, c->conns[s].addr);
    if (w > 0 && (size_t)w < len - used)
      used += (size_t)w;
    named++;
  }
  if (more && used < len)
    snprintf(buf + used, len - used, " and %u more", more);
}

/* Which servers lack table `name`: describes it on every server (on a
 * member client, its member) and sets lack[s] for those answering
 * EMBPS_ENOTABLE; *n_asked gets the servers asked. With want, a server
 * holding it with another spec is EMBPS_EEXIST naming the server; without,
 * *have gets the spec of the first server holding it, and one holding
 * another is EMBPS_EEXIST too. Any other failure is an error naming the
 * server. */
static int find_lacking(embps_client_t *c, const char *name,
                        const embps_table_spec_t *want,
                        embps_table_spec_t *have, uint8_t *lack,
                        uint32_t *n_lack, uint32_t *n_asked) {
  embps_msg_t m;
  int rc = name_msg(c, &m, EMBPS_KIND_DESCRIBE, name);
  if (rc)
    return rc;
  embps_ticket_t *t;
  rc = broadcast_each(c, &m, UINT32_MAX, 0, 0, &t);
  if (!t)
    return rc;
  rc = 0;
  *n_lack = 0;
  *n_asked = t->n_parts;
  int known = want != NULL;
  uint32_t from = 0; /* the server whose spec is compared with */
  for (uint32_t i = 0; i < t->n_parts && !rc; i++) {
    const part_t *p = &t->parts[i];
    uint32_t s = p->server;
    const conn_t *k = &c->conns[s];
    char why[160];
    if (!p->has_reply) {
      rc = embps_client_error_(c, t->result ? t->result : EMBPS_ECONN, "%s",
                               t->error);
    } else if (p->reply.kind == EMBPS_KIND_ERROR &&
               p->reply.u.error.code == EMBPS_ENOTABLE) {
      *n_lack += lack[s] = 1;
    } else if (p->reply.kind == EMBPS_KIND_ERROR) {
      rc = embps_client_error_(c, p->reply.u.error.code, "server %u (%s): %s",
                               s, k->addr, p->reply.u.error.message);
    } else if (!known) {
      *have = p->reply.u.info.spec;
      want = have;
      from = s;
      known = 1;
    } else if (spec_diff(&p->reply.u.info.spec, want, why, sizeof why)) {
      if (want == have)
        rc = embps_client_error_(c, EMBPS_EEXIST, "table \"%s\" differs "
                                 "between servers: server %u (%s) holds it "
                                 "with %s of server %u (%s); nothing "
                                 "created", name, s, k->addr, why, from,
                                 c->conns[from].addr);
      else
        rc = embps_client_error_(c, EMBPS_EEXIST, "table \"%s\" already "
                                 "exists on server %u (%s) with %s", name, s,
                                 k->addr, why);
    }
  }
  embps_ticket_free_(t);
  return rc;
}

/* Creates spec on every server s with lack[s]. */
static int create_on(embps_client_t *c, const embps_table_spec_t *spec,
                     const uint8_t *lack) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CREATE;
  m.u.spec = *spec;
  int rc = 0;
  for (uint32_t s = 0; s < c->n && !rc; s++) {
    embps_ticket_t *t;
    if (lack[s] && (rc = broadcast(c, &m, s, &t)) == 0)
      embps_ticket_free_(t);
  }
  forget_table(c, spec->name);
  return rc;
}

int embps_create_table_ex(embps_client_t *c, const embps_table_spec_t *spec,
                          unsigned flags) {
  char why[256];
  int rc = embps_table_spec_check(spec, why, sizeof why);
  if (rc)
    return embps_client_error_(c, rc, "%s", why);
  uint8_t *lack = calloc(c->n, 1);
  if (!lack)
    return embps_client_error_(c, -ENOMEM, "out of memory");
  uint32_t n_lack = 0, n_asked = 0;
  rc = find_lacking(c, spec->name, spec, NULL, lack, &n_lack, &n_asked);
  if (!rc && !n_lack && !(flags & EMBPS_CREATE_EXIST_OK)) {
    if (c->n == 1)
      rc = embps_client_error_(c, EMBPS_EEXIST, "server 0 (%s): table \"%s\" "
                               "already exists", c->conns[0].addr, spec->name);
    else
      rc = embps_client_error_(c, EMBPS_EEXIST, "table \"%s\" already exists "
                               "on all %u servers", spec->name, n_asked);
  } else if (!rc && n_lack && n_lack < n_asked) {
    char lacking[400], holding[400];
    name_servers(c, lack, 1, c->n, lacking, sizeof lacking);
    name_servers(c, lack, 0, c->n, holding, sizeof holding);
    rc = embps_client_error_(c, EMBPS_EPARTIAL, "table \"%s\" is missing on "
                             "%s but held by %s: a member that lost its "
                             "data; nothing created. Complete it explicitly "
                             "(its rows there start again from the "
                             "initializer): embps complete-table %s, or "
                             "restore its data dir", spec->name, lacking,
                             holding, spec->name);
  }
  if (!rc)
    rc = create_on(c, spec, lack);
  free(lack);
  return rc;
}

int embps_create_table(embps_client_t *c, const embps_table_spec_t *spec) {
  return embps_create_table_ex(c, spec, 0);
}

int embps_complete_table(embps_client_t *c, const char *name,
                         uint32_t *created) {
  if (created)
    *created = 0;
  uint8_t *lack = calloc(c->n, 1);
  if (!lack)
    return embps_client_error_(c, -ENOMEM, "out of memory");
  embps_table_spec_t spec;
  uint32_t n_lack = 0, n_asked = 0;
  int rc = find_lacking(c, name, NULL, &spec, lack, &n_lack, &n_asked);
  if (!rc && n_lack == n_asked)
    rc = embps_client_error_(c, EMBPS_ENOTABLE, "table \"%s\": no server "
                             "holds it (nothing to complete it from)", name);
  if (!rc && n_lack)
    rc = create_on(c, &spec, lack);
  if (!rc && created)
    *created = n_lack;
  free(lack);
  return rc;
}

int embps_drop_table(embps_client_t *c, const char *name) {
  embps_msg_t m;
  int rc = name_msg(c, &m, EMBPS_KIND_DROP, name);
  if (rc)
    return rc;
  forget_table(c, name);
  embps_ticket_t *t;
  rc = broadcast(c, &m, UINT32_MAX, &t);
  if (!rc)
    embps_ticket_free_(t);
  return rc;
}

/* Adds server x's counters into sum, each as EMBPS_TABLE_INFO_FIELDS
 * says (summed, or the largest). */
static void add_counters(embps_table_info_t *sum, const embps_table_info_t *x) {
#define MERGE_SUM_(f) sum->f += x->f;
#define MERGE_MAX_(f)                                                          \
  if (x->f > sum->f)                                                           \
    sum->f = x->f;
#define MERGE_(type, f, merge, doc) MERGE_##merge##_(f)
  EMBPS_TABLE_INFO_FIELDS(MERGE_)
#undef MERGE_
#undef MERGE_SUM_
#undef MERGE_MAX_
}

/* The table infos of a broadcast's replies, counters summed. */
static void infos_sum(const embps_ticket_t *t, embps_table_info_t *out) {
  *out = t->parts[0].reply.u.info;
  for (uint32_t i = 1; i < t->n_parts; i++)
    add_counters(out, &t->parts[i].reply.u.info);
}

int embps_describe_table(embps_client_t *c, const char *name,
                         embps_table_info_t *out) {
  embps_msg_t m;
  int rc = name_msg(c, &m, EMBPS_KIND_DESCRIBE, name);
  if (rc)
    return rc;
  embps_ticket_t *t;
  rc = broadcast_each(c, &m, UINT32_MAX, 0, 1, &t); /* a follower may say */
  if (rc) {
    embps_ticket_free_(t);
    return rc;
  }
  infos_sum(t, out);
  embps_ticket_free_(t);
  return 0;
}

int embps_list_tables_held(embps_client_t *c, embps_table_info_t **out,
                           size_t *n, uint8_t **held) {
  *out = NULL;
  *n = 0;
  if (held)
    *held = NULL;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_LIST;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  size_t cap = 0;
  for (uint32_t s = 0; s < t->n_parts; s++)
    cap += t->parts[s].reply.u.list.n;
  const uint32_t K = c->n;
  embps_table_info_t *v = malloc((cap ? cap : 1) * sizeof *v);
  uint8_t *h = calloc((cap ? cap : 1) * K, 1);
  size_t k = 0;
  for (uint32_t s = 0; s < t->n_parts && v && h; s++) {
    const embps_msg_t *r = &t->parts[s].reply;
    for (size_t b = 0; b < r->u.list.n; b++) {
      const embps_table_info_t *x = &r->u.list.v[b];
      size_t a = 0;
      while (a < k && strcmp(v[a].spec.name, x->spec.name))
        a++;
      if (a == k) {
        v[k++] = *x;
        for (uint32_t o = 0; c->member < K && o < K; o++)
          h[a * K + o] = 1; /* a member client asks no other server */
      } else {
        add_counters(&v[a], x);
      }
      h[a * K + t->parts[s].server] = 1;
    }
  }
  embps_ticket_free_(t);
  if (!v || !h) {
    free(v);
    free(h);
    return embps_client_error_(c, -ENOMEM, "out of memory");
  }
  *out = v;
  *n = k;
  if (held)
    *held = h;
  else
    free(h);
  return 0;
}

int embps_list_tables(embps_client_t *c, embps_table_info_t **out,
                      size_t *n) {
  return embps_list_tables_held(c, out, n, NULL);
}

void embps_tables_free(embps_table_info_t *tables, uint8_t *held) {
  free(tables);
  free(held);
}

const char *embps_client_server_address(const embps_client_t *c,
                                        size_t index) {
  return c && index < c->n ? c->conns[index].addr : NULL;
}

const char *embps_client_read_address(const embps_client_t *c,
                                      size_t index) {
  static const embps_ticket_t reads = {.reads = 1};
  if (!c || index >= c->n)
    return NULL;
  const conn_t *k = &c->conns[embps_client_conn_for_(c, (uint32_t)index,
                                                     &reads)];
  return k->addr;
}

uint64_t embps_client_read_lsn(const embps_client_t *c, size_t index) {
  return c && index < c->n ? c->members[index].read_lsn : 0;
}

/* A server's text field, escaped in place (control bytes and invalid
 * UTF-8 as \xNN; cut to fit), as every server text the library hands
 * over. */
static void escape_field(char *field, size_t cap) {
  char raw[256];
  snprintf(raw, sizeof raw, "%s", field);
  embps_escape(raw, field, cap);
}

int embps_stats(embps_client_t *c, embps_server_stats_t **out,
                size_t *n_servers) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_STATS;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  uint32_t n = t->n_parts; /* c->n, or 1 for a member client */
  embps_server_stats_t *v = calloc(n, sizeof *v);
  if (!v) {
    embps_ticket_free_(t);
    return embps_client_error_(c, -ENOMEM, "out of memory");
  }
  for (uint32_t i = 0; i < n; i++) {
    v[i] = t->parts[i].reply.u.stats;
    snprintf(v[i].address, sizeof v[i].address, "%.63s",
             c->conns[t->parts[i].conn].addr);
    escape_field(v[i].version, sizeof v[i].version);
    escape_field(v[i].data_dir, sizeof v[i].data_dir);
    escape_field(v[i].fsync, sizeof v[i].fsync);
    escape_field(v[i].durability_failed, sizeof v[i].durability_failed);
    escape_field(v[i].primary, sizeof v[i].primary);
    for (uint32_t j = 0; j < v[i].n_members; j++)
      escape_field(v[i].members[j].primary, sizeof v[i].members[j].primary);
    t->parts[i].reply.u.stats.tables = NULL; /* handed to the caller */
    t->parts[i].reply.u.stats.n_tables = 0;
    t->parts[i].reply.u.stats.members = NULL;
    t->parts[i].reply.u.stats.n_members = 0;
  }
  embps_ticket_free_(t);
  *out = v;
  *n_servers = n;
  return 0;
}

void embps_stats_free(embps_server_stats_t *s, size_t n_servers) {
  if (!s)
    return;
  for (size_t i = 0; i < n_servers; i++) {
    free(s[i].tables);
    free(s[i].members);
  }
  free(s);
}

int embps_checkpoint(embps_client_t *c, embps_checkpoint_info_t *info) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_CHECKPOINT;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  for (uint32_t i = 0; info && i < t->n_parts; i++)
    info[t->parts[i].server] = t->parts[i].reply.u.checkpoint;
  embps_ticket_free_(t);
  return 0;
}

int embps_alter_table(embps_client_t *c, const char *name,
                      const embps_table_alter_t *alter,
                      embps_table_info_t *out) {
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_ALTER;
  if (!name || !*name || strlen(name) >= sizeof m.u.alter.name)
    return embps_client_error_(c, EMBPS_EINVAL, "bad table name");
  if (!alter)
    return embps_client_error_(c, EMBPS_EPARAM,
                               "nothing to alter in table \"%s\"", name);
  char why[256];
  int rc = embps_table_alter_read(alter, &m.u.alter.set, why, sizeof why);
  if (rc)
    return embps_client_error_(c, rc, "%s", why);
  if (!m.u.alter.set.set || (m.u.alter.set.set & ~EMBPS_ALTER_ALL))
    return embps_client_error_(c, EMBPS_EPARAM,
                               "nothing to alter in table \"%s\"", name);
  strcpy(m.u.alter.name, name);
  forget_table(c, name);
  embps_ticket_t *t;
  rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  if (out)
    infos_sum(t, out);
  embps_ticket_free_(t);
  return 0;
}

int embps_set_lr(embps_client_t *c, const char *name, double lr) {
  embps_table_alter_t a;
  embps_table_alter_init(&a);
  a.set = EMBPS_ALTER_LR;
  a.lr = lr;
  return embps_alter_table(c, name, &a, NULL);
}

int embps_evict(embps_client_t *c, const char *table, uint64_t *evicted) {
  embps_msg_t m;
  int rc = name_msg(c, &m, EMBPS_KIND_EVICT, table);
  if (rc)
    return rc;
  embps_ticket_t *t;
  rc = broadcast(c, &m, UINT32_MAX, &t);
  if (rc)
    return rc;
  uint64_t sum = 0;
  for (uint32_t i = 0; i < t->n_parts; i++)
    sum += t->parts[i].reply.u.evicted;
  embps_ticket_free_(t);
  if (evicted)
    *evicted = sum;
  return 0;
}

/* The cached spec of a table (fetched once per client). */
static int table_spec(embps_client_t *c, const char *name,
                      const embps_table_spec_t **out) {
  for (size_t i = 0; i < c->n_tables; i++) {
    if (strcmp(c->tables[i].name, name) == 0) {
      *out = &c->tables[i].spec;
      return 0;
    }
  }
  embps_table_info_t info;
  embps_msg_t m;
  int rc = name_msg(c, &m, EMBPS_KIND_DESCRIBE, name);
  if (rc)
    return rc;
  embps_ticket_t *t;
  rc = broadcast_each(c, &m, 0, 0, 1, &t); /* what a pull or scan needs */
  if (rc) {
    embps_ticket_free_(t);
    return rc;
  }
  info = t->parts[0].reply.u.info;
  embps_ticket_free_(t);
  if (strcmp(info.spec.name, name) || info.spec.dim == 0 ||
      info.spec.dim > EMBPS_DIM_MAX)
    return embps_client_error_(c, EMBPS_EPROTO, "server 0 (%s): described "
                               "table \"%s\" of dim %u when asked for \"%s\"",
                               c->conns[0].addr, info.spec.name,
                               info.spec.dim, name);
  cached_table_t *v = realloc(c->tables, (c->n_tables + 1) * sizeof *v);
  if (!v)
    return embps_client_error_(c, -ENOMEM, "out of memory");
  c->tables = v;
  snprintf(v[c->n_tables].name, sizeof v[c->n_tables].name, "%s", name);
  v[c->n_tables].spec = info.spec;
  *out = &v[c->n_tables++].spec;
  return 0;
}

/* ------------------------------------------------------------ bulk calls */

static int check_name(embps_client_t *c, const char *table) {
  if (!table || !*table || strlen(table) >= EMBPS_TABLE_NAME_MAX)
    return embps_client_error_(c, EMBPS_EINVAL, "bad table name");
  return 0;
}

/* What every bulk call (pull, push, write_rows) is given: 0, or EMBPS_EINVAL
 * with c's last error set. */
static int check_bulk(embps_client_t *c, const char *table, size_t n,
                      uint32_t dim) {
  if (check_name(c, table))
    return EMBPS_EINVAL;
  if (dim == 0 || dim > EMBPS_DIM_MAX || n > UINT32_MAX)
    return embps_client_error_(c, EMBPS_EINVAL, "bad dim or count");
  return 0;
}

/* Frees t (NULL-safe, never sent) and fails the call for want of memory. */
static int ticket_oom(embps_client_t *c, embps_ticket_t *t) {
  embps_ticket_free_(t);
  return embps_client_error_(c, -ENOMEM, "out of memory");
}

/* A bulk call's ticket, one part per server, of dim floats a row; with
 * retry its parts may be sent again after a connection failure (from
 * now on). NULL (c's last error set) when out of memory. */
static embps_ticket_t *bulk_ticket(embps_client_t *c, op_t op, uint32_t dim,
                                   int retry) {
  embps_ticket_t *t = embps_ticket_new_(op, c->n);
  if (!t) {
    ticket_oom(c, NULL);
    return NULL;
  }
  if (retry)
    embps_ticket_allow_retry_(c, t);
  t->dim = dim;
  return t;
}

/* Sets up m as a bulk request of kind on table, rows of dim floats (its
 * count is each part's, set by send_parts). */
static void bulk_msg(embps_msg_t *m, uint16_t kind, const char *table,
                     uint32_t dim) {
  memset(m, 0, sizeof *m);
  m->kind = kind;
  if (kind == EMBPS_KIND_PULL) {
    strcpy(m->u.pull.table, table);
    m->u.pull.dim = dim;
  } else if (kind == EMBPS_KIND_WRITE_ROWS) {
    strcpy(m->u.write_rows.table, table);
    m->u.write_rows.dim = dim;
  } else {
    strcpy(m->u.push.table, table);
    m->u.push.dim = dim;
  }
}

/* Splits positions 0..n-1 of ids by owning server into the ticket's parts
 * (pos arrays). With one server, part 0 takes them all, in order, with no
 * pos array (its bulk can be the caller's arrays as they are). */
static int split_by_server(embps_client_t *c, embps_ticket_t *t,
                           const int64_t *ids, size_t n) {
  uint32_t K = c->n;
  if (K == 1) {
    t->parts[0].n = n;
    return 0;
  }
  size_t *count = calloc(K, sizeof *count);
  uint32_t *owner = malloc((n ? n : 1) * sizeof *owner);
  if (!count || !owner) {
    free(count);
    free(owner);
    return -ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    owner[i] = embps_route(ids[i], K);
    count[owner[i]]++;
  }
  int rc = 0;
  for (uint32_t s = 0; s < K && !rc; s++) {
    t->parts[s].pos = malloc((count[s] ? count[s] : 1) * sizeof(uint32_t));
    if (!t->parts[s].pos)
      rc = -ENOMEM;
  }
  for (size_t i = 0; i < n && !rc; i++) {
    part_t *p = &t->parts[owner[i]];
    p->pos[p->n++] = (uint32_t)i;
  }
  free(count);
  free(owner);
  return rc;
}

/* Where a request's bulk comes from. */
typedef struct {
  size_t (*len)(const part_t *p, uint32_t dim);
  /* The bulk as up to two segments of memory that stays unchanged until
   * the reply (the caller's buffers or the ticket's): sent from there, not
   * copied. Returns how many, or 0 when fill must gather it. */
  int (*borrow)(const embps_ticket_t *t, const part_t *p, const void *ctx,
                struct iovec seg[2]);
  /* Writes the bulk at dst. */
  void (*fill)(const embps_ticket_t *t, const part_t *p, const void *ctx,
               uint8_t *dst);
} bulk_ops_t;

/* Sends one request per part in parts [0, n_parts), with the bulk that ops
 * gives for it. Parts not sent are marked done; returns the first error. */
static int send_parts(embps_client_t *c, embps_ticket_t *t, embps_msg_t *m,
                      const bulk_ops_t *ops, const void *ctx,
                      int send_empty) {
  for (uint32_t s = 0; s < t->n_parts; s++) {
    part_t *p = &t->parts[s];
    if (t->result || (!p->n && !send_empty)) {
      embps_part_done_(p);
      continue;
    }
    if (m->kind == EMBPS_KIND_PULL)
      m->u.pull.n_ids = (uint32_t)p->n;
    else if (m->kind == EMBPS_KIND_WRITE_ROWS)
      m->u.write_rows.n = (uint32_t)p->n;
    else
      m->u.push.n = (uint32_t)p->n;
    size_t off = 0;
    const size_t bulk_len = ops->len(p, t->dim);
    struct iovec seg[2];
    const int n_seg = ops->borrow(t, p, ctx, seg);
    p->server = s;
    p->kind = m->kind;
    p->req_id = ++c->next_req_id;
    int rc = n_seg ? embps_frame_build_head(m, p->req_id, bulk_len, &p->frame,
                                            &p->frame_len)
                   : embps_frame_build(m, p->req_id, bulk_len, &p->frame,
                                       &p->frame_len, &off);
    if (rc) {
      embps_ticket_fail_(t, rc, "%s", embps_strerror(rc));
    } else if ((rc = embps_client_frame_fits_(
                    c, s, n_seg ? p->frame_len + bulk_len : p->frame_len))) {
      embps_ticket_fail_(t, rc, "%s", c->last_error);
    }
    if (rc) {
      embps_part_done_(p);
      continue;
    }
    if (!n_seg)
      ops->fill(t, p, ctx, p->frame + off);
    for (int i = 0; i < n_seg; i++)
      p->bulk[i] = seg[i];
    p->n_bulk = n_seg;
    embps_part_submit_(c, s, p);
  }
  return t->result;
}

/* ------------------------------------------------------------ pull */

/* Hands a finished pull's buffers to the pool. */
static void pull_give_buffers(embps_client_t *c, embps_ticket_t *t) {
  embps_bufpool_give(&c->pool, t->uniq, t->uniq_cap);
  embps_bufpool_give(&c->pool, t->inverse, t->inverse_cap);
  if (t->urows != t->out)
    embps_bufpool_give(&c->pool, t->urows, t->urows_cap);
  t->uniq = NULL;
  t->inverse = NULL;
  t->urows = t->out;
}

/* Orders the ticket's unique ids by owning server, so that each server's
 * ids, and so its rows, are contiguous (part s covers [base, base + n)),
 * and remaps the inverse index to match. */
static int group_unique_by_server(embps_client_t *c, embps_ticket_t *t) {
  uint32_t K = c->n;
  size_t n = t->n_unique;
  if (K == 1) {
    t->parts[0].base = 0;
    t->parts[0].n = n;
    return 0;
  }
  uint32_t *owner = malloc((n ? n : 1) * sizeof *owner);
  uint32_t *moved = malloc((n ? n : 1) * sizeof *moved);
  size_t ids_cap;
  int64_t *ids = embps_bufpool_take(&c->pool, n * sizeof *ids, &ids_cap);
  size_t *fill = calloc(K, sizeof *fill);
  int rc = owner && moved && ids && fill ? 0 : -ENOMEM;
  if (!rc) {
    for (size_t i = 0; i < n; i++) {
      owner[i] = embps_route(t->uniq[i], K);
      t->parts[owner[i]].n++;
    }
    for (uint32_t s = 1; s < K; s++)
      t->parts[s].base = t->parts[s - 1].base + t->parts[s - 1].n;
    for (size_t i = 0; i < n; i++) {
      part_t *p = &t->parts[owner[i]];
      moved[i] = (uint32_t)(p->base + fill[owner[i]]++);
      ids[moved[i]] = t->uniq[i];
    }
    for (size_t i = 0; i < t->n; i++)
      t->inverse[i] = moved[t->inverse[i]];
    embps_bufpool_give(&c->pool, t->uniq, t->uniq_cap);
    t->uniq = ids; /* with its own capacity: it goes back to the pool */
    t->uniq_cap = ids_cap;
    ids = NULL;
  }
  free(owner);
  free(moved);
  embps_bufpool_give(&c->pool, ids, ids_cap);
  free(fill);
  return rc;
}

static size_t pull_bulk_len(const part_t *p, uint32_t dim) {
  return p->n * sizeof(int64_t);
}

/* A part's ids are contiguous in the ticket's unique ids. */
static int pull_borrow(const embps_ticket_t *t, const part_t *p,
                       const void *ctx, struct iovec seg[2]) {
  seg[0] = (struct iovec){.iov_base = t->uniq + p->base,
                          .iov_len = p->n * sizeof *t->uniq};
  return 1;
}

static const bulk_ops_t pull_ops = {pull_bulk_len, pull_borrow, NULL};

int embps_pull_async(embps_client_t *c, const char *table,
                     const int64_t *ids, size_t n, float *out, uint32_t dim,
                     embps_ticket_t **ticket) {
  *ticket = NULL;
  int rc = check_bulk(c, table, n, dim);
  if (rc)
    return rc;
  embps_ticket_t *t = bulk_ticket(c, OP_PULL, dim, 1);
  if (!t)
    return -ENOMEM;
  t->reads = 1; /* a follower may serve it */
  t->out = out;
  t->n = n;
  t->uniq = embps_bufpool_take(&c->pool, n * sizeof *t->uniq, &t->uniq_cap);
  t->inverse =
      embps_bufpool_take(&c->pool, n * sizeof *t->inverse, &t->inverse_cap);
  int64_t k = t->uniq && t->inverse
                  ? embps_dedup_ids(&c->dedup, ids, n, t->uniq, t->inverse)
                  : -ENOMEM;
  if (k >= 0) {
    t->n_unique = (size_t)k;
    /* all distinct on one server: the rows land in the caller's buffer */
    t->urows = (size_t)k == n && c->n == 1
                   ? out
                   : embps_bufpool_take(&c->pool,
                                        (size_t)k * dim * sizeof(float),
                                        &t->urows_cap);
    if (!t->urows)
      k = -ENOMEM;
  }
  if (k >= 0)
    k = group_unique_by_server(c, t);
  if (k < 0)
    return ticket_oom(c, t);
  embps_msg_t m;
  bulk_msg(&m, EMBPS_KIND_PULL, table, dim);
  send_parts(c, t, &m, &pull_ops, NULL, 0);
  *ticket = t;
  return 0;
}

int embps_pull(embps_client_t *c, const char *table, const int64_t *ids,
               size_t n, float *out, uint32_t dim) {
  embps_ticket_t *t;
  int rc = embps_pull_async(c, table, ids, n, out, dim, &t);
  return rc ? rc : embps_wait(c, t);
}

/* ------------------------------------------------------------ push */

typedef struct {
  const int64_t *idx;
  const float *vals;
} push_src_t;

static size_t push_bulk_len(const part_t *p, uint32_t dim) {
  return p->n * (sizeof(int64_t) + dim * sizeof(float));
}

/* One server: the arrays as they are. */
static int push_borrow(const embps_ticket_t *t, const part_t *p,
                       const void *ctx, struct iovec seg[2]) {
  const push_src_t *src = ctx;
  if (p->pos)
    return 0;
  seg[0] = (struct iovec){.iov_base = (void *)src->idx,
                          .iov_len = p->n * sizeof *src->idx};
  seg[1] = (struct iovec){.iov_base = (void *)src->vals,
                          .iov_len = p->n * t->dim * sizeof *src->vals};
  return 2;
}

/* Several servers: the part's rows, gathered. */
static void push_fill(const embps_ticket_t *t, const part_t *p,
                      const void *ctx, uint8_t *dst) {
  const push_src_t *src = ctx;
  uint32_t dim = t->dim;
  int64_t *idx = (int64_t *)dst;
  float *vals = (float *)(dst + p->n * sizeof(int64_t));
  for (size_t i = 0; i < p->n; i++) {
    idx[i] = src->idx[p->pos[i]];
    memcpy(vals + i * dim, src->vals + (size_t)p->pos[i] * dim,
           dim * sizeof *vals);
  }
}

/* Everything a server could refuse, checked before anything is sent. */
static int check_push(embps_client_t *c, const embps_table_spec_t *s,
                      const int64_t *idx, size_t n, const float *vals,
                      uint32_t dim) {
  if (dim != s->dim)
    return embps_client_error_(c, EMBPS_EDIM, "table \"%s\" has dim %u, the "
                               "request has dim %u", s->name, s->dim, dim);
  for (size_t i = 0; i < n; i++) {
    if (!s->dynamic && (uint64_t)idx[i] >= s->rows)
      return embps_client_error_(c, EMBPS_ERANGE, "index %lld out of range "
                                 "[0, %llu) of table \"%s\"",
                                 (long long)idx[i],
                                 (unsigned long long)s->rows, s->name);
    const float *r = vals + i * dim;
    for (uint32_t j = 0; j < dim; j++)
      if (!isfinite(r[j]))
        return embps_client_error_(c, EMBPS_ENONFINITE, "non-finite gradient "
                                   "value at position %zu (index %lld)", i,
                                   (long long)idx[i]);
  }
  return 0;
}

static int push_async(embps_client_t *c, const char *table,
                      const int64_t *indices, size_t n, const float *values,
                      uint32_t dim, unsigned flags, uint64_t step,
                      embps_ticket_t **ticket) {
  *ticket = NULL;
  int rc = check_bulk(c, table, n, dim);
  if (rc)
    return rc;
  if (c->n_owed >= OWED_MAX || c->owed_bytes >= OWED_BYTES_MAX)
    return embps_client_error_(c, EMBPS_ELIMIT, "%u pushes (%zu bytes) are "
                               "owed to servers that stopped answering: no "
                               "push is sent until they are completed "
                               "(embps_push_resume)", c->n_owed,
                               c->owed_bytes);
  if (c->n > 1) { /* cross-server atomicity needs the checks up front */
    const embps_table_spec_t *spec = NULL;
    rc = table_spec(c, table, &spec);
    if (!rc)
      rc = check_push(c, spec, indices, n, values, dim);
    if (rc)
      return rc;
  }
  /* retried exactly once: the same client id and seq */
  embps_ticket_t *t = bulk_ticket(c, OP_PUSH, dim, 1);
  if (!t)
    return -ENOMEM;
  push_src_t src = {indices, values};
  if (flags & EMBPS_PUSH_MERGE) {
    t->m_idx = malloc((n ? n : 1) * sizeof *t->m_idx);
    t->m_vals = malloc((n ? n : 1) * dim * sizeof *t->m_vals);
    int64_t k = t->m_idx && t->m_vals
                    ? embps_merge_rows(&c->dedup, indices, values, n, dim,
                                       t->m_idx, t->m_vals)
                    : -ENOMEM;
    if (k < 0)
      return ticket_oom(c, t);
    n = (size_t)k;
    src.idx = t->m_idx;
    src.vals = t->m_vals;
  }
  if (split_by_server(c, t, src.idx, n))
    return ticket_oom(c, t);
  embps_msg_t m;
  bulk_msg(&m, EMBPS_KIND_PUSH, table, dim);
  m.u.push.client_id = c->client_id;
  m.u.push.seq = t->seq = ++c->seq;
  m.u.push.step = step;
  static const bulk_ops_t push_ops = {push_bulk_len, push_borrow, push_fill};
  send_parts(c, t, &m, &push_ops, &src, 1);
  *ticket = t;
  return 0;
}

int embps_push_async(embps_client_t *c, const char *table,
                     const int64_t *indices, size_t n, const float *values,
                     uint32_t dim, unsigned flags, embps_ticket_t **ticket) {
  return push_async(c, table, indices, n, values, dim, flags, 0, ticket);
}

int embps_push_step_async(embps_client_t *c, const char *table,
                          const int64_t *indices, size_t n,
                          const float *values, uint32_t dim, unsigned flags,
                          uint64_t step, embps_ticket_t **ticket) {
  return push_async(c, table, indices, n, values, dim, flags, step, ticket);
}

int embps_push(embps_client_t *c, const char *table, const int64_t *indices,
               size_t n, const float *values, uint32_t dim, unsigned flags) {
  embps_ticket_t *t;
  int rc = push_async(c, table, indices, n, values, dim, flags, 0, &t);
  return rc ? rc : embps_wait(c, t);
}

int embps_push_step(embps_client_t *c, const char *table,
                    const int64_t *indices, size_t n, const float *values,
                    uint32_t dim, unsigned flags, uint64_t step) {
  embps_ticket_t *t;
  int rc = push_async(c, table, indices, n, values, dim, flags, step, &t);
  return rc ? rc : embps_wait(c, t);
}

/* ------------------------------------------------------------ wait */

int embps_wait(embps_client_t *c, embps_ticket_t *t) {
  if (!t)
    return embps_client_error_(c, EMBPS_EINVAL, "no ticket");
  int rc = embps_ticket_run_(c, t);
  if (!rc && t->op == OP_PULL && t->urows != t->out)
    embps_lookup(t->urows, t->dim, t->inverse, t->n, t->out);
  if (t->seq) /* a push: where it was applied, what it owes */
    rc = embps_push_outcome_(c, t, rc);
  else if (rc)
    embps_client_error_(c, rc, "%s",
                        t->error[0] ? t->error : embps_strerror(rc));
  if (t->op == OP_PULL && !rc)
    pull_give_buffers(c, t);
  embps_ticket_free_(t);
  return rc;
}

/* ------------------------------------------------------------ export/import */

int embps_scan(embps_client_t *c, uint32_t server, const char *table,
               uint64_t cursor, uint32_t max_rows, unsigned flags,
               embps_scan_chunk_t *out) {
  memset(out, 0, sizeof *out);
  int rc = check_name(c, table);
  if (rc)
    return rc;
  if (server >= c->n)
    return embps_client_error_(c, EMBPS_EINVAL, "server %u of a cluster of %u",
                               server, c->n);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_SCAN;
  strcpy(m.u.scan.table, table);
  m.u.scan.cursor = cursor;
  m.u.scan.max_rows = max_rows;
  m.u.scan.with_state = (flags & EMBPS_SCAN_STATE) != 0;
  /* the largest reply the scan can have: max_rows rows of the table's
   * dim with every state slot, within the frames the server sends */
  const embps_table_spec_t *spec;
  if ((rc = table_spec(c, table, &spec)))
    return rc;
  const uint64_t row_max = 8 + 4 * (uint64_t)spec->dim * 3;
  uint64_t max = c->conns[server].max_frame ? c->conns[server].max_frame
                                            : EMBPS_REPLY_MAX;
  if (max_rows && max_rows * row_max < max)
    max = max_rows * row_max;
  embps_ticket_t *t;
  rc = broadcast_each(c, &m, server, (size_t)max + EMBPS_REPLY_META_MAX, 1,
                      &t);
  if (rc) {
    embps_ticket_free_(t);
    return rc;
  }
  part_t *p = &t->parts[0];
  const embps_scan_reply_t *r = &p->reply.u.scan_reply;
  const uint64_t per_row =
      8 + 4 * (uint64_t)r->dim * (1 + (uint64_t)r->state_floats);
  if (r->dim == 0 || r->dim > EMBPS_DIM_MAX || r->state_floats > 2 ||
      (r->state_floats && !m.u.scan.with_state) ||
      (max_rows && r->n_rows > max_rows) ||
      p->rbulk_len != r->n_rows * per_row || (r->n_rows && !p->rbulk)) {
    embps_ticket_free_(t);
    return embps_client_error_(c, EMBPS_EPROTO, "server %u (%s): scan reply "
                               "does not match its counts", server,
                               c->conns[p->conn].addr);
  }
  out->n = r->n_rows;
  out->dim = r->dim;
  out->state_slots = r->state_floats;
  out->next_cursor = r->next_cursor;
  out->done = r->done;
  out->step = r->step;
  out->ids = (int64_t *)p->rbulk;
  out->weights = (float *)(p->rbulk + out->n * 8);
  out->state = r->state_floats ? out->weights + out->n * out->dim : NULL;
  out->priv = p->rbulk;
  p->rbulk = NULL;
  embps_ticket_free_(t);
  return 0;
}

void embps_scan_chunk_free(embps_scan_chunk_t *chunk) {
  if (!chunk)
    return;
  free(chunk->priv);
  memset(chunk, 0, sizeof *chunk);
}

typedef struct {
  const int64_t *ids;
  const float *w, *state;
  uint32_t dim, slots;
} rows_src_t;

/* The ticket's dim is the floats of a row on the wire: weights and state. */
static int rows_borrow(const embps_ticket_t *t, const part_t *p,
                       const void *ctx, struct iovec seg[2]) {
  (void)t;
  (void)p;
  (void)ctx;
  (void)seg;
  return 0; /* three arrays: always gathered */
}

static void rows_fill(const embps_ticket_t *t, const part_t *p,
                      const void *ctx, uint8_t *dst) {
  const rows_src_t *src = ctx;
  const size_t dim = src->dim, sf = (size_t)src->slots * dim;
  int64_t *ids = (int64_t *)dst;
  float *w = (float *)(dst + p->n * sizeof *ids);
  float *state = w + p->n * dim;
  (void)t;
  for (size_t i = 0; i < p->n; i++) {
    size_t j = p->pos ? p->pos[i] : i;
    ids[i] = src->ids[j];
    memcpy(w + i * dim, src->w + j * dim, dim * sizeof *w);
    if (sf)
      memcpy(state + i * sf, src->state + j * sf, sf * sizeof *state);
  }
}

int embps_write_rows(embps_client_t *c, const char *table,
                     const int64_t *ids, size_t n, const float *weights,
                     uint32_t dim, const float *state, int set_step,
                     uint64_t step) {
  int rc = check_bulk(c, table, n, dim);
  if (rc)
    return rc;
  const embps_table_spec_t *spec = NULL;
  rc = table_spec(c, table, &spec);
  if (rc)
    return rc;
  uint32_t slots =
      state ? embps_optimizer_state_slots(spec->optimizer, NULL) : 0;
  if (c->n > 1 && (rc = check_push(c, spec, ids, n, weights, dim)) != 0)
    return rc;
  /* the ticket's dim: the floats of a row on the wire, weights and state */
  embps_ticket_t *t = bulk_ticket(c, OP_PUSH, dim * (1 + slots), 0);
  if (!t)
    return -ENOMEM;
  if (split_by_server(c, t, ids, n))
    return ticket_oom(c, t);
  embps_msg_t m;
  bulk_msg(&m, EMBPS_KIND_WRITE_ROWS, table, dim);
  m.u.write_rows.state_floats = slots;
  m.u.write_rows.has_step = set_step != 0;
  m.u.write_rows.step = step;
  rows_src_t src = {ids, weights, state, dim, slots};
  static const bulk_ops_t rows_ops = {push_bulk_len, rows_borrow, rows_fill};
  send_parts(c, t, &m, &rows_ops, &src, set_step);
  return embps_wait(c, t);
}

/* ------------------------------------------------------------ promote */

int embps_promote(embps_client_t *c, uint32_t *epoch, uint64_t *lsn) {
  if (c->member >= c->n && c->n != 1)
    return embps_client_error_(c, EMBPS_EINVAL, "promote addresses one "
                               "server: give the follower alone, or its "
                               "member (--member I)");
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_PROMOTE;
  embps_ticket_t *t;
  int rc = broadcast(c, &m, c->member < c->n ? c->member : 0, &t);
  if (rc)
    return rc;
  if (epoch)
    *epoch = t->parts[0].reply.u.promote.epoch;
  if (lsn)
    *lsn = t->parts[0].reply.u.promote.lsn;
  embps_ticket_free_(t);
  return 0;
}

/* ------------------------------------------------------------ peers */

int embps_client_create_peer_(const char *addr, const char *token,
                              size_t token_len, int timeout_ms,
                              embps_client_t **out, char *err,
                              size_t err_len) {
  *out = NULL;
  err[0] = 0;
  if (token_len > EMBPS_TOKEN_MAX || strchr(addr, ',') ||
      strchr(addr, '|')) {
    snprintf(err, err_len, "bad peer \"%s\" or token", addr);
    return EMBPS_EINVAL;
  }
  embps_client_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
  }
  embps_dedup_init(&c->dedup);
  embps_bufpool_init(&c->pool, 64 << 10, (size_t)16 << 20);
  c->peer = 1;
  c->servers_as_listed = 1; /* that server, whatever its role */
  c->timeout_ms = timeout_ms > 0 ? timeout_ms : DEFAULT_TIMEOUT_MS;
  c->retry_ms = -1;
  c->member = UINT32_MAX;
  memcpy(c->token, token, token_len);
  c->token_len = token_len;
  int rc = embps_servers_parse_(c, addr, err, err_len);
  if (!rc && (rc = embps_client_connect_(c, 0)) != 0)
    snprintf(err, err_len, "%s", c->last_error);
  if (rc) {
    embps_client_destroy(c);
    return rc;
  }
  *out = c;
  return 0;
}

int embps_client_send_(embps_client_t *c, const embps_msg_t *m,
                       embps_ticket_t **out) {
  embps_ticket_t *t = embps_ticket_new_(OP_SIMPLE, 1);
  *out = NULL;
  if (!t)
    return embps_client_error_(c, -ENOMEM, "out of memory");
  int rc = embps_part_send_msg_(c, 0, &t->parts[0], m);
  if (rc) {
    embps_ticket_free_(t);
    return rc;
  }
  t->sent_ns = embps_now_ns();
  *out = t;
  return 0;
}

int embps_client_wait_(embps_client_t *c, embps_ticket_t *t,
                       embps_msg_t *reply, uint8_t **bulk, size_t *bulk_len,
                       uint64_t *err_lsn) {
  part_t *p = &t->parts[0];
  int rc = embps_ticket_run_(c, t);
  memset(reply, 0, sizeof *reply);
  *bulk = NULL;
  *bulk_len = 0;
  if (err_lsn)
    *err_lsn = p->has_reply && p->reply.kind == EMBPS_KIND_ERROR
                   ? p->reply.u.error.lsn
                   : 0;
  if (rc) {
    embps_client_error_(c, rc, "%s",
                        t->error[0] ? t->error : embps_strerror(rc));
  } else {
    *reply = p->reply;
    p->has_reply = 0;
    *bulk = p->rbulk;
    *bulk_len = p->rbulk_len;
    p->rbulk = NULL;
  }
  embps_ticket_free_(t);
  return rc;
}

void embps_client_cancel_(embps_client_t *c, embps_ticket_t *t) {
  if (!t)
    return;
  if (c && t->n_done < t->n_parts)
    embps_ticket_cancel_(c, t, EMBPS_ECONN);
  embps_ticket_free_(t);
}
