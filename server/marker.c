/* marker.c - see marker.h. */
#include "marker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

int embps_marker_take(embps_apply_ctx_t *ctx, embps_ckpt_t *c, char *err,
                      size_t err_len) {
  return embps_marker_build(ctx->srv, &ctx->srv->registry, &ctx->seen,
                            ctx->lsn, c, err, err_len);
}

int embps_marker_build(const embps_server_t *srv, embps_registry_t *registry,
                       const embps_seen_t *seen, uint64_t lsn,
                       embps_ckpt_t *c, char *err, size_t err_len) {
  memset(c, 0, sizeof *c);
  c->lsn = lsn;
  c->cluster_size = srv->cfg.cluster_size;
  c->cluster_index = srv->cfg.cluster_index;
  c->shards = srv->cfg.shards;
  c->seen = embps_seen_copy(seen, &c->n_seen);
  if (!c->seen) {
    c->n_seen = 0;
    LOG_WARN("no memory to copy the exactly-once table: the checkpoint "
             "holds none");
  }
  embps_table_t **tables = NULL;
  size_t n = 0;
  if (embps_registry_refs(registry, &tables, &n) ||
      !(c->tables = calloc(n ? n : 1, sizeof *c->tables))) {
    snprintf(err, err_len, "out of memory");
    for (size_t i = 0; i < n; i++)
      embps_table_unref(tables[i]);
    free(tables);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    embps_table_info_t info;
    embps_table_info(tables[i], &info);
    c->tables[i].table = tables[i];
    c->tables[i].incarnation = embps_table_incarnation(tables[i]);
    c->tables[i].step = info.step;
    c->tables[i].spec = info.spec;
  }
  c->n_tables = n;
  free(tables);
  return 0;
}
