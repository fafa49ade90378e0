/* evict.c - see evict.h. */
#include "evict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "log.h"
#include "registry.h"
#include "wire.h"

/* Logs (with --data-dir) then runs an eviction of t. 0, or an error code
 * with msg; nothing evicted then. */
static int evict_logged(embps_server_t *srv, embps_table_t *t, uint64_t *lsn,
                        uint64_t *evicted, char *msg, size_t msg_len) {
  uint64_t at = 0;
  if (srv->dur) {
    const char *failed = embps_durable_failed(srv->dur);
    if (failed) {
      snprintf(msg, msg_len, "%s", failed);
      return EMBPS_EIO;
    }
    int rc = embps_durable_log_evict(srv->dur, *lsn + 1, t, msg, msg_len);
    if (rc)
      return rc;
    at = ++*lsn;
  }
  embps_table_evict(t, embps_table_spec(t)->evict_l2_below, at, NULL,
                    evicted);
  return 0;
}

uint64_t embps_evict_request(embps_server_t *srv, embps_request_t *req,
                             uint64_t *lsn) {
  embps_table_t *t = embps_registry_get(&srv->registry, req->msg.u.name);
  if (!t) {
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "no table \"%s\"",
                       req->msg.u.name);
    return 0;
  }
  char msg[2048];
  uint64_t before = *lsn;
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_EVICT | EMBPS_KIND_REPLY;
  int rc = evict_logged(srv, t, lsn, &m.u.evicted, msg, sizeof msg);
  embps_table_unref(t);
  if (rc) {
    embps_request_fail(srv, req, rc, "%s", msg);
    return 0;
  }
  if (embps_frame_build(&m, req->hdr.req_id, 0, &req->reply, &req->reply_len,
                        NULL))
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory");
  return *lsn != before ? *lsn : 0;
}

void embps_evict_at_checkpoint(embps_server_t *srv, uint64_t *lsn) {
  embps_table_t **v;
  size_t n;
  if (embps_registry_refs(&srv->registry, &v, &n))
    return;
  for (size_t i = 0; i < n; i++) {
    char msg[2048];
    uint64_t evicted;
    if (embps_table_spec(v[i])->evict_l2_below > 0 &&
        evict_logged(srv, v[i], lsn, &evicted, msg, sizeof msg))
      LOG_WARN("table \"%s\": eviction at checkpoint skipped: %s",
               embps_table_spec(v[i])->name, msg);
    embps_table_unref(v[i]);
  }
  free(v);
}
