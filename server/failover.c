/* failover.c - see failover.h. The coordinator's callbacks run on its
 * thread: promotion waits there for the apply thread (follow.h); a
 * retarget only hands the follower thread an address; a rejoin replaces
 * the process (execv), which ends every thread at once. */
#define _GNU_SOURCE
#include "failover.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "apply.h"
#include "etcd.h"
#include "feed.h"
#include "follow.h"
#include "log.h"
#include "util.h"

struct embps_failover {
  embps_server_t *srv;
  embps_coord_t *coord;
  char addr[EMBPS_ADDR_MAX]; /* advertised */
  int port;
  atomic_int rejoining;
};

/* HOST:PORT with HOST in brackets when it is an IPv6 address. */
static void join_hostport(const char *host, int port, char *out, size_t cap) {
  snprintf(out, cap, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* The address others reach this server at: --advertise, else --listen's
 * host (the host name for a wildcard) and port (0: not known yet, ""). */
static void advertised(const embps_server_config_t *cfg, int port, char *out,
                       size_t cap) {
  if (cfg->advertise[0]) {
    snprintf(out, cap, "%s", cfg->advertise);
    return;
  }
  out[0] = 0;
  if (!port)
    return;
  const char *h = cfg->listen_host;
  char name[256];
  if (!h[0] || !strcmp(h, "0.0.0.0") || !strcmp(h, "::") ||
      !strcmp(h, "[::]")) {
    if (gethostname(name, sizeof name))
      snprintf(name, sizeof name, "localhost");
    name[sizeof name - 1] = 0;
    h = name;
  }
  join_hostport(h, port, out, cap);
}

/* ---- a demoted server starts over ---- */

static void rejoin(embps_server_t *srv, const char *why) {
  embps_failover_t *f = srv->failover;
  if (!f || atomic_exchange(&f->rejoining, 1))
    return;
  char **argv = srv->cfg.argv;
  if (!argv) {
    LOG_ERROR("coordinator: %s: this server must start again to rejoin (it "
              "is embedded and cannot execute itself): restart it", why);
    return;
  }
  size_t n = 0;
  while (argv[n])
    n++;
  char **v = calloc(n + 3, sizeof *v);
  char listen[EMBPS_ADDR_MAX + 8];
  if (!v) {
    LOG_ERROR("coordinator: %s: out of memory to rejoin: restart it", why);
    return;
  }
  memcpy(v, argv, n * sizeof *v);
  /* the same port: its address is what the others know (last flag wins) */
  join_hostport(srv->cfg.listen_host, f->port, listen, sizeof listen);
  v[n] = "--listen";
  v[n + 1] = listen;
  LOG_WARN("coordinator: %s: rejoining as a follower: executing itself "
           "again on %s (its log is cut where it leaves the primary's "
           "history)", why, listen);
  fflush(stdout);
  fflush(stderr);
  /* descriptors not meant to cross (log segments, etcd connections) */
  close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
  execv("/proc/self/exe", v);
  LOG_ERROR("coordinator: cannot execute itself again to rejoin (%s): "
            "restart it", strerror(errno));
  free(v);
}

/* ---- the coordinator's callbacks ---- */

static void on_self(void *ctx, uint32_t last_epoch, embps_coord_self_t *out) {
  embps_failover_t *f = ctx;
  embps_server_t *srv = f->srv;
  out->lsn = embps_apply_lsn(srv->apply);
  out->epoch = embps_feed_epoch(srv->feed);
  /* no epoch yet, or a history reaching the last one granted; and not
     a follower whose primary had to send it a copy of its state, until
     that copy is in and caught up (its history is its primary's, its
     tables are not yet) */
  out->eligible = !atomic_load(&f->rejoining) &&
                  !embps_follow_copying(srv) &&
                  (last_epoch == 0 || out->epoch >= last_epoch);
}

static int on_promote(void *ctx, uint32_t epoch) {
  embps_failover_t *f = ctx;
  LOG_INFO("coordinator: elected primary of member %u (epoch %u): "
           "promoting", f->srv->cfg.member, epoch);
  return embps_follow_promote_to(f->srv, epoch);
}

static void on_follow(void *ctx, const char *addr, uint32_t epoch,
                      int was_primary) {
  embps_failover_t *f = ctx;
  embps_server_t *srv = f->srv;
  if (was_primary || atomic_load(&srv->role) == EMBPS_ROLE_PRIMARY) {
    char why[EMBPS_ADDR_MAX + 64];
    snprintf(why, sizeof why, "%s is primary of epoch %u now", addr, epoch);
    rejoin(srv, why);
    return;
  }
  LOG_INFO("coordinator: %s is primary of member %u (epoch %u)", addr,
           srv->cfg.member, epoch);
  embps_follow_retarget(srv, addr, epoch);
}

/* The feed's recorder (feed.h "Degrading"): P/sync, written by the
 * coordinator's thread (coord.h "Degraded epochs"). */
static void on_record(void *ctx, int degraded, uint64_t lsn, uint64_t gen) {
  embps_failover_t *f = ctx;
  if (f->coord)
    embps_coord_want_sync(f->coord, degraded, lsn, gen);
}

static void on_sync_recorded(void *ctx, uint64_t gen) {
  embps_failover_t *f = ctx;
  embps_feed_recorded(f->srv->feed, gen);
}

static void on_log(void *ctx, int level, const char *msg) {
  (void)ctx;
  if (level)
    LOG_WARN("%s", msg);
  else
    LOG_INFO("%s", msg);
}

/* ---- lifecycle ---- */

int embps_failover_starts_following(const embps_server_t *srv) {
  return srv->cfg.follow[0] || srv->cfg.coordinator[0];
}

int embps_failover_prepare(embps_server_t *srv) {
  embps_server_config_t *cfg = &srv->cfg;
  if (!cfg->coordinator[0])
    return 0;
  embps_failover_t *f = calloc(1, sizeof *f);
  if (!f) {
    LOG_ERROR("out of memory");
    return -1;
  }
  f->srv = srv;
  advertised(cfg, cfg->listen_port, f->addr, sizeof f->addr);
  char err[512];
  embps_etcd_t *e;
  if (embps_etcd_create(cfg->coordinator, cfg->lease_ms / 3, &e, err,
                        sizeof err)) {
    LOG_ERROR("%s", err);
    free(f);
    return -1;
  }
  /* who is primary now: for two leases, etcd may be starting too */
  const uint64_t until = embps_now_ns() + 2ull * cfg->lease_ms * 1000000u;
  char addr[EMBPS_ADDR_MAX] = "";
  uint32_t epoch = 0;
  int rc, logged = 0;
  while ((rc = embps_coord_read_primary(e, cfg->cluster_name, cfg->member,
                                        addr, sizeof addr, &epoch)) < 0 &&
         rc != -EPROTO && embps_now_ns() < until) {
    if (!logged++)
      LOG_WARN("coordinator: %s; asking again", embps_etcd_error(e));
    struct timespec ts = {0, 200 * 1000000L};
    nanosleep(&ts, NULL);
  }
  if (rc == 1 && strcmp(addr, f->addr)) {
    snprintf(cfg->follow, sizeof cfg->follow, "%s", addr);
    LOG_INFO("coordinator: %s is primary of member %u (epoch %u): starting "
             "as its follower", addr, cfg->member, epoch);
  } else if (rc >= 0) {
    LOG_INFO("coordinator: no primary of member %u%s: starting as a "
             "follower of no one; the election decides", cfg->member,
             rc == 1 ? " but a previous run of this server" : " yet");
  } else {
    LOG_WARN("coordinator: who is primary of member %u is not known (%s): "
             "starting as a follower of no one", cfg->member,
             embps_etcd_error(e));
  }
  embps_etcd_destroy(e);
  srv->failover = f;
  srv->rejoin = rejoin;
  return 0;
}

int embps_failover_join(void *ctx, const embps_history_t *h, uint64_t last,
                        uint64_t *keep, char *err, size_t err_len) {
  embps_server_t *srv = ctx;
  if (srv->cfg.follow[0])
    return embps_follow_join(ctx, h, last, keep, err, err_len);
  *keep = last; /* no primary to ask: the log as it is */
  return 0;
}

int embps_failover_start(embps_server_t *srv, int port) {
  embps_failover_t *f = srv->failover;
  if (!f)
    return 0;
  f->port = port;
  advertised(&srv->cfg, port, f->addr, sizeof f->addr);
  const embps_coord_config_t cc = {
      .url = srv->cfg.coordinator, .cluster = srv->cfg.cluster_name,
      .member = srv->cfg.member, .addr = f->addr,
      .lease_ms = srv->cfg.lease_ms, .ctx = f, .self = on_self,
      .promote = on_promote, .follow = on_follow,
      .sync_recorded = on_sync_recorded, .log = on_log};
  char err[512];
  if (embps_coord_create(&cc, &f->coord, err, sizeof err)) {
    LOG_ERROR("%s", err);
    return -1;
  }
  /* a degradation is acted on only once etcd records it */
  if (srv->feed)
    embps_feed_set_recorder(srv->feed, on_record, f);
  int rc = embps_coord_start(f->coord);
  if (rc) {
    LOG_ERROR("cannot start the coordinator thread: %s", strerror(-rc));
    return -1;
  }
  LOG_INFO("coordinator: member %u of cluster %s in %s as %s (lease %u ms)",
           srv->cfg.member, srv->cfg.cluster_name, srv->cfg.coordinator,
           f->addr, srv->cfg.lease_ms);
  return 0;
}

void embps_failover_stop(embps_server_t *srv) {
  embps_failover_t *f = srv->failover;
  if (!f)
    return;
  if (srv->feed)
    embps_feed_set_recorder(srv->feed, NULL, NULL);
  embps_coord_destroy(f->coord, 1);
  f->coord = NULL;
  srv->rejoin = NULL;
  srv->failover = NULL;
  free(f);
}

/* ---- writes ---- */

static int is_mutation(uint16_t kind) {
  return kind == EMBPS_KIND_PUSH || kind == EMBPS_KIND_CREATE ||
         kind == EMBPS_KIND_DROP || kind == EMBPS_KIND_ALTER ||
         kind == EMBPS_KIND_WRITE_ROWS || kind == EMBPS_KIND_EVICT;
}

int embps_failover_may_write(embps_server_t *srv) {
  embps_failover_t *f = srv->failover;
  return !f || (f->coord && atomic_load(&srv->role) == EMBPS_ROLE_PRIMARY &&
                embps_coord_may_write(f->coord));
}

void embps_failover_refuse(embps_server_t *srv, embps_request_t *req) {
  char primary[EMBPS_ADDR_MAX] = "";
  embps_coord_status_t st;
  memset(&st, 0, sizeof st);
  if (embps_failover_status(srv, &st))
    snprintf(primary, sizeof primary, "%s", st.primary);
  if (atomic_load(&srv->role) == EMBPS_ROLE_FOLLOWER) {
    if (!primary[0])
      embps_follow_primary(srv, primary, sizeof primary);
    if (primary[0])
      embps_request_fail(srv, req, EMBPS_ENOTPRIMARY, "this server follows "
                         "%s: send writes there", primary);
    else
      embps_request_fail(srv, req, EMBPS_ENOTPRIMARY, "this server is not "
                         "the primary, and none is elected yet");
    return;
  }
  embps_request_fail(srv, req, EMBPS_ENOTPRIMARY, "this server's lease as "
                     "primary of member %u is not valid now (%s): writes are "
                     "refused until it is renewed or another is elected",
                     srv->cfg.member,
                     st.error[0] ? st.error : "not renewed in time");
}

void embps_failover_check_reply(embps_server_t *srv, embps_request_t *req) {
  if (!srv->failover || !is_mutation(req->hdr.kind) || !req->reply ||
      req->reply_len < EMBPS_FRAME_HEADER_LEN)
    return;
  embps_frame_header_t h;
  if (embps_frame_header_decode(req->reply, SIZE_MAX, &h) ||
      h.kind == EMBPS_KIND_ERROR || embps_failover_may_write(srv))
    return;
  embps_request_fail(srv, req, EMBPS_ENOTPRIMARY, "applied on this server "
                     "but not acknowledged: its lease as primary ended "
                     "before the reply (a retry with the same sequence "
                     "number is applied once)");
}

void embps_failover_hello(embps_server_t *srv, uint32_t *role,
                          char *primary, size_t cap) {
  embps_failover_t *f = srv->failover;
  primary[0] = 0;
  if (embps_failover_may_write(srv)) {
    *role = EMBPS_ROLE_PRIMARY;
    return;
  }
  *role = EMBPS_ROLE_FOLLOWER;
  embps_coord_status_t st;
  memset(&st, 0, sizeof st);
  if (embps_failover_status(srv, &st) && st.primary[0])
    snprintf(primary, cap, "%s", st.primary);
  else if (srv->follow)
    embps_follow_primary(srv, primary, cap);
  if (f && !strcmp(primary, f->addr))
    primary[0] = 0; /* itself, its fence ended: it knows no other yet */
}

/* ---- figures ---- */

int embps_failover_status(embps_server_t *srv, embps_coord_status_t *s) {
  embps_failover_t *f = srv->failover;
  if (!f || !f->coord)
    return 0;
  embps_coord_status(f->coord, s);
  return 1;
}

void embps_failover_members(embps_server_t *srv, embps_server_stats_t *s) {
  embps_failover_t *f = srv->failover;
  embps_coord_primary_t *v;
  size_t n;
  s->members = NULL;
  s->n_members = 0;
  if (!f || !f->coord || embps_coord_primaries(f->coord, &v, &n) || !n)
    return;
  s->members = calloc(n, sizeof *s->members);
  if (s->members) {
    for (size_t i = 0; i < n; i++) {
      s->members[i].member = v[i].member;
      s->members[i].epoch = v[i].addr[0] ? v[i].epoch : 0;
      snprintf(s->members[i].primary, sizeof s->members[i].primary, "%s",
               v[i].addr);
    }
    s->n_members = (uint32_t)n;
  }
  free(v);
}

void embps_failover_stats(embps_server_t *srv, embps_server_stats_t *s) {
  embps_follow_stats(srv, s);
  embps_coord_status_t st;
  if (embps_failover_status(srv, &st) && st.primary[0])
    snprintf(s->primary, sizeof s->primary, "%.63s", st.primary);
}
