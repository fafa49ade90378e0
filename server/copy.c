/* copy.c - see copy.h. The copy owns a registry and an exactly-once table
 * of its own, the loaded checkpoint (whose shard LSNs the redo reads) and
 * the redo that applies the primary's records to them; at the install
 * the registries are swapped, so the copy's registry then holds the old
 * tables until it is freed. The mark (DIR/COPYING) holds one line naming
 * the primary copied, for whoever looks; only its presence counts. */
#define _GNU_SOURCE
#include "copy.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../client/snapshot.h"
#include "durable.h"
#include "feed.h"
#include "marker.h"
#include "redo.h"

#define SESSION_IDLE_MS 60000 /* the primary keeps the session this long */
#define CALL_TIMEOUT_MS 30000 /* a READ waits while its shard is copied */

struct embps_copy {
  embps_server_t *srv;
  char primary[EMBPS_ADDR_MAX]; /* HOST:PORT copied */
  embps_client_t *c;       /* the session's own connection */
  embps_snapshot_t *snap; /* open until prepare */
  embps_history_t hist;
  embps_ckpt_t ck;         /* the snapshot loaded: its shard LSNs */
  embps_registry_t reg;    /* the copy's tables */
  embps_seen_t seen;
  embps_redo_t redo;
  uint64_t lsn, ready_at;  /* the last LSN applied; every shard's past it */
  uint32_t epoch;          /* of the record at lsn */
  int staged;              /* redo set up */
};

int embps_copy_connect(embps_server_t *srv, const char *primary,
                       int timeout_ms, embps_client_t **out, char *err,
                       size_t err_len) {
  char token[EMBPS_TOKEN_MAX + 1];
  const size_t len = embps_auth_current(&srv->auth, token, sizeof token);
  return embps_client_create_peer_(primary, token, len, timeout_ms, out, err,
                                   err_len);
}

/* The snapshot's bytes for the loader, until the caller stops. */
typedef struct {
  embps_snapshot_t *snap;
  int (*stopping)(void *ctx);
  void *ctx;
} source_t;

static int source_next(void *ctx, const uint8_t **p, size_t *n, char *err,
                       size_t err_len) {
  source_t *src = ctx;
  if (src->stopping && src->stopping(src->ctx)) {
    snprintf(err, err_len, "stopped");
    return -1;
  }
  return embps_snapshot_reader_next(src->snap, p, n, err, err_len);
}

/* The highest LSN a shard of ck was copied at (S at least). */
static uint64_t shards_lsn(const embps_ckpt_t *ck) {
  uint64_t m = ck->lsn;
  for (size_t i = 0; i < ck->n_tables; i++)
    for (uint32_t k = 0; ck->tables[i].shard_lsn &&
                         k < ck->tables[i].file_shards;
         k++)
      if (ck->tables[i].shard_lsn[k] > m)
        m = ck->tables[i].shard_lsn[k];
  return m;
}

/* The copy's registry and redo over the loaded tables. 0, or -1 with
 * err. */
static int stage(embps_copy_t *cp, char *err, size_t err_len) {
  embps_redo_init(&cp->redo, cp->srv, &cp->reg, &cp->seen);
  cp->staged = 1;
  for (size_t i = 0; i < cp->ck.n_seen; i++)
    embps_seen_note(&cp->seen, cp->ck.seen[i].client, cp->ck.seen[i].seq);
  for (size_t i = 0; i < cp->ck.n_tables; i++) {
    embps_ckpt_table_t *ct = &cp->ck.tables[i];
    embps_table_ref(ct->table);
    if (embps_registry_add(&cp->reg, ct->table)) {
      embps_table_unref(ct->table);
      snprintf(err, err_len, "snapshot of the primary: table \"%s\" twice",
               embps_table_spec(ct->table)->name);
      return -1;
    }
    if (embps_redo_add_table(&cp->redo, ct->table, ct->incarnation,
                             ct->file_shards, ct->shard_lsn)) {
      snprintf(err, err_len, "out of memory");
      return -1;
    }
  }
  cp->lsn = cp->ck.lsn;
  cp->ready_at = shards_lsn(&cp->ck);
  cp->epoch = embps_history_epoch_at(&cp->hist, cp->lsn);
  return 0;
}

int embps_copy_check_layout(const embps_server_config_t *cfg, uint32_t shards,
                            uint32_t size, uint32_t index, char *err,
                            size_t err_len) {
  if (shards == cfg->shards && size == cfg->cluster_size &&
      index == cfg->cluster_index)
    return 0;
  snprintf(err, err_len, "the primary is server %u of %u with --shards %u; "
           "this one is %u of %u with --shards %u: a follower needs the "
           "same to hold the same rows", index, size, shards,
           cfg->cluster_index, cfg->cluster_size, cfg->shards);
  return -1;
}

int embps_copy_load(embps_server_t *srv, const char *primary,
                    const embps_history_t *h, int (*stopping)(void *ctx),
                    void *stop_ctx, embps_copy_t **out, int *halt, char *err,
                    size_t err_len) {
  *out = NULL;
  *halt = 0;
  embps_copy_t *cp = calloc(1, sizeof *cp);
  if (!cp) {
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
  }
  cp->srv = srv;
  snprintf(cp->primary, sizeof cp->primary, "%s", primary);
  embps_registry_init(&cp->reg);
  embps_seen_init(&cp->seen);
  if (embps_history_copy(&cp->hist, h)) {
    embps_copy_free(cp);
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
  }
  const uint64_t t0 = embps_now_ns();
  char why[1024];
  int rc = embps_copy_connect(srv, cp->primary, CALL_TIMEOUT_MS, &cp->c, why,
                              sizeof why);
  if (rc) {
    snprintf(err, err_len, "snapshot of the primary: %s", why);
    embps_copy_free(cp);
    return rc;
  }
  const embps_snapshot_options_t o = {.idle_ms = SESSION_IDLE_MS};
  rc = embps_snapshot_begin(cp->c, 0, &o, &cp->snap);
  if (rc) {
    snprintf(err, err_len, "snapshot of the primary: %s",
             embps_client_last_error(cp->c));
    embps_copy_free(cp);
    return rc;
  }
  const embps_snapshot_info_t *in = embps_snapshot_info(cp->snap);
  const embps_server_config_t *cfg = &srv->cfg;
  if (embps_copy_check_layout(cfg, in->shards, in->cluster_size,
                              in->cluster_index, err, err_len)) {
    *halt = 1;
    embps_copy_free(cp);
    return EMBPS_EINVAL;
  }
  LOG_INFO("follower: copying a snapshot of primary %s at LSN %" PRIu64
           " (%u tables)", cp->primary, in->lsn, in->tables);
  source_t src = {cp->snap, stopping, stop_ctx};
  embps_snapstream_reader_t r;
  embps_snapstream_reader_init(&r, source_next, &src);
  if (embps_ckpt_load_stream(&r, cfg->shards, cfg->cluster_size, &cp->ck, why,
                             sizeof why)) {
    snprintf(err, err_len, "snapshot of the primary: %s", why);
    embps_copy_free(cp);
    return EMBPS_EPROTO;
  }
  if (cp->ck.lsn != in->lsn || cp->ck.cluster_index != cfg->cluster_index) {
    snprintf(err, err_len, "snapshot of the primary: its MANIFEST names LSN "
             "%" PRIu64 " of server %u, its session LSN %" PRIu64 " of "
             "server %u", cp->ck.lsn, cp->ck.cluster_index, in->lsn,
             cfg->cluster_index);
    embps_copy_free(cp);
    return EMBPS_EPROTO;
  }
  if (stage(cp, err, err_len)) {
    embps_copy_free(cp);
    return -ENOMEM;
  }
  LOG_INFO("follower: snapshot at LSN %" PRIu64 " loaded (%zu tables, %"
           PRIu64 " bytes in %" PRIu64 " ms); its shards were copied up to "
           "LSN %" PRIu64, cp->ck.lsn, cp->ck.n_tables,
           embps_snapshot_bytes(cp->snap), (embps_now_ns() - t0) / 1000000,
           cp->ready_at);
  *out = cp;
  return 0;
}

uint64_t embps_copy_lsn(const embps_copy_t *cp) { return cp->lsn; }

const embps_history_t *embps_copy_history(const embps_copy_t *cp) {
  return &cp->hist;
}

int embps_copy_ready(const embps_copy_t *cp) {
  return cp->lsn >= cp->ready_at;
}

int embps_copy_apply(embps_copy_t *cp, const uint8_t *buf, size_t len,
                     uint32_t n, char *err, size_t err_len) {
  size_t off = 0;
  for (uint32_t i = 0; i < n; i++) {
    embps_wal_rec_t rec;
    char why[256];
    size_t k = embps_wal_parse(buf + off, len - off, 1, &rec, why,
                               sizeof why);
    if (!k || rec.lsn != cp->lsn + 1) {
      snprintf(err, err_len, "record %u of a batch for the copy: %s", i,
               k ? "out of sequence" : why);
      return -1;
    }
    if (embps_redo_apply(&cp->redo, &rec, why, sizeof why)) {
      snprintf(err, err_len, "LSN %" PRIu64 " does not apply to the copy: "
               "%s", rec.lsn, why);
      return -1;
    }
    cp->lsn = rec.lsn;
    cp->epoch = rec.epoch;
    off += k;
  }
  return 0;
}

int embps_copy_prepare(embps_copy_t *cp, char *err, size_t err_len) {
  embps_snapshot_end(cp->snap); /* the records after S are here */
  cp->snap = NULL;
  embps_client_destroy(cp->c);
  cp->c = NULL;
  embps_server_t *srv = cp->srv;
  if (!srv->dur)
    return 0;
  embps_ckpt_t c;
  if (embps_marker_build(srv, &cp->reg, &cp->seen, cp->lsn, &c, err,
                         err_len)) {
    embps_ckpt_free(&c);
    return -1;
  }
  int rc = embps_durable_adopt(srv->dur, &c, &cp->hist, err, err_len);
  embps_ckpt_free(&c);
  return rc;
}

int embps_copy_install(embps_copy_t *cp, embps_apply_ctx_t *ctx, char *err,
                       size_t err_len) {
  embps_server_t *srv = ctx->srv;
  embps_table_t **v;
  size_t n;
  if (embps_registry_refs(&cp->reg, &v, &n)) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < n; i++) { /* a read of them says LSN lsn at least */
    embps_table_set_lsn(v[i], cp->lsn);
    embps_table_unref(v[i]);
  }
  free(v);
  embps_registry_swap(&srv->registry, &cp->reg);
  const uint64_t was = ctx->lsn;
  ctx->lsn = cp->lsn;
  ctx->epoch = cp->epoch;
  embps_seen_move(&ctx->seen, &cp->seen);
  if (embps_feed_set_history(srv->feed, &cp->hist)) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  LOG_INFO("follower: the copy of primary %s replaces this server's state "
           "at LSN %" PRIu64 " (it was at LSN %" PRIu64 ")", cp->primary,
           cp->lsn, was);
  return srv->dur ? embps_durable_adopted(ctx, cp->lsn, err, err_len) : 0;
}

void embps_copy_free(embps_copy_t *cp) {
  if (!cp)
    return;
  embps_snapshot_end(cp->snap);
  if (cp->c)
    embps_client_destroy(cp->c);
  if (cp->staged)
    embps_redo_close(&cp->redo);
  embps_registry_close(&cp->reg);
  embps_seen_close(&cp->seen);
  embps_ckpt_free(&cp->ck); /* after the redo: its shard LSNs */
  embps_history_close(&cp->hist);
  free(cp);
}

/* ---- the mark ---- */

static void mark_path(const embps_server_t *srv, char *out, size_t cap) {
  snprintf(out, cap, "%s/" EMBPS_COPY_MARK, srv->cfg.data_dir);
}

int embps_copy_mark(embps_server_t *srv, const char *primary) {
  if (!srv->cfg.data_dir[0])
    return 0;
  char path[1100], line[EMBPS_ADDR_MAX + 96];
  mark_path(srv, path, sizeof path);
  const int n = snprintf(line, sizeof line, "copying the state of primary "
                         "%s\n", primary);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int rc = fd < 0 ? -errno : 0;
  errno = 0;
  if (!rc && write(fd, line, (size_t)n) != n)
    rc = errno ? -errno : -EIO;
  if (!rc && fsync(fd))
    rc = -errno;
  if (fd >= 0 && close(fd) && !rc)
    rc = -errno;
  if (!rc)
    rc = embps_fsync_dir(srv->cfg.data_dir);
  if (rc) {
    LOG_ERROR("follower: cannot write %s (%s): a restart before the copy "
              "is in would make this server eligible again", path,
              strerror(-rc));
    return -1;
  }
  return 0;
}

void embps_copy_unmark(embps_server_t *srv) {
  if (!srv->cfg.data_dir[0])
    return;
  char path[1100];
  mark_path(srv, path, sizeof path);
  if (unlink(path)) {
    if (errno != ENOENT)
      LOG_ERROR("follower: cannot remove %s (%s): this server will not be "
                "eligible after a restart until it has caught up again",
                path, strerror(errno));
    return;
  }
  if (embps_fsync_dir(srv->cfg.data_dir))
    LOG_WARN("follower: cannot sync %s after removing %s", srv->cfg.data_dir,
             path);
}

int embps_copy_marked(embps_server_t *srv) {
  if (!srv->cfg.data_dir[0])
    return 0;
  char path[1100];
  mark_path(srv, path, sizeof path);
  struct stat st;
  if (stat(path, &st))
    return 0;
  LOG_WARN("follower: %s: this server stopped while copying its primary's "
           "state (its tables are older than its history says): not "
           "eligible for election until it has caught up with a primary",
           path);
  return 1;
}
