/* alter.c - ALTER: changes a table's hyperparameters (embps_table_alter_t)
 * on the apply thread, in order with the pushes, so every push applied
 * after it uses the new values and every push before it the old ones. With
 * --data-dir the new spec is logged (EMBPS_WAL_ALTER) before it takes
 * effect, and the next checkpoint's manifest holds it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "durable.h"
#include "server.h"

int embps_dispatch_alter(embps_server_t *srv, embps_request_t *req,
                         uint64_t lsn) {
  const char *name = req->msg.u.alter.name;
  embps_table_t *t = embps_registry_get(&srv->registry, name);
  if (!t) {
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "unknown table \"%s\"",
                       name);
    return -1;
  }
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  embps_table_info(t, &m.u.info);
  embps_table_spec_t spec = m.u.info.spec;
  char why[2048];
  int rc = embps_table_spec_alter(&spec, &req->msg.u.alter.set, why,
                                  sizeof why);
  if (rc) {
    embps_request_fail(srv, req, rc, "table \"%s\" not altered: %s", name,
                       why);
  } else if (srv->dur && (rc = embps_durable_log_alter(srv->dur, lsn, t, &spec,
                                                       why, sizeof why))) {
    embps_request_fail(srv, req, rc, "table \"%s\" not altered: %s", name,
                       why);
  } else {
    embps_table_alter(t, &spec);
    LOG_DEBUG("altered table \"%s\": lr %g eps %g beta1 %g beta2 %g l1 %g "
              "l2 %g lr-power %g weight-decay %g", name, spec.lr, spec.eps,
              spec.beta1, spec.beta2, spec.l1, spec.l2, spec.lr_power,
              spec.weight_decay);
    embps_table_info(t, &m.u.info);
    m.kind = EMBPS_KIND_ALTER | EMBPS_KIND_REPLY;
    free(req->reply);
    req->reply = NULL;
    if (embps_frame_build(&m, req->hdr.req_id, 0, &req->reply,
                          &req->reply_len, NULL))
      embps_request_fail(srv, req, EMBPS_ENOMEM, "table \"%s\" altered; out "
                         "of memory for the reply", name);
  }
  embps_table_unref(t);
  if (rc)
    return -1;
  return srv->dur ? 1 : 0;
}
