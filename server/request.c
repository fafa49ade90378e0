/* request.c - see request.h: building a request's reply or error frame,
 * and the lookups and checks every handler starts with. */
#include "request.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

void embps_request_free(embps_request_t *req) {
  if (!req)
    return;
  embps_msg_free(&req->msg);
  embps_bufpool_give(req->bodies, req->body, req->body_cap);
  free(req->reply);
  embps_table_unref(req->table);
  free(req);
}

static void fail_v(embps_server_t *srv, embps_request_t *req, int code,
                   uint64_t lsn, const char *fmt, va_list ap)
    __attribute__((format(printf, 5, 0)));

void embps_request_fail(embps_server_t *srv, embps_request_t *req, int code,
                        const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fail_v(srv, req, code, 0, fmt, ap);
  va_end(ap);
}

void embps_request_fail_at(embps_server_t *srv, embps_request_t *req,
                           int code, uint64_t lsn, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fail_v(srv, req, code, lsn, fmt, ap);
  va_end(ap);
}

static void fail_v(embps_server_t *srv, embps_request_t *req, int code,
                   uint64_t lsn, const char *fmt, va_list ap) {
  char raw[EMBPS_MESSAGE_MAX], msg[EMBPS_MESSAGE_MAX];
  vsnprintf(raw, sizeof raw, fmt, ap);
  embps_escape(raw, msg, sizeof msg); /* it may echo a peer's bytes */
  free(req->reply);
  req->reply = NULL;
  /* a DESCRIBE of a missing table is a probe (create-table asks first),
   * answered but not counted as an error */
  if (code != EMBPS_ENOTABLE || req->hdr.kind != EMBPS_KIND_DESCRIBE) {
    atomic_fetch_add_explicit(&srv->counters.errors, 1, memory_order_relaxed);
    embps_metrics_error(req, code);
  }
  LOG_DEBUG("request %u kind %u refused: %s", req->hdr.req_id, req->hdr.kind,
            msg);
  embps_msg_t m;
  memset(&m, 0, sizeof m);
  m.kind = EMBPS_KIND_ERROR;
  m.u.error.code = code;
  m.u.error.lsn = lsn;
  snprintf(m.u.error.message, sizeof m.u.error.message, "%s", msg);
  if (embps_frame_build(&m, req->hdr.req_id, 0, &req->reply, &req->reply_len,
                        NULL))
    req->reply_len = 0; /* out of memory: the connection will be closed */
}

void *embps_request_reply(embps_server_t *srv, embps_request_t *req,
                          uint16_t kind, const embps_msg_t *m,
                          size_t bulk_len) {
  embps_msg_t empty;
  if (!m) {
    memset(&empty, 0, sizeof empty);
    m = &empty;
  }
  embps_msg_t copy = *m;
  copy.kind = kind | EMBPS_KIND_REPLY;
  size_t off;
  free(req->reply);
  req->reply = NULL;
  if (embps_frame_build(&copy, req->hdr.req_id, bulk_len, &req->reply,
                        &req->reply_len, &off)) {
    embps_request_fail(srv, req, EMBPS_ENOMEM, "out of memory for a reply of "
                       "%zu bytes", bulk_len);
    return NULL;
  }
  return req->reply + off;
}

uint8_t *embps_request_bulk(const embps_request_t *req, size_t *len) {
  size_t off = embps_bulk_offset(req->hdr.meta_len);
  *len = req->hdr.body_len - off;
  return req->body + off;
}

embps_table_t *embps_request_table(embps_server_t *srv, embps_request_t *req,
                                   const char *name) {
  embps_table_t *t = embps_registry_get(&srv->registry, name);
  if (!t)
    embps_request_fail(srv, req, EMBPS_ENOTABLE, "unknown table \"%s\"", name);
  return t;
}

int embps_request_check_dim(embps_server_t *srv, embps_request_t *req,
                            const embps_table_t *t, uint32_t dim) {
  const embps_table_spec_t *s = embps_table_spec(t);
  if (dim == s->dim)
    return 0;
  embps_request_fail(srv, req, EMBPS_EDIM, "table \"%s\" has dim %u, the "
                     "request has dim %u", s->name, s->dim, dim);
  return -1;
}

void embps_request_fail_id(embps_server_t *srv, embps_request_t *req,
                           const embps_table_t *t, int rc, int64_t id) {
  const embps_table_spec_t *s = embps_table_spec(t);
  if (rc == EMBPS_ERANGE)
    embps_request_fail(srv, req, rc, "index %lld out of range [0, %llu) of "
                       "table \"%s\"", (long long)id,
                       (unsigned long long)s->rows, s->name);
  else
    embps_request_fail(srv, req, rc, "id %lld belongs to server %u of %u, "
                       "not to this one (%u)", (long long)id,
                       embps_route(id, srv->cfg.cluster_size),
                       srv->cfg.cluster_size, srv->cfg.cluster_index);
}
