/* coord.c - the coordinator of coord.h: one thread per server that keeps
 * its lease, reads its slot's keys, and campaigns or follows.
 *
 * The thread runs steps. A step renews the lease when due (or gets one),
 * makes sure this server's P/servers key exists, reads the whole slot (one
 * range over P/) and decides from what it read: follow the holder, stay
 * primary, or take part in an election. Between steps it waits on a
 * watch of P/ (any change wakes it), a kick, or the next renewal; every
 * lease/3 it steps anyway, so a lost watch costs latency, never
 * correctness. Elections are spread over steps (post the candidacy,
 * wait for the round, compare, campaign), so renewals go on meanwhile.
 *
 * The fence (coord.h "Fencing") is an atomic deadline: written only by
 * this thread, read by any. */
#include "coord.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcd.h"
#include "json.h"
#include "util.h"

#define MS 1000000ull

/* What one read of the slot found. */
typedef struct {
  int has_primary;
  int64_t primary_lease, primary_create;
  char primary_addr[EMBPS_COORD_ADDR_MAX];
  uint32_t primary_epoch;
  int has_epoch;
  uint32_t epoch;      /* P/epoch: the last epoch granted */
  int64_t epoch_mod;   /* its mod revision */
  int64_t revision;    /* of the read */
  embps_coord_sync_t sync; /* P/sync */
  /* P/servers/ other than this one */
  size_t n_servers;
  struct server {
    char addr[EMBPS_COORD_ADDR_MAX];
    uint64_t lsn;
    uint32_t epoch, vacancy;
    int candidate, eligible;
  } servers[64];
  size_t n_ignored; /* keys that did not parse, or past the 64 kept */
} view_t;

struct embps_coord {
  embps_coord_config_t cfg;
  char url[1024], cluster[EMBPS_COORD_NAME_MAX], addr[EMBPS_COORD_ADDR_MAX];
  char prefix[128];  /* P/ (with the slash) */
  char k_primary[160], k_epoch[160], k_servers[160], k_me[320], k_sync[160];
  uint64_t lease_ns, margin_ns, round_ns, renew_ns;
  embps_etcd_t *etcd;

  pthread_t thread;
  int started;
  pthread_mutex_t mu; /* stop, kicked, watch (for wake-ups), status */
  pthread_cond_t cv;
  int stop, kicked;
  embps_etcd_watch_t *watch;
  embps_coord_status_t st;
  /* P/sync asked by the owner (embps_coord_want_sync): mu */
  int sync_asked, sync_degraded;
  uint64_t sync_lsn, sync_gen;

  /* the thread's own */
  int64_t lease;
  uint64_t lease_sent_ns, next_renew_ns;
  uint64_t lease_sent_boot; /* lease_sent_ns on the fence's clock */
  int registered;          /* P/servers/ADDR exists under this lease */
  int promoted;            /* won an epoch and promoted: may hold the fence */
  int posted_eligible;     /* what our candidacy says */
  int was_primary;         /* held the key before: a rejoin follows */
  embps_coord_role_t role;
  uint32_t epoch;
  char following[EMBPS_COORD_ADDR_MAX];
  uint32_t following_epoch;
  int in_election;
  uint32_t vacancy;
  uint64_t round_end_ns, give_up_ns;
  embps_coord_self_t self;
  int etcd_failing;

  atomic_uint_fast64_t fence;

  /* the cluster's primaries (coord.h): map, n_map under mu */
  embps_coord_primary_t *map;
  size_t n_map;
  uint64_t next_map_ns;     /* the thread's: the next read of the cluster */
  char map_base[96];        /* /embps/NAME/member/ */
  int map_warned;           /* a bound was hit (logged once) */
};

static void logf_(embps_coord_t *c, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void logf_(embps_coord_t *c, int level, const char *fmt, ...) {
  if (!c->cfg.log)
    return;
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  c->cfg.log(c->cfg.ctx, level, msg);
}

const char *embps_coord_role_name(embps_coord_role_t r) {
  switch (r) {
  case EMBPS_COORD_STARTING: return "starting";
  case EMBPS_COORD_FOLLOWER: return "follower";
  case EMBPS_COORD_CANDIDATE: return "candidate";
  case EMBPS_COORD_PRIMARY: return "primary";
  }
  return "?";
}

void embps_coord_prefix(const char *cluster, uint32_t member, char *out,
                        size_t cap) {
  snprintf(out, cap, "/embps/%s/member/%" PRIu32, cluster, member);
}

static int name_ok(const char *s) {
  if (!*s)
    return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
          (*s >= '0' && *s <= '9') || *s == '-' || *s == '_' || *s == '.'))
      return 0;
  return 1;
}

int embps_coord_create(const embps_coord_config_t *cfg, embps_coord_t **out,
                       char *err, size_t err_len) {
  *out = NULL;
  if (strlen(cfg->cluster) >= EMBPS_COORD_NAME_MAX || !name_ok(cfg->cluster)) {
    snprintf(err, err_len, "--cluster-name '%s': 1 to %d letters, digits, "
             "'-', '_' or '.'", cfg->cluster, EMBPS_COORD_NAME_MAX - 1);
    return -1;
  }
  if (cfg->member >= EMBPS_COORD_MEMBERS_MAX) {
    snprintf(err, err_len, "--member %" PRIu32 ": below %d", cfg->member,
             EMBPS_COORD_MEMBERS_MAX);
    return -1;
  }
  if (!cfg->addr[0] || strlen(cfg->addr) >= EMBPS_COORD_ADDR_MAX ||
      strchr(cfg->addr, '/')) {
    snprintf(err, err_len, "coordinator: address '%s' is not HOST:PORT",
             cfg->addr);
    return -1;
  }
  if (cfg->lease_ms < 1000 || cfg->lease_ms > 600000) {
    snprintf(err, err_len, "--lease-ms %" PRIu32 ": 1000 to 600000",
             cfg->lease_ms);
    return -1;
  }
  if (strlen(cfg->url) >= sizeof ((embps_coord_t *)0)->url) {
    snprintf(err, err_len, "--coordinator: too long");
    return -1;
  }
  embps_coord_t *c = calloc(1, sizeof *c);
  if (!c) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  c->cfg = *cfg;
  snprintf(c->url, sizeof c->url, "%s", cfg->url);
  snprintf(c->cluster, sizeof c->cluster, "%s", cfg->cluster);
  snprintf(c->addr, sizeof c->addr, "%s", cfg->addr);
  c->cfg.url = c->url;
  c->cfg.cluster = c->cluster;
  c->cfg.addr = c->addr;
  char p[100];
  embps_coord_prefix(c->cluster, cfg->member, p, sizeof p);
  snprintf(c->prefix, sizeof c->prefix, "%s/", p);
  snprintf(c->k_primary, sizeof c->k_primary, "%s/primary", p);
  snprintf(c->k_epoch, sizeof c->k_epoch, "%s/epoch", p);
  snprintf(c->k_servers, sizeof c->k_servers, "%s/servers/", p);
  snprintf(c->k_sync, sizeof c->k_sync, "%s/sync", p);
  snprintf(c->k_me, sizeof c->k_me, "%s%s", c->k_servers, c->addr);
  snprintf(c->map_base, sizeof c->map_base, "/embps/%s/member/", c->cluster);
  c->lease_ns = (uint64_t)cfg->lease_ms * MS;
  c->margin_ns = c->lease_ns / 10 > 100 * MS ? c->lease_ns / 10 : 100 * MS;
  c->round_ns = c->lease_ns / 4 < 1000 * MS ? c->lease_ns / 4 : 1000 * MS;
  c->renew_ns = c->lease_ns / 3;
  if (embps_etcd_create(c->url, cfg->lease_ms / 3, &c->etcd, err, err_len)) {
    free(c);
    return -1;
  }
  pthread_mutex_init(&c->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&c->cv, &ca);
  pthread_condattr_destroy(&ca);
  atomic_init(&c->fence, 0);
  c->role = EMBPS_COORD_STARTING;
  *out = c;
  return 0;
}

uint64_t embps_coord_clock_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int embps_coord_may_write(const embps_coord_t *c) {
  uint64_t f = atomic_load_explicit(&c->fence, memory_order_acquire);
  return f && embps_coord_clock_ns() < f;
}

uint64_t embps_coord_fence_ns(const embps_coord_t *c) {
  return atomic_load_explicit(&c->fence, memory_order_acquire);
}

void embps_coord_status(embps_coord_t *c, embps_coord_status_t *s) {
  pthread_mutex_lock(&c->mu);
  *s = c->st;
  pthread_mutex_unlock(&c->mu);
  s->fence_ns = embps_coord_fence_ns(c);
}

int embps_coord_primaries(embps_coord_t *c, embps_coord_primary_t **out,
                          size_t *n) {
  *out = NULL;
  *n = 0;
  pthread_mutex_lock(&c->mu);
  int rc = 0;
  if (c->n_map) {
    *out = malloc(c->n_map * sizeof **out);
    if (*out) {
      memcpy(*out, c->map, c->n_map * sizeof **out);
      *n = c->n_map;
    } else {
      rc = -ENOMEM;
    }
  }
  pthread_mutex_unlock(&c->mu);
  return rc;
}

void embps_coord_want_sync(embps_coord_t *c, int degraded, uint64_t lsn,
                           uint64_t gen) {
  pthread_mutex_lock(&c->mu);
  c->sync_asked = 1;
  c->sync_degraded = degraded;
  c->sync_lsn = lsn;
  c->sync_gen = gen;
  pthread_mutex_unlock(&c->mu);
  embps_coord_kick(c);
}

int embps_coord_sync_eligible(const embps_coord_sync_t *s, uint32_t last,
                              const char *addr) {
  if (!s->present || !s->degraded || (!s->any_epoch && s->epoch != last))
    return 1;
  return s->addr[0] && !strcmp(s->addr, addr);
}

void embps_coord_kick(embps_coord_t *c) {
  pthread_mutex_lock(&c->mu);
  c->kicked = 1;
  if (c->watch)
    embps_etcd_watch_wakeup(c->watch);
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* ---- the thread ---- */

static void publish_fence(embps_coord_t *c) {
  uint64_t f = 0;
  if (c->promoted && c->lease)
    f = c->lease_sent_boot + c->lease_ns - c->margin_ns;
  atomic_store_explicit(&c->fence, f, memory_order_release);
}

static void etcd_failed(embps_coord_t *c, const char *what) {
  const char *msg = embps_etcd_error(c->etcd);
  pthread_mutex_lock(&c->mu);
  snprintf(c->st.error, sizeof c->st.error, "%s: %s", what, msg);
  pthread_mutex_unlock(&c->mu);
  if (!c->etcd_failing)
    logf_(c, 1, "coordinator: %s: %s", what, msg);
  c->etcd_failing = 1;
}

static void etcd_ok(embps_coord_t *c) {
  if (c->etcd_failing) {
    logf_(c, 0, "coordinator: etcd answers again (%s)",
          embps_etcd_endpoint(c->etcd));
    pthread_mutex_lock(&c->mu);
    c->st.error[0] = 0;
    pthread_mutex_unlock(&c->mu);
  }
  c->etcd_failing = 0;
}

static int grant(embps_coord_t *c) {
  const int64_t ttl_s = (int64_t)((c->lease_ns + 999 * MS) / (1000 * MS));
  int64_t id, ttl;
  const uint64_t sent = embps_now_ns(), sent_boot = embps_coord_clock_ns();
  if (embps_etcd_lease_grant(c->etcd, ttl_s, &id, &ttl)) {
    etcd_failed(c, "lease grant");
    return -1;
  }
  etcd_ok(c);
  c->lease = id;
  c->lease_sent_ns = sent;
  c->lease_sent_boot = sent_boot;
  c->next_renew_ns = sent + c->renew_ns;
  c->registered = 0;
  logf_(c, 0, "coordinator: lease %" PRIx64 " of %" PRId64 " s from %s",
        (uint64_t)id, ttl, embps_etcd_endpoint(c->etcd));
  return 0;
}

/* The lease is gone at etcd: so is every key of ours. */
static void lease_lost(embps_coord_t *c, const char *why) {
  logf_(c, 1, "coordinator: lease %" PRIx64 " lost (%s)%s", (uint64_t)c->lease,
        why, c->promoted ? ": writes refused until the key is read" : "");
  c->lease = 0;
  c->registered = 0;
  if (c->promoted)
    c->was_primary = 1;
  c->promoted = 0;
  publish_fence(c);
}

static void renew(embps_coord_t *c) {
  int64_t ttl;
  const uint64_t sent = embps_now_ns(), sent_boot = embps_coord_clock_ns();
  int rc = embps_etcd_lease_keepalive(c->etcd, c->lease, &ttl);
  if (rc == 0) {
    etcd_ok(c);
    c->lease_sent_ns = sent;
    c->lease_sent_boot = sent_boot;
    c->next_renew_ns = sent + c->renew_ns;
    publish_fence(c);
    pthread_mutex_lock(&c->mu);
    c->st.renewals++;
    pthread_mutex_unlock(&c->mu);
    return;
  }
  pthread_mutex_lock(&c->mu);
  c->st.renewal_failures++;
  pthread_mutex_unlock(&c->mu);
  if (rc == -ENOENT) {
    lease_lost(c, "expired at etcd");
    return;
  }
  /* etcd unreachable: the fence runs out by itself; the lease is kept
     and renewed once etcd answers (a restarted etcd restores leases with
     a fresh TTL), dropped only when etcd says it is gone */
  etcd_failed(c, "lease renewal");
  c->next_renew_ns = embps_now_ns() + c->lease_ns / 10;
}

/* Writes P/servers/ADDR (under the lease): a candidate for the election
 * after epoch vacancy (0: the first one), or just present. */
static int post_me(embps_coord_t *c, int candidate, uint32_t vacancy) {
  embps_jw_t w;
  embps_jw_init(&w, 1024);
  embps_jw_obj(&w);
  embps_jw_key(&w, "addr");
  embps_jw_str(&w, c->addr, strlen(c->addr));
  embps_jw_key(&w, "lsn");
  embps_jw_int64(&w, (int64_t)c->self.lsn);
  embps_jw_key(&w, "epoch");
  embps_jw_int64(&w, c->self.epoch);
  embps_jw_key(&w, "candidate");
  embps_jw_bool(&w, candidate);
  embps_jw_key(&w, "vacancy");
  embps_jw_int64(&w, vacancy);
  embps_jw_key(&w, "eligible");
  embps_jw_bool(&w, candidate && c->self.eligible);
  c->posted_eligible = candidate && c->self.eligible;
  embps_jw_obj_end(&w);
  char *v;
  size_t len;
  if (embps_jw_finish(&w, &v, &len))
    return -1;
  int rc = embps_etcd_put(c->etcd, c->k_me, strlen(c->k_me), v, len, c->lease,
                          NULL);
  free(v);
  if (rc) {
    etcd_failed(c, "posting this server");
    if (rc == -ENOENT)
      lease_lost(c, "gone when posting");
    return -1;
  }
  c->registered = 1;
  return 0;
}

/* An int64 member of a value object within [0, max]. */
static int member_u(const embps_json_t *d, const char *key, uint64_t max,
                    uint64_t *out) {
  int64_t v;
  if (embps_json_int64(d, embps_json_get(d, 0, key), &v) || v < 0 ||
      (uint64_t)v > max)
    return -1;
  *out = (uint64_t)v;
  return 0;
}

/* {"addr","epoch","lsn",...} of a key's value. */
static int parse_value(const embps_etcd_kv_t *kv, char *addr, uint32_t *epoch,
                       uint64_t *lsn, uint32_t *vacancy, int *candidate,
                       int *eligible) {
  embps_json_t d;
  char err[128];
  if (embps_json_parse(&d, kv->value, kv->value_len, 64, err, sizeof err))
    return -1;
  uint64_t e = 0, v = 0;
  int rc = 0;
  if (embps_json_string(&d, embps_json_get(&d, 0, "addr"), addr,
                        EMBPS_COORD_ADDR_MAX, NULL) ||
      member_u(&d, "epoch", UINT32_MAX, &e) ||
      member_u(&d, "lsn", INT64_MAX, lsn))
    rc = -1;
  *epoch = (uint32_t)e;
  if (!rc && vacancy) {
    if (member_u(&d, "vacancy", UINT32_MAX, &v) ||
        embps_json_bool(&d, embps_json_get(&d, 0, "candidate"), candidate) ||
        embps_json_bool(&d, embps_json_get(&d, 0, "eligible"), eligible))
      rc = -1;
    *vacancy = (uint32_t)v;
  }
  embps_json_free(&d);
  return rc;
}

/* P/sync's value: {"epoch","degraded","lsn","addr"}. 0 or -1. */
static int parse_sync(const embps_etcd_kv_t *kv, embps_coord_sync_t *s) {
  embps_json_t d;
  char err[128];
  memset(s, 0, sizeof *s);
  if (embps_json_parse(&d, kv->value, kv->value_len, 16, err, sizeof err))
    return -1;
  uint64_t e = 0;
  int rc = 0;
  if (member_u(&d, "epoch", UINT32_MAX, &e) ||
      member_u(&d, "lsn", INT64_MAX, &s->lsn) ||
      embps_json_bool(&d, embps_json_get(&d, 0, "degraded"), &s->degraded) ||
      embps_json_string(&d, embps_json_get(&d, 0, "addr"), s->addr,
                        sizeof s->addr, NULL))
    rc = -1;
  s->epoch = (uint32_t)e;
  embps_json_free(&d);
  return rc;
}

int embps_coord_read_primary(embps_etcd_t *e, const char *cluster,
                             uint32_t member, char *addr, size_t cap,
                             uint32_t *epoch) {
  char key[160];
  embps_coord_prefix(cluster, member, key, sizeof key - 8);
  strcat(key, "/primary");
  embps_etcd_kvs_t kvs;
  int rc = embps_etcd_range(e, key, strlen(key), 0, &kvs);
  if (rc)
    return rc;
  char a[EMBPS_COORD_ADDR_MAX];
  uint64_t lsn;
  rc = 0;
  if (kvs.n) {
    rc = parse_value(&kvs.v[0], a, epoch, &lsn, NULL, NULL, NULL) ? -EPROTO
                                                                  : 1;
    if (rc == 1)
      snprintf(addr, cap, "%s", a);
  }
  embps_etcd_kvs_free(&kvs);
  return rc;
}

static int read_slot(embps_coord_t *c, view_t *v) {
  memset(v, 0, sizeof *v);
  embps_etcd_kvs_t kvs;
  if (embps_etcd_range(c->etcd, c->prefix, strlen(c->prefix), 1, &kvs)) {
    etcd_failed(c, "reading the slot");
    return -1;
  }
  etcd_ok(c);
  v->revision = kvs.revision;
  const size_t ls = strlen(c->k_servers);
  for (size_t i = 0; i < kvs.n; i++) {
    const embps_etcd_kv_t *kv = &kvs.v[i];
    uint64_t lsn;
    if (!strcmp(kv->key, c->k_primary)) {
      if (parse_value(kv, v->primary_addr, &v->primary_epoch, &lsn, NULL,
                      NULL, NULL)) {
        logf_(c, 1, "coordinator: %s holds no address and epoch: ignored "
              "until it changes", c->k_primary);
        v->primary_addr[0] = 0;
      }
      v->has_primary = 1;
      v->primary_lease = kv->lease;
      v->primary_create = kv->create_rev;
    } else if (!strcmp(kv->key, c->k_sync)) {
      if (parse_sync(kv, &v->sync)) {
        /* only this code writes it: safe side, no follower runs after
           any epoch while it says nothing readable */
        logf_(c, 1, "coordinator: %s is not {\"epoch\",\"degraded\","
              "\"lsn\",\"addr\"}: taken as degraded (no follower is "
              "eligible) until it changes", c->k_sync);
        memset(&v->sync, 0, sizeof v->sync);
        v->sync.degraded = 1;
        v->sync.any_epoch = 1;
      }
      v->sync.present = 1;
      v->sync.mod = kv->mod_rev;
    } else if (!strcmp(kv->key, c->k_epoch)) {
      uint64_t e = 0;
      char txt[24];
      snprintf(txt, sizeof txt, "%.*s", (int)(kv->value_len < 23 ? kv->value_len : 23),
               kv->value);
      char *end;
      errno = 0;
      e = strtoull(txt, &end, 10);
      if (errno || *end || end == txt || e > UINT32_MAX) {
        logf_(c, 1, "coordinator: %s is not an epoch: taken as 0", c->k_epoch);
        e = 0;
      }
      v->has_epoch = 1;
      v->epoch = (uint32_t)e;
      v->epoch_mod = kv->mod_rev;
    } else if (kv->key_len > ls && !strncmp(kv->key, c->k_servers, ls) &&
               strcmp(kv->key, c->k_me)) {
      struct server *s = &v->servers[v->n_servers];
      if (v->n_servers == sizeof v->servers / sizeof v->servers[0] ||
          parse_value(kv, s->addr, &s->epoch, &s->lsn, &s->vacancy,
                      &s->candidate, &s->eligible)) {
        v->n_ignored++;
        continue;
      }
      v->n_servers++;
    }
  }
  embps_etcd_kvs_free(&kvs);
  return 0;
}

/* ---- the cluster's primaries ---- */

/* The slot of a key under map_base ("I/..."): its index, *rest the text
 * after "I/"; -1 for a key of no slot (not digits then '/', or past
 * UINT32_MAX). */
static int64_t map_slot(const char *k, size_t len, const char **rest) {
  size_t i = 0;
  uint64_t v = 0;
  while (i < len && i < 11 && k[i] >= '0' && k[i] <= '9')
    v = v * 10 + (uint64_t)(k[i++] - '0');
  if (i == 0 || i == len || k[i] != '/' || v > UINT32_MAX)
    return -1;
  *rest = k + i + 1;
  return (int64_t)v;
}

/* Reads every slot's P/primary (bounded, coord.h) into slots[] (seen[]
 * marks a slot with any key). 0 when the whole prefix was read, 1 when a
 * bound cut it, -1 when etcd failed (logged). */
static int map_read(embps_coord_t *c, embps_coord_primary_t *slots,
                    uint8_t *seen, size_t *beyond) {
  const size_t bl = strlen(c->map_base);
  uint8_t end[sizeof c->map_base];
  size_t end_len;
  embps_etcd_prefix_end(c->map_base, bl, end, &end_len);
  char from[EMBPS_ETCD_KEY_MAX];
  size_t from_len = bl;
  memcpy(from, c->map_base, bl);
  int64_t rev = 0;
  for (int page = 0; page < EMBPS_COORD_MAP_PAGES; page++) {
    embps_etcd_kvs_t kvs;
    if (embps_etcd_range_between(c->etcd, from, from_len, end, end_len, rev,
                                 &kvs)) {
      etcd_failed(c, "reading the cluster's primaries");
      return -1;
    }
    if (!rev)
      rev = kvs.revision;
    for (size_t i = 0; i < kvs.n; i++) {
      const embps_etcd_kv_t *kv = &kvs.v[i];
      const char *rest;
      int64_t m = kv->key_len > bl
                      ? map_slot(kv->key + bl, kv->key_len - bl, &rest)
                      : -1;
      if (m < 0)
        continue;
      if (m >= EMBPS_COORD_MAP_MAX) {
        ++*beyond;
        continue;
      }
      seen[m] = 1;
      slots[m].member = (uint32_t)m;
      if (strcmp(rest, "primary"))
        continue;
      uint64_t lsn;
      if (parse_value(kv, slots[m].addr, &slots[m].epoch, &lsn, NULL, NULL,
                      NULL))
        slots[m].addr[0] = 0; /* no address: as good as none */
    }
    const embps_etcd_kv_t *last = kvs.n ? &kvs.v[kvs.n - 1] : NULL;
    int more = kvs.more && last && last->key_len + 1 <= sizeof from;
    if (more) { /* the next page starts just after the last key */
      memcpy(from, last->key, last->key_len);
      from[last->key_len] = 0;
      from_len = last->key_len + 1;
    }
    embps_etcd_kvs_free(&kvs);
    if (!more)
      return 0;
  }
  return 1;
}

/* Reads the cluster's primaries and swaps the copy in (coord.h). */
static void map_refresh(embps_coord_t *c) {
  embps_coord_primary_t *slots = calloc(EMBPS_COORD_MAP_MAX, sizeof *slots);
  uint8_t *seen = calloc(EMBPS_COORD_MAP_MAX, 1);
  size_t beyond = 0, n = 0;
  int rc = slots && seen ? map_read(c, slots, seen, &beyond) : -1;
  if (rc >= 0) {
    for (size_t i = 0; i < EMBPS_COORD_MAP_MAX; i++)
      if (seen[i])
        slots[n++] = slots[i];
    if ((rc || beyond) && !c->map_warned) {
      c->map_warned = 1;
      logf_(c, 1, "coordinator: %s holds %s: the primaries of slots 0 to %d "
            "only are known", c->map_base, rc ? "more keys than are read"
            : "slots past the member limit", EMBPS_COORD_MAP_MAX - 1);
    }
    embps_coord_primary_t *old;
    pthread_mutex_lock(&c->mu);
    old = c->map;
    c->map = slots;
    c->n_map = n;
    pthread_mutex_unlock(&c->mu);
    slots = old;
  }
  free(slots);
  free(seen);
}

/* Whether the copy's entry for this server's slot differs from what the
 * read of the slot (v) shows. */
static int map_own_stale(embps_coord_t *c, const view_t *v) {
  const char *addr = v->has_primary ? v->primary_addr : "";
  const uint32_t epoch = v->has_primary ? v->primary_epoch : 0;
  int stale = 1;
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < c->n_map; i++)
    if (c->map[i].member == c->cfg.member)
      stale = strcmp(c->map[i].addr, addr) ||
              (addr[0] && c->map[i].epoch != epoch);
  pthread_mutex_unlock(&c->mu);
  return stale;
}

static void set_status(embps_coord_t *c) {
  pthread_mutex_lock(&c->mu);
  c->st.role = c->role;
  c->st.epoch = c->role == EMBPS_COORD_PRIMARY ? c->epoch : c->following_epoch;
  snprintf(c->st.primary, sizeof c->st.primary, "%s",
           c->role == EMBPS_COORD_PRIMARY     ? c->addr
           : c->role == EMBPS_COORD_FOLLOWER ? c->following
                                             : "");
  pthread_mutex_unlock(&c->mu);
}

/* We hold P/primary of epoch e: a fresh fence, then the promotion. The
 * fence is published first so that writes go through the moment the
 * owner takes them (its role changes inside promote): the owner accepts
 * none before promote returns. */
static void become_primary(embps_coord_t *c, uint32_t e) {
  c->in_election = 0;
  pthread_mutex_lock(&c->mu); /* a new epoch starts strict */
  c->sync_asked = 0;
  pthread_mutex_unlock(&c->mu);
  c->epoch = e;
  c->promoted = 1;
  renew(c); /* a fresh fence (the last one stands if etcd does not answer) */
  publish_fence(c);
  if (!c->promoted) /* the lease was gone at renewal: the key with it */
    return;
  if (c->cfg.promote(c->cfg.ctx, e)) {
    logf_(c, 1, "coordinator: promotion to epoch %" PRIu32 " failed: giving "
          "the key back", e);
    c->promoted = 0;
    publish_fence(c);
    embps_etcd_lease_revoke(c->etcd, c->lease);
    c->lease = 0;
    c->registered = 0;
    return;
  }
  c->was_primary = 0;
  c->role = EMBPS_COORD_PRIMARY;
  c->following[0] = 0;
  c->following_epoch = e;
  pthread_mutex_lock(&c->mu);
  c->st.elections_won++;
  pthread_mutex_unlock(&c->mu);
  logf_(c, 0, "coordinator: primary of %s epoch %" PRIu32 " (LSN %" PRIu64
        ")", c->prefix, e, c->self.lsn);
}

/* (lsn, lower address) order of candidates: whether a beats b. */
static int better(uint64_t a_lsn, const char *a, uint64_t b_lsn,
                  const char *b) {
  return a_lsn != b_lsn ? a_lsn > b_lsn : strcmp(a, b) < 0;
}

static void election(embps_coord_t *c, const view_t *v) {
  const uint64_t now = embps_now_ns();
  const uint32_t last = v->has_epoch ? v->epoch : 0;
  const int reposted = c->in_election && c->vacancy == last &&
                       c->posted_eligible &&
                       !embps_coord_sync_eligible(&v->sync, last, c->addr);
  if (!c->in_election || c->vacancy != last || now >= c->give_up_ns ||
      reposted) {
    c->cfg.self(c->cfg.ctx, last, &c->self);
    if (!embps_coord_sync_eligible(&v->sync, last, c->addr)) {
      if (c->self.eligible)
        logf_(c, 1, "coordinator: %s says epoch %" PRIu32 " was degraded "
              "(its primary %s acknowledged writes no follower may hold): "
              "not eligible; only that server may be elected",
              c->k_sync, last, v->sync.addr[0] ? v->sync.addr : "?");
      c->self.eligible = 0;
    }
    if (post_me(c, 1, last))
      return;
    c->in_election = 1;
    c->vacancy = last;
    c->round_end_ns = now + c->round_ns;
    c->give_up_ns = c->round_end_ns + 2 * c->round_ns + c->lease_ns;
    logf_(c, 0, "coordinator: no primary after epoch %" PRIu32 ": candidate "
          "with LSN %" PRIu64 "%s", last, c->self.lsn,
          c->self.eligible ? "" : " (not eligible: will not campaign)");
    return;
  }
  size_t posted = 0;
  const char *best = c->self.eligible ? c->addr : NULL;
  uint64_t best_lsn = c->self.lsn;
  uint32_t top_epoch = last > c->self.epoch ? last : c->self.epoch;
  for (size_t i = 0; i < v->n_servers; i++) {
    const struct server *s = &v->servers[i];
    if (!s->candidate || s->vacancy != last)
      continue;
    posted++;
    if (s->epoch > top_epoch)
      top_epoch = s->epoch;
    if (s->eligible && (!best || better(s->lsn, s->addr, best_lsn, best))) {
      best = s->addr;
      best_lsn = s->lsn;
    }
  }
  if (posted < v->n_servers + v->n_ignored && now < c->round_end_ns)
    return; /* someone live has not posted yet: wait out the round */
  if (best != c->addr)
    return; /* a better one, or no one eligible: wait for the key */
  if (!embps_coord_sync_eligible(&v->sync, last, c->addr))
    return; /* P/sync changed since we posted: re-posted next step */
  if (top_epoch == UINT32_MAX) {
    logf_(c, 1, "coordinator: epochs exhausted");
    return;
  }
  const uint32_t e = top_epoch + 1;
  char val[EMBPS_COORD_ADDR_MAX + 96], ebuf[16];
  int vlen = snprintf(val, sizeof val,
                      "{\"addr\":\"%s\",\"epoch\":\"%" PRIu32 "\",\"lsn\":\"%"
                      PRIu64 "\"}", c->addr, e, c->self.lsn);
  int elen = snprintf(ebuf, sizeof ebuf, "%" PRIu32, e);
  embps_etcd_cmp_t cmp[4] = {
      {.key = c->k_primary, .key_len = strlen(c->k_primary),
       .target = EMBPS_ETCD_CREATE, .result = EMBPS_ETCD_EQUAL, .number = 0},
      {.key = c->k_epoch, .key_len = strlen(c->k_epoch),
       .target = v->has_epoch ? EMBPS_ETCD_MOD : EMBPS_ETCD_CREATE,
       .result = EMBPS_ETCD_EQUAL, .number = v->has_epoch ? v->epoch_mod : 0},
      {.key = c->k_servers, .key_len = strlen(c->k_servers), .prefix = 1,
       .target = EMBPS_ETCD_MOD, .result = EMBPS_ETCD_LESS,
       .number = v->revision + 1},
      /* P/sync as read: a degradation recorded since makes this fail */
      {.key = c->k_sync, .key_len = strlen(c->k_sync),
       .target = EMBPS_ETCD_MOD, .result = EMBPS_ETCD_LESS,
       .number = v->revision + 1}};
  embps_etcd_op_t ops[2] = {
      {.kind = EMBPS_ETCD_OP_PUT, .key = c->k_primary,
       .key_len = strlen(c->k_primary), .value = val, .value_len = (size_t)vlen,
       .lease = c->lease},
      {.kind = EMBPS_ETCD_OP_PUT, .key = c->k_epoch,
       .key_len = strlen(c->k_epoch), .value = ebuf, .value_len = (size_t)elen}};
  int won = 0;
  if (embps_etcd_txn(c->etcd, cmp, 4, ops, 2, NULL, 0, &won, NULL)) {
    etcd_failed(c, "campaign");
    return; /* applied or not: the next read tells (our lease on the key) */
  }
  if (won)
    become_primary(c, e);
}

/* Writes P/sync as the owner asked (coord.h "Degraded epochs"), in one
 * transaction conditioned on P/primary being still the key we created;
 * a degradation recorded is told to the owner. v: a read showing we hold
 * the key. */
static void record_sync(embps_coord_t *c, const view_t *v) {
  pthread_mutex_lock(&c->mu);
  const int asked = c->sync_asked, degraded = c->sync_degraded;
  const uint64_t lsn = c->sync_lsn, gen = c->sync_gen;
  pthread_mutex_unlock(&c->mu);
  if (!asked || !c->promoted)
    return;
  char val[EMBPS_COORD_ADDR_MAX + 128];
  int vlen = snprintf(val, sizeof val,
                      "{\"epoch\":%" PRIu32 ",\"degraded\":%s,\"lsn\":%"
                      PRIu64 ",\"addr\":\"%s\"}", c->epoch,
                      degraded ? "true" : "false", lsn, c->addr);
  embps_etcd_cmp_t cmp[1] = {
      {.key = c->k_primary, .key_len = strlen(c->k_primary),
       .target = EMBPS_ETCD_CREATE, .result = EMBPS_ETCD_EQUAL,
       .number = v->primary_create}};
  embps_etcd_op_t ops[1] = {
      {.kind = EMBPS_ETCD_OP_PUT, .key = c->k_sync,
       .key_len = strlen(c->k_sync), .value = val, .value_len = (size_t)vlen}};
  int won = 0;
  if (embps_etcd_txn(c->etcd, cmp, 1, ops, 1, NULL, 0, &won, NULL)) {
    etcd_failed(c, "recording the synchronous state");
    return; /* asked again at the next step */
  }
  if (!won) {
    logf_(c, 1, "coordinator: %s is no longer ours: %s not written",
          c->k_primary, c->k_sync);
    return; /* the next read shows who holds it */
  }
  pthread_mutex_lock(&c->mu);
  if (c->sync_gen == gen) /* else asked again meanwhile: write that too */
    c->sync_asked = 0;
  pthread_mutex_unlock(&c->mu);
  logf_(c, degraded, "coordinator: %s: epoch %" PRIu32 " %s (LSN %" PRIu64
        ")", c->k_sync, c->epoch,
        degraded ? "degraded: no follower is eligible until it is strict "
                   "again"
                 : "strict: its followers hold every acknowledged record",
        lsn);
  if (degraded && c->cfg.sync_recorded)
    c->cfg.sync_recorded(c->cfg.ctx, gen);
}

static void decide(embps_coord_t *c, const view_t *v) {
  if (v->has_primary && v->primary_lease == c->lease) {
    if (!c->promoted) /* won, but the answer was lost, or promotion failed */
      become_primary(c, v->primary_epoch);
    record_sync(c, v);
    return;
  }
  if (v->has_primary && !strcmp(v->primary_addr, c->addr)) {
    /* our address under another lease: this server's previous life
       (addresses are unique, and we serve on ours now, so that process
       is gone): end its lease rather than wait for it */
    logf_(c, 1, "coordinator: %s held by a previous run of this server "
          "(lease %" PRIx64 "): ending that lease", c->k_primary,
          (uint64_t)v->primary_lease);
    if (c->promoted) {
      c->promoted = 0;
      publish_fence(c);
    }
    c->was_primary = 1;
    c->role = EMBPS_COORD_CANDIDATE;
    if (embps_etcd_lease_revoke(c->etcd, v->primary_lease) &&
        embps_etcd_error(c->etcd)[0])
      etcd_failed(c, "ending the previous lease");
    return;
  }
  if (v->has_primary) {
    if (c->promoted) {
      c->promoted = 0;
      c->was_primary = 1;
      publish_fence(c);
      pthread_mutex_lock(&c->mu);
      c->st.demotions++;
      pthread_mutex_unlock(&c->mu);
      logf_(c, 1, "coordinator: %s is primary of epoch %" PRIu32 " now: "
            "this server follows it", v->primary_addr, v->primary_epoch);
    }
    c->in_election = 0;
    c->role = EMBPS_COORD_FOLLOWER;
    if (v->primary_addr[0] && (strcmp(c->following, v->primary_addr) ||
                               c->following_epoch != v->primary_epoch)) {
      snprintf(c->following, sizeof c->following, "%s", v->primary_addr);
      c->following_epoch = v->primary_epoch;
      c->cfg.follow(c->cfg.ctx, c->following, c->following_epoch,
                    c->was_primary);
      c->was_primary = 0;
    }
    return;
  }
  if (c->promoted) { /* our key is gone though our lease lives: deleted */
    logf_(c, 1, "coordinator: %s vanished: writes refused, electing again",
          c->k_primary);
    c->promoted = 0;
    c->was_primary = 1;
    publish_fence(c);
  }
  c->role = EMBPS_COORD_CANDIDATE;
  c->following[0] = 0;
  election(c, v);
}

static void ensure_watch(embps_coord_t *c, int64_t from) {
  if (c->watch)
    return;
  embps_etcd_watch_t *w;
  if (embps_etcd_watch_open(c->etcd, c->prefix, strlen(c->prefix), 1, from,
                            &w)) {
    etcd_failed(c, "watching the slot");
    return;
  }
  pthread_mutex_lock(&c->mu);
  c->watch = w;
  pthread_mutex_unlock(&c->mu);
}

static void close_watch(embps_coord_t *c) {
  pthread_mutex_lock(&c->mu);
  embps_etcd_watch_t *w = c->watch;
  c->watch = NULL;
  pthread_mutex_unlock(&c->mu);
  embps_etcd_watch_close(w);
}

static void step(embps_coord_t *c) {
  if (!c->lease) {
    if (grant(c))
      return;
  } else if (embps_now_ns() >= c->next_renew_ns) {
    renew(c);
    if (!c->lease)
      return;
  }
  if (!c->registered) {
    c->cfg.self(c->cfg.ctx, 0, &c->self);
    if (post_me(c, 0, 0))
      return;
  }
  view_t v;
  if (read_slot(c, &v))
    return;
  ensure_watch(c, v.revision + 1);
  decide(c, &v);
  const uint64_t now = embps_now_ns();
  if (now >= c->next_map_ns || map_own_stale(c, &v)) {
    c->next_map_ns = now + c->renew_ns;
    map_refresh(c);
  }
}

/* Waits for a change of the slot, a kick, stop, or the next step. */
static void wait_next(embps_coord_t *c) {
  const uint64_t now = embps_now_ns();
  uint64_t until = c->lease ? c->next_renew_ns : now + c->lease_ns / 10;
  if (c->role == EMBPS_COORD_CANDIDATE) {
    uint64_t soon = now + (c->round_ns / 5 > 20 * MS ? c->round_ns / 5 : 20 * MS);
    if (soon < until)
      until = soon;
  } else if (c->lease && now + c->renew_ns < until) {
    until = now + c->renew_ns;
  }
  if (until <= now)
    return;
  pthread_mutex_lock(&c->mu);
  int go = c->stop || c->kicked;
  c->kicked = 0;
  embps_etcd_watch_t *w = c->watch;
  pthread_mutex_unlock(&c->mu);
  if (go)
    return;
  if (w) {
    embps_etcd_event_t ev;
    int rc = embps_etcd_watch_next(w, (uint32_t)((until - now) / MS), &ev);
    if (rc == 1) {
      embps_etcd_event_free(&ev);
      while (embps_etcd_watch_next(w, 0, &ev) == 1) /* take what came */
        embps_etcd_event_free(&ev);
    } else if (rc < 0) {
      logf_(c, 1, "coordinator: %s: watching again", embps_etcd_watch_error(w));
      close_watch(c);
    }
    return;
  }
  struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
                        .tv_nsec = (long)(until % 1000000000u)};
  pthread_mutex_lock(&c->mu);
  while (!c->stop && !c->kicked &&
         pthread_cond_timedwait(&c->cv, &c->mu, &ts) != ETIMEDOUT) {
  }
  c->kicked = 0;
  pthread_mutex_unlock(&c->mu);
}

static void *run(void *arg) {
  embps_coord_t *c = arg;
  for (;;) {
    pthread_mutex_lock(&c->mu);
    int stop = c->stop;
    pthread_mutex_unlock(&c->mu);
    if (stop)
      break;
    step(c);
    set_status(c);
    wait_next(c);
  }
  return NULL;
}

int embps_coord_start(embps_coord_t *c) {
  int rc = pthread_create(&c->thread, NULL, run, c);
  if (rc)
    return -rc;
  c->started = 1;
  return 0;
}

void embps_coord_destroy(embps_coord_t *c, int resign) {
  if (!c)
    return;
  if (c->started) {
    pthread_mutex_lock(&c->mu);
    c->stop = 1;
    if (c->watch)
      embps_etcd_watch_wakeup(c->watch);
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);
  }
  c->promoted = 0;
  publish_fence(c);
  if (resign && c->lease) {
    if (embps_etcd_lease_revoke(c->etcd, c->lease))
      logf_(c, 1, "coordinator: could not give the lease back (%s): it "
            "ends by itself", embps_etcd_error(c->etcd));
    else
      logf_(c, 0, "coordinator: lease given back");
  }
  close_watch(c);
  free(c->map);
  embps_etcd_destroy(c->etcd);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
