/* etcd.c - the etcd v3 gateway client of etcd.h over libcurl.
 *
 * A call builds its JSON body (json.h), POSTs it to the current endpoint
 * with the time left of the call's deadline, and reads the response into
 * a buffer bounded by EMBPS_ETCD_REPLY_MAX. What decides a failover to
 * the next endpoint: no connection, a timeout, an HTTP 502/503/504, or a
 * gRPC UNAVAILABLE/DEADLINE_EXCEEDED from etcd; anything else etcd says
 * is its answer and ends the call. Proxies from the environment are
 * ignored (an etcd on loopback must not go through http_proxy).
 *
 * Responses follow proto3's JSON mapping: zero values are left out (a
 * range with no keys has no "kvs", a failed transaction no
 * "succeeded"), int64 are strings, bytes base64. Streaming methods
 * (keepalive, watch) wrap each message as {"result": ...} or
 * {"error": {...}}; a watch's messages are read one object at a time as
 * they come (embps_json_frame), on a curl multi handle of its own so a
 * reader can wait for them with a timeout and be woken. */
#include "etcd.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "util.h"

/* Tokens of one response: enough for EMBPS_ETCD_KVS_MAX keys and more. */
#define TOKENS_MAX (1u << 17)
/* Bytes of a request body: keys and values base64 (4/3) and the JSON. */
#define BODY_MAX (EMBPS_ETCD_TXN_MAX * 3 * (EMBPS_ETCD_KEY_MAX * 3 + EMBPS_ETCD_VALUE_MAX * 4 / 3 + 256))

typedef struct {
  char *p;
  size_t len, cap, max;
  int over;
} buf_t;

typedef struct {
  char name[280]; /* host:port as given */
  char base[300]; /* http://host:port */
} endpoint_t;

struct embps_etcd {
  endpoint_t ep[EMBPS_ETCD_ENDPOINTS_MAX];
  size_t n_ep, cur;
  uint32_t timeout_ms;
  CURL *curl;
  struct curl_slist *headers;
  buf_t reply;
  char curl_err[CURL_ERROR_SIZE];
  char err[EMBPS_ETCD_ERR_MAX];
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) { curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

static uint64_t now_ms(void) { return embps_now_ns() / 1000000u; }

static void set_err(char *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void set_err(char *err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, EMBPS_ETCD_ERR_MAX, fmt, ap);
  va_end(ap);
}

/* ---- buffers ---- */

static int buf_append(buf_t *b, const char *p, size_t n) {
  if (n > b->max - b->len) {
    b->over = 1;
    return -1;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1)
      cap *= 2;
    if (cap > b->max + 1)
      cap = b->max + 1;
    char *q = realloc(b->p, cap);
    if (!q)
      return -1;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
  b->p[b->len] = 0;
  return 0;
}

static size_t on_reply(char *ptr, size_t size, size_t n, void *ud) {
  buf_t *b = ud;
  return buf_append(b, ptr, size * n) ? 0 : size * n;
}

/* ---- set-up ---- */

int embps_etcd_create(const char *url, uint32_t timeout_ms,
                      embps_etcd_t **out, char *err, size_t err_len) {
  static const char scheme[] = "etcd://";
  *out = NULL;
  if (strncmp(url, scheme, sizeof scheme - 1)) {
    snprintf(err, err_len, "coordinator %s: expected etcd://HOST:PORT[,HOST:PORT...]",
             url);
    return -1;
  }
  if (timeout_ms < 10) {
    snprintf(err, err_len, "etcd timeout of %u ms: at least 10", timeout_ms);
    return -1;
  }
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK) {
    snprintf(err, err_len, "libcurl: %s", curl_easy_strerror(curl_init_rc));
    return -1;
  }
  embps_etcd_t *e = calloc(1, sizeof *e);
  if (!e) {
    snprintf(err, err_len, "out of memory");
    return -1;
  }
  e->timeout_ms = timeout_ms;
  const char *p = url + sizeof scheme - 1;
  for (;;) {
    size_t n = strcspn(p, ",");
    char one[280], host[256];
    int port;
    if (!n || n >= sizeof one) {
      snprintf(err, err_len, "coordinator %s: %s endpoint", url,
               n ? "an overlong" : "an empty");
      goto fail;
    }
    if (e->n_ep == EMBPS_ETCD_ENDPOINTS_MAX) {
      snprintf(err, err_len, "coordinator %s: more than %d endpoints", url,
               EMBPS_ETCD_ENDPOINTS_MAX);
      goto fail;
    }
    memcpy(one, p, n);
    one[n] = 0;
    if (embps_parse_hostport(one, host, sizeof host, &port) || port <= 0 ||
        port > 65535 || strpbrk(host, "/?#@ ")) {
      snprintf(err, err_len, "coordinator %s: endpoint '%s' is not HOST:PORT",
               url, one);
      goto fail;
    }
    endpoint_t *ep = &e->ep[e->n_ep++];
    snprintf(ep->name, sizeof ep->name, "%s", one);
    snprintf(ep->base, sizeof ep->base, strchr(host, ':') ? "http://[%s]:%d"
                                                          : "http://%s:%d",
             host, port);
    p += n;
    if (!*p)
      break;
    p++;
  }
  e->curl = curl_easy_init();
  e->headers = curl_slist_append(NULL, "Content-Type: application/json");
  struct curl_slist *h2 = e->headers ? curl_slist_append(e->headers, "Expect:") : NULL;
  if (!e->curl || !h2) {
    snprintf(err, err_len, "libcurl: out of memory");
    goto fail;
  }
  e->headers = h2;
  e->reply.max = EMBPS_ETCD_REPLY_MAX;
  *out = e;
  return 0;
fail:
  embps_etcd_destroy(e);
  return -1;
}

void embps_etcd_destroy(embps_etcd_t *e) {
  if (!e)
    return;
  if (e->curl)
    curl_easy_cleanup(e->curl);
  curl_slist_free_all(e->headers);
  free(e->reply.p);
  free(e);
}

const char *embps_etcd_error(const embps_etcd_t *e) { return e->err; }
const char *embps_etcd_endpoint(const embps_etcd_t *e) {
  return e->ep[e->cur].name;
}
size_t embps_etcd_endpoints(const embps_etcd_t *e) { return e->n_ep; }

/* Options every request of handle c shares. */
static void common_opts(CURL *c, struct curl_slist *headers, char *errbuf) {
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_PROXY, "");
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
  curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http");
}

/* ---- errors etcd reports ---- */

static int errno_of_grpc(int64_t code) {
  switch (code) {
  case 3:  /* INVALID_ARGUMENT */
  case 9:  /* FAILED_PRECONDITION */
    return -EINVAL;
  case 4:  /* DEADLINE_EXCEEDED */
    return -ETIMEDOUT;
  case 5:  /* NOT_FOUND */
    return -ENOENT;
  case 7:  /* PERMISSION_DENIED */
  case 16: /* UNAUTHENTICATED */
    return -EACCES;
  case 8:  /* RESOURCE_EXHAUSTED: etcd's database is full */
    return -ENOSPC;
  case 11: /* OUT_OF_RANGE: a compacted revision */
    return -ERANGE;
  case 14: /* UNAVAILABLE */
    return -EHOSTUNREACH;
  default:
    return -EIO;
  }
}

/* An error in doc (root: {"code":N,"message":...} from a unary method,
 * {"error":{"grpc_code":N,"message":...}} inside a stream): 1 with *code
 * and msg set, 0 when there is none. */
static int grpc_error(const embps_json_t *d, int64_t *code, char *msg,
                      size_t cap) {
  int c = embps_json_get(d, 0, "code");
  int m = embps_json_get(d, 0, "message");
  int inner = embps_json_get(d, 0, "error");
  if (inner >= 0 && d->tok[inner].type == EMBPS_JSON_OBJECT) {
    c = embps_json_get(d, inner, "grpc_code");
    m = embps_json_get(d, inner, "message");
  } else if (c < 0 && inner < 0) {
    return 0;
  }
  *code = 2; /* UNKNOWN */
  if (c >= 0)
    embps_json_int64(d, c, code);
  char raw[256] = "";
  if (m < 0 || embps_json_string(d, m, raw, sizeof raw, NULL))
    if (inner >= 0 && embps_json_string(d, inner, raw, sizeof raw, NULL))
      snprintf(raw, sizeof raw, "(no message)");
  embps_escape(raw, msg, cap);
  return 1;
}

static int retryable_grpc(int64_t code) { return code == 14 || code == 4; }

/* ---- one call ---- */

/* POSTs body to path on the endpoints in turn (from the current one)
 * until one answers, all within e->timeout_ms. 0 with *doc parsed (the
 * caller frees it; it points into e->reply), or a code with e->err. */
static int call(embps_etcd_t *e, const char *path, const char *body,
                size_t body_len, embps_json_t *doc) {
  const uint64_t deadline = now_ms() + e->timeout_ms;
  char why[EMBPS_ETCD_ERR_MAX] = "";
  size_t why_len = 0;
  int rc = -ETIMEDOUT;
  size_t k = 0;
  for (; k < e->n_ep; k++) {
    const size_t i = (e->cur + k) % e->n_ep;
    const endpoint_t *ep = &e->ep[i];
    const uint64_t now = now_ms();
    if (now >= deadline)
      break;
    /* each endpoint left gets its share of the time left, the last one
       all of it: one that accepts and never answers (a frozen member)
       cannot take the whole deadline */
    const uint64_t left = deadline - now;
    uint64_t share = left / (e->n_ep - k);
    if (share < 10)
      share = 10;
    char url[sizeof ep->base + 64];
    snprintf(url, sizeof url, "%s%s", ep->base, path);
    CURL *c = e->curl;
    curl_easy_reset(c);
    common_opts(c, e->headers, e->curl_err);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)share);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)share);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_reply);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &e->reply);
    e->reply.len = 0;
    e->reply.over = 0;
    e->curl_err[0] = 0;
    CURLcode cc = curl_easy_perform(c);
    if (e->reply.over) {
      set_err(e->err, "etcd %s: response to %s larger than %u bytes",
              ep->name, path, EMBPS_ETCD_REPLY_MAX);
      return -EMSGSIZE;
    }
    if (cc != CURLE_OK) {
      rc = cc == CURLE_COULDNT_CONNECT    ? -ECONNREFUSED
           : cc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
                                            : -EHOSTUNREACH;
      why_len += (size_t)snprintf(why + why_len, sizeof why - why_len,
                                  "%s%s: %s", why_len ? "; " : "", ep->name,
                                  e->curl_err[0] ? e->curl_err
                                                 : curl_easy_strerror(cc));
      if (why_len >= sizeof why)
        why_len = sizeof why - 1;
      continue;
    }
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    char perr[160];
    if (embps_json_parse(doc, e->reply.p ? e->reply.p : "", e->reply.len,
                         TOKENS_MAX, perr, sizeof perr)) {
      if (status == 502 || status == 503 || status == 504) {
        rc = -EHOSTUNREACH;
        why_len += (size_t)snprintf(why + why_len, sizeof why - why_len,
                                    "%s%s: HTTP %ld", why_len ? "; " : "",
                                    ep->name, status);
        if (why_len >= sizeof why)
          why_len = sizeof why - 1;
        continue;
      }
      char head[64];
      snprintf(head, sizeof head, "%.40s", e->reply.p ? e->reply.p : "");
      char shown[200];
      embps_escape(head, shown, sizeof shown);
      set_err(e->err, "etcd %s: %s answered HTTP %ld, not etcd's v3 JSON "
              "(%s; it begins '%s')", ep->name, path, status, perr, shown);
      return -EPROTO;
    }
    int64_t code;
    char msg[300];
    if (grpc_error(doc, &code, msg, sizeof msg) || status != 200) {
      if (!grpc_error(doc, &code, msg, sizeof msg)) {
        code = 2;
        snprintf(msg, sizeof msg, "HTTP %ld", status);
      }
      embps_json_free(doc);
      if (retryable_grpc(code) || status == 502 || status == 503 ||
          status == 504) {
        rc = errno_of_grpc(code);
        why_len += (size_t)snprintf(why + why_len, sizeof why - why_len,
                                    "%s%s: %s", why_len ? "; " : "",
                                    ep->name, msg);
        if (why_len >= sizeof why)
          why_len = sizeof why - 1;
        continue;
      }
      set_err(e->err, "etcd %s: %s: %s (gRPC code %" PRId64 ")", ep->name,
              path, msg, code);
      return errno_of_grpc(code);
    }
    e->cur = i;
    e->err[0] = 0;
    return 0;
  }
  if (k < e->n_ep)
    why_len += (size_t)snprintf(why + why_len, sizeof why - why_len,
                                "%sno time left for %zu more endpoint(s)",
                                why_len ? "; " : "", e->n_ep - k);
  set_err(e->err, "no etcd endpoint answered %s within %u ms: %s", path,
          e->timeout_ms, why);
  /* start the next call at the endpoint after the one that failed first */
  e->cur = (e->cur + 1) % e->n_ep;
  return rc;
}

/* Finishes body w and calls path with it. */
static int call_jw(embps_etcd_t *e, const char *path, embps_jw_t *w,
                   embps_json_t *doc) {
  char *body;
  size_t len;
  if (embps_jw_finish(w, &body, &len)) {
    set_err(e->err, "etcd request to %s: body larger than %u bytes or out "
            "of memory", path, (unsigned)BODY_MAX);
    return -EMSGSIZE;
  }
  int rc = call(e, path, body, len, doc);
  free(body);
  return rc;
}

/* call_jw with the body {"<key>": v}: the lease calls. */
static int call_int(embps_etcd_t *e, const char *path, const char *key,
                    int64_t v, embps_json_t *doc) {
  embps_jw_t w;
  embps_jw_init(&w, BODY_MAX);
  embps_jw_obj(&w);
  embps_jw_key(&w, key);
  embps_jw_int64(&w, v);
  embps_jw_obj_end(&w);
  return call_jw(e, path, &w, doc);
}

static int check_sizes(embps_etcd_t *e, size_t key_len, size_t value_len) {
  if (!key_len || key_len > EMBPS_ETCD_KEY_MAX) {
    set_err(e->err, "etcd key of %zu bytes (1 to %d)", key_len,
            EMBPS_ETCD_KEY_MAX);
    return -EMSGSIZE;
  }
  if (value_len > EMBPS_ETCD_VALUE_MAX) {
    set_err(e->err, "etcd value of %zu bytes (at most %d)", value_len,
            EMBPS_ETCD_VALUE_MAX);
    return -EMSGSIZE;
  }
  return 0;
}

/* Where a response is taken apart: errors go to err, naming who
 * (the endpoint). */
typedef struct {
  char *err;
  const char *who;
} site_t;

static int bad_at(site_t at, const char *path, const char *what) {
  set_err(at.err, "etcd %s: %s: unexpected response (%s)", at.who, path,
          what);
  return -EPROTO;
}

static site_t site_of(embps_etcd_t *e) {
  return (site_t){e->err, e->ep[e->cur].name};
}

static int bad_reply(embps_etcd_t *e, const char *path, const char *what) {
  return bad_at(site_of(e), path, what);
}

/* An optional int64 member (absent: 0). */
static int opt_int64(const embps_json_t *d, int obj, const char *key,
                     int64_t *out) {
  int t = embps_json_get(d, obj, key);
  *out = 0;
  return t < 0 ? 0 : embps_json_int64(d, t, out);
}

/* ---- keys in responses ---- */

void embps_etcd_kvs_free(embps_etcd_kvs_t *kvs) {
  if (!kvs)
    return;
  for (size_t i = 0; i < kvs->n; i++) {
    free(kvs->v[i].key);
    free(kvs->v[i].value);
  }
  free(kvs->v);
  memset(kvs, 0, sizeof *kvs);
}

/* Base64 member name of obj into a new buffer of at most max bytes. */
static int get_bytes(site_t at, const embps_json_t *d, int obj,
                     const char *name, size_t max, char **out, size_t *len) {
  int t = embps_json_get(d, obj, name);
  *out = NULL;
  *len = 0;
  size_t cap = t < 0 ? 0 : (size_t)d->tok[t].len / 4 * 3;
  if (t >= 0 && d->tok[t].type != EMBPS_JSON_STRING)
    return bad_at(at, "kv", name);
  if (cap > max + 2) {
    set_err(at.err, "etcd %s: a %s of about %zu bytes (at most %zu taken)",
            at.who, name, cap, max);
    return -EMSGSIZE;
  }
  char *p = malloc(cap + 1);
  if (!p) {
    set_err(at.err, "out of memory");
    return -ENOMEM;
  }
  if (t >= 0 && embps_json_base64(d, t, (uint8_t *)p, cap, len)) {
    free(p);
    return bad_at(at, "kv", "a key or value that is not base64");
  }
  if (*len > max) {
    free(p);
    set_err(at.err, "etcd %s: a %s of %zu bytes (at most %zu taken)", at.who,
            name, *len, max);
    return -EMSGSIZE;
  }
  p[*len] = 0;
  *out = p;
  return 0;
}

static int parse_kv(site_t at, const embps_json_t *d, int t,
                    embps_etcd_kv_t *kv) {
  memset(kv, 0, sizeof *kv);
  if (t < 0 || d->tok[t].type != EMBPS_JSON_OBJECT)
    return bad_at(at, "kv", "not an object");
  int rc = get_bytes(at, d, t, "key", EMBPS_ETCD_KEY_MAX, &kv->key,
                     &kv->key_len);
  if (!rc)
    rc = get_bytes(at, d, t, "value", EMBPS_ETCD_VALUE_MAX, &kv->value,
                   &kv->value_len);
  if (!rc && (opt_int64(d, t, "create_revision", &kv->create_rev) ||
              opt_int64(d, t, "mod_revision", &kv->mod_rev) ||
              opt_int64(d, t, "version", &kv->version) ||
              opt_int64(d, t, "lease", &kv->lease)))
    rc = bad_at(at, "kv", "a revision that is not an integer");
  if (rc) {
    free(kv->key);
    free(kv->value);
    memset(kv, 0, sizeof *kv);
  }
  return rc;
}

/* Appends the keys of range response r to kvs. */
static int parse_range(embps_etcd_t *e, const embps_json_t *d, int r,
                       embps_etcd_kvs_t *kvs) {
  int arr = embps_json_get(d, r, "kvs");
  int more = embps_json_get(d, r, "more");
  if (more >= 0) {
    int m = 0;
    embps_json_bool(d, more, &m);
    kvs->more |= m;
  }
  if (arr < 0)
    return 0;
  if (d->tok[arr].type != EMBPS_JSON_ARRAY)
    return bad_reply(e, "range", "kvs is not an array");
  size_t n = d->tok[arr].n;
  if (n > EMBPS_ETCD_KVS_MAX * EMBPS_ETCD_TXN_MAX - kvs->n) {
    set_err(e->err, "etcd %s: %zu keys in one response (at most %d taken)",
            e->ep[e->cur].name, n, EMBPS_ETCD_KVS_MAX);
    return -EMSGSIZE;
  }
  embps_etcd_kv_t *v = realloc(kvs->v, (kvs->n + n) * sizeof *v + 1);
  if (!v) {
    set_err(e->err, "out of memory");
    return -ENOMEM;
  }
  kvs->v = v;
  for (int t = embps_json_first(d, arr); t >= 0; t = embps_json_next(d, arr, t)) {
    int rc = parse_kv(site_of(e), d, t, &kvs->v[kvs->n]);
    if (rc)
      return rc;
    kvs->n++;
  }
  return 0;
}

static int64_t header_revision(const embps_json_t *d, int obj) {
  int64_t rev = 0;
  opt_int64(d, embps_json_get(d, obj, "header"), "revision", &rev);
  return rev;
}

/* ---- leases ---- */

int embps_etcd_lease_grant(embps_etcd_t *e, int64_t ttl_s, int64_t *id,
                           int64_t *ttl_s_out) {
  embps_json_t d;
  int rc = call_int(e, "/v3/lease/grant", "TTL", ttl_s, &d);
  if (rc)
    return rc;
  int64_t ttl = 0;
  *id = 0;
  if (opt_int64(&d, 0, "ID", id) || opt_int64(&d, 0, "TTL", &ttl) || !*id ||
      ttl <= 0)
    rc = bad_reply(e, "/v3/lease/grant", "no lease ID or TTL");
  embps_json_free(&d);
  if (ttl_s_out)
    *ttl_s_out = ttl;
  return rc;
}

int embps_etcd_lease_keepalive(embps_etcd_t *e, int64_t id,
                               int64_t *ttl_s_out) {
  embps_json_t d;
  int rc = call_int(e, "/v3/lease/keepalive", "ID", id, &d);
  if (rc)
    return rc;
  int res = embps_json_get(&d, 0, "result");
  int64_t ttl = 0;
  if (res < 0 || opt_int64(&d, res, "TTL", &ttl)) {
    rc = bad_reply(e, "/v3/lease/keepalive", "no result");
  } else if (ttl <= 0) { /* etcd answers a TTL of 0 for a lease it lost */
    set_err(e->err, "etcd %s: lease %" PRIx64 " not found (expired or "
            "revoked)", e->ep[e->cur].name, (uint64_t)id);
    rc = -ENOENT;
  }
  embps_json_free(&d);
  if (ttl_s_out)
    *ttl_s_out = ttl;
  return rc;
}

int embps_etcd_lease_revoke(embps_etcd_t *e, int64_t id) {
  embps_json_t d;
  int rc = call_int(e, "/v3/lease/revoke", "ID", id, &d);
  if (!rc)
    embps_json_free(&d);
  return rc;
}

/* ---- keys ---- */

void embps_etcd_prefix_end(const void *key, size_t key_len, uint8_t *end,
                           size_t *len) {
  const uint8_t *k = key;
  for (size_t i = key_len; i-- > 0;) {
    if (k[i] != 0xff) {
      memcpy(end, k, i);
      end[i] = (uint8_t)(k[i] + 1);
      *len = i + 1;
      return;
    }
  }
  end[0] = 0; /* every key */
  *len = 1;
}

/* "key" and, with prefix, "range_end" members. */
static void put_key(embps_jw_t *w, const void *key, size_t key_len,
                    int prefix) {
  embps_jw_key(w, "key");
  embps_jw_base64(w, key, key_len);
  if (prefix) {
    uint8_t end[EMBPS_ETCD_KEY_MAX];
    size_t n;
    embps_etcd_prefix_end(key, key_len, end, &n);
    embps_jw_key(w, "range_end");
    embps_jw_base64(w, end, n);
  }
}

static void put_range_body(embps_jw_t *w, const void *key, size_t key_len,
                           int prefix) {
  embps_jw_obj(w);
  put_key(w, key, key_len, prefix);
  embps_jw_key(w, "limit");
  embps_jw_int64(w, EMBPS_ETCD_KVS_MAX);
  embps_jw_obj_end(w);
}

/* The body of a range [key, end) at revision rev (0: the latest). */
static void put_between_body(embps_jw_t *w, const void *key, size_t key_len,
                             const void *end, size_t end_len, int64_t rev) {
  embps_jw_obj(w);
  embps_jw_key(w, "key");
  embps_jw_base64(w, key, key_len);
  embps_jw_key(w, "range_end");
  embps_jw_base64(w, end, end_len);
  embps_jw_key(w, "limit");
  embps_jw_int64(w, EMBPS_ETCD_KVS_MAX);
  if (rev > 0) {
    embps_jw_key(w, "revision");
    embps_jw_int64(w, rev);
  }
  embps_jw_obj_end(w);
}

static void put_put_body(embps_jw_t *w, const void *key, size_t key_len,
                         const void *value, size_t value_len, int64_t lease) {
  embps_jw_obj(w);
  put_key(w, key, key_len, 0);
  embps_jw_key(w, "value");
  embps_jw_base64(w, value, value_len);
  if (lease) {
    embps_jw_key(w, "lease");
    embps_jw_int64(w, lease);
  }
  embps_jw_obj_end(w);
}

int embps_etcd_range(embps_etcd_t *e, const void *key, size_t key_len,
                     int prefix, embps_etcd_kvs_t *out) {
  memset(out, 0, sizeof *out);
  int rc = check_sizes(e, key_len, 0);
  if (rc)
    return rc;
  embps_jw_t w;
  embps_jw_init(&w, BODY_MAX);
  put_range_body(&w, key, key_len, prefix);
  embps_json_t d;
  if ((rc = call_jw(e, "/v3/kv/range", &w, &d)))
    return rc;
  out->revision = header_revision(&d, 0);
  rc = parse_range(e, &d, 0, out);
  embps_json_free(&d);
  if (rc)
    embps_etcd_kvs_free(out);
  return rc;
}

int embps_etcd_range_between(embps_etcd_t *e, const void *key,
                             size_t key_len, const void *end, size_t end_len,
                             int64_t rev, embps_etcd_kvs_t *out) {
  memset(out, 0, sizeof *out);
  int rc = check_sizes(e, key_len > end_len ? key_len : end_len, 0);
  if (rc)
    return rc;
  embps_jw_t w;
  embps_jw_init(&w, BODY_MAX);
  put_between_body(&w, key, key_len, end, end_len, rev);
  embps_json_t d;
  if ((rc = call_jw(e, "/v3/kv/range", &w, &d)))
    return rc;
  out->revision = header_revision(&d, 0);
  rc = parse_range(e, &d, 0, out);
  embps_json_free(&d);
  if (rc)
    embps_etcd_kvs_free(out);
  return rc;
}

int embps_etcd_put(embps_etcd_t *e, const void *key, size_t key_len,
                   const void *value, size_t value_len, int64_t lease,
                   int64_t *rev) {
  int rc = check_sizes(e, key_len, value_len);
  if (rc)
    return rc;
  embps_jw_t w;
  embps_jw_init(&w, BODY_MAX);
  put_put_body(&w, key, key_len, value, value_len, lease);
  embps_json_t d;
  if ((rc = call_jw(e, "/v3/kv/put", &w, &d)))
    return rc;
  if (rev)
    *rev = header_revision(&d, 0);
  embps_json_free(&d);
  return 0;
}

int embps_etcd_delete(embps_etcd_t *e, const void *key, size_t key_len,
                      int prefix, int64_t *deleted) {
  int rc = check_sizes(e, key_len, 0);
  if (rc)
    return rc;
  embps_jw_t w;
  embps_jw_init(&w, BODY_MAX);
  embps_jw_obj(&w);
  put_key(&w, key, key_len, prefix);
  embps_jw_obj_end(&w);
  embps_json_t d;
  if ((rc = call_jw(e, "/v3/kv/deleterange", &w, &d)))
    return rc;
  int64_t n = 0;
  if (opt_int64(&d, 0, "deleted", &n))
    rc = bad_reply(e, "/v3/kv/deleterange", "deleted is not an integer");
  if (deleted)
    *deleted = n;
  embps_json_free(&d);
  return rc;
}

/* ---- transactions ---- */

static void put_ops(embps_jw_t *w, const char *name, const embps_etcd_op_t *op,
                    size_t n) {
  embps_jw_key(w, name);
  embps_jw_arr(w);
  for (size_t i = 0; i < n; i++) {
    embps_jw_obj(w);
    switch (op[i].kind) {
    case EMBPS_ETCD_OP_PUT:
      embps_jw_key(w, "request_put");
      put_put_body(w, op[i].key, op[i].key_len, op[i].value, op[i].value_len,
                   op[i].lease);
      break;
    case EMBPS_ETCD_OP_RANGE:
      embps_jw_key(w, "request_range");
      put_range_body(w, op[i].key, op[i].key_len, op[i].prefix);
      break;
    case EMBPS_ETCD_OP_DELETE:
      embps_jw_key(w, "request_delete_range");
      embps_jw_obj(w);
      put_key(w, op[i].key, op[i].key_len, op[i].prefix);
      embps_jw_obj_end(w);
      break;
    }
    embps_jw_obj_end(w);
  }
  embps_jw_arr_end(w);
}

static int check_ops(embps_etcd_t *e, const embps_etcd_op_t *op, size_t n) {
  if (n > EMBPS_ETCD_TXN_MAX) {
    set_err(e->err, "etcd transaction of %zu operations (at most %d)", n,
            EMBPS_ETCD_TXN_MAX);
    return -EINVAL;
  }
  for (size_t i = 0; i < n; i++) {
    int rc = check_sizes(e, op[i].key_len,
                         op[i].kind == EMBPS_ETCD_OP_PUT ? op[i].value_len : 0);
    if (rc)
      return rc;
  }
  return 0;
}

int embps_etcd_txn(embps_etcd_t *e, const embps_etcd_cmp_t *cmp, size_t n_cmp,
                   const embps_etcd_op_t *then, size_t n_then,
                   const embps_etcd_op_t *otherwise, size_t n_otherwise,
                   int *succeeded, embps_etcd_kvs_t *kvs) {
  static const char *const targets[] = {"CREATE", "MOD", "VERSION"};
  static const char *const fields[] = {"create_revision", "mod_revision",
                                       "version"};
  static const char *const results[] = {"EQUAL", "GREATER", "LESS",
                                        "NOT_EQUAL"};
  if (kvs)
    memset(kvs, 0, sizeof *kvs);
  *succeeded = 0;
  int rc;
  if (n_cmp > EMBPS_ETCD_TXN_MAX) {
    set_err(e->err, "etcd transaction of %zu compares (at most %d)", n_cmp,
            EMBPS_ETCD_TXN_MAX);
    return -EINVAL;
  }
  for (size_t i = 0; i < n_cmp; i++)
    if ((rc = check_sizes(e, cmp[i].key_len, 0)))
      return rc;
  if ((rc = check_ops(e, then, n_then)) ||
      (rc = check_ops(e, otherwise, n_otherwise)))
    return rc;
  embps_jw_t w;
  embps_jw_init(&w, BODY_MAX);
  embps_jw_obj(&w);
  embps_jw_key(&w, "compare");
  embps_jw_arr(&w);
  for (size_t i = 0; i < n_cmp; i++) {
    embps_jw_obj(&w);
    put_key(&w, cmp[i].key, cmp[i].key_len, cmp[i].prefix);
    embps_jw_key(&w, "target");
    embps_jw_str(&w, targets[cmp[i].target], strlen(targets[cmp[i].target]));
    embps_jw_key(&w, "result");
    embps_jw_str(&w, results[cmp[i].result], strlen(results[cmp[i].result]));
    embps_jw_key(&w, fields[cmp[i].target]);
    embps_jw_int64(&w, cmp[i].number);
    embps_jw_obj_end(&w);
  }
  embps_jw_arr_end(&w);
  put_ops(&w, "success", then, n_then);
  put_ops(&w, "failure", otherwise, n_otherwise);
  embps_jw_obj_end(&w);
  embps_json_t d;
  if ((rc = call_jw(e, "/v3/kv/txn", &w, &d)))
    return rc;
  int s = embps_json_get(&d, 0, "succeeded");
  if (s >= 0 && embps_json_bool(&d, s, succeeded))
    rc = bad_reply(e, "/v3/kv/txn", "succeeded is not a boolean");
  if (!rc && kvs) {
    kvs->revision = header_revision(&d, 0);
    int arr = embps_json_get(&d, 0, "responses");
    for (int t = embps_json_first(&d, arr); t >= 0 && !rc;
         t = embps_json_next(&d, arr, t)) {
      int r = embps_json_get(&d, t, "response_range");
      if (r >= 0)
        rc = parse_range(e, &d, r, kvs);
    }
    if (rc)
      embps_etcd_kvs_free(kvs);
  }
  embps_json_free(&d);
  return rc;
}

int embps_etcd_create_or_get(embps_etcd_t *e, const void *key, size_t key_len,
                             const void *value, size_t value_len,
                             int64_t lease, int *created,
                             embps_etcd_kvs_t *kvs) {
  const embps_etcd_cmp_t cmp = {.key = key, .key_len = key_len,
                                .target = EMBPS_ETCD_CREATE,
                                .result = EMBPS_ETCD_EQUAL, .number = 0};
  const embps_etcd_op_t put = {.kind = EMBPS_ETCD_OP_PUT, .key = key,
                               .key_len = key_len, .value = value,
                               .value_len = value_len, .lease = lease};
  const embps_etcd_op_t get = {.kind = EMBPS_ETCD_OP_RANGE, .key = key,
                               .key_len = key_len};
  return embps_etcd_txn(e, &cmp, 1, &put, 1, &get, 1, created, kvs);
}

/* ---- watches ---- */

struct embps_etcd_watch {
  CURLM *multi;
  CURL *easy;
  struct curl_slist *headers;
  buf_t in; /* received, not yet taken apart */
  embps_etcd_event_t *q;
  size_t q_head, q_n, q_cap;
  int created, ended, end_rc, paused, over;
  int64_t compacted;
  atomic_int woken;
  char name[280];
  char curl_err[CURL_ERROR_SIZE];
  char err[EMBPS_ETCD_ERR_MAX];
};

void embps_etcd_event_free(embps_etcd_event_t *ev) {
  free(ev->kv.key);
  free(ev->kv.value);
  memset(ev, 0, sizeof *ev);
}

static size_t on_watch_data(char *ptr, size_t size, size_t n, void *ud) {
  embps_etcd_watch_t *w = ud;
  size_t bytes = size * n;
  if (bytes > w->in.max - w->in.len) {
    /* full: wait while whole messages are taken out, or give up on one
       larger than the buffer */
    if (embps_json_frame(w->in.p, w->in.len) > 0) {
      w->paused = 1;
      return CURL_WRITEFUNC_PAUSE;
    }
    w->over = 1;
    return 0;
  }
  return buf_append(&w->in, ptr, bytes) ? 0 : bytes;
}

static void watch_end(embps_etcd_watch_t *w, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void watch_end(embps_etcd_watch_t *w, int rc, const char *fmt, ...) {
  if (w->ended)
    return;
  w->ended = 1;
  w->end_rc = rc;
  char msg[EMBPS_ETCD_ERR_MAX - 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  set_err(w->err, "etcd %s: watch: %s", w->name, msg);
}

static int queue_event(embps_etcd_watch_t *w, embps_etcd_event_t *ev) {
  if (w->q_head + w->q_n == w->q_cap) {
    if (w->q_head) { /* slide the pending ones to the front */
      memmove(w->q, w->q + w->q_head, w->q_n * sizeof *w->q);
      w->q_head = 0;
    }
    if (w->q_n == w->q_cap) {
      size_t cap = w->q_cap ? w->q_cap * 2 : 16;
      embps_etcd_event_t *q = realloc(w->q, cap * sizeof *q);
      if (!q)
        return -ENOMEM;
      w->q = q;
      w->q_cap = cap;
    }
  }
  w->q[w->q_head + w->q_n++] = *ev;
  return 0;
}

/* One message of the stream (text[0, len)). */
static void watch_message(embps_etcd_watch_t *w, const char *text, size_t len) {
  embps_json_t d;
  char perr[160];
  if (embps_json_parse(&d, text, len, TOKENS_MAX, perr, sizeof perr)) {
    watch_end(w, -EPROTO, "a message that is not JSON (%s)", perr);
    return;
  }
  int64_t code;
  char msg[300];
  int res = embps_json_get(&d, 0, "result");
  if (grpc_error(&d, &code, msg, sizeof msg)) {
    watch_end(w, errno_of_grpc(code), "%s (gRPC code %" PRId64 ")", msg, code);
  } else if (res < 0) {
    watch_end(w, -EPROTO, "a message without a result");
  } else {
    int t, flag = 0;
    if ((t = embps_json_get(&d, res, "created")) >= 0 &&
        !embps_json_bool(&d, t, &flag) && flag)
      w->created = 1;
    int arr = embps_json_get(&d, res, "events");
    for (int ev_t = embps_json_first(&d, arr); ev_t >= 0 && !w->ended;
         ev_t = embps_json_next(&d, arr, ev_t)) {
      embps_etcd_event_t ev = {0};
      int type = embps_json_get(&d, ev_t, "type");
      ev.kind = type >= 0 && embps_json_eq(&d, type, "DELETE")
                    ? EMBPS_ETCD_EV_DELETE
                    : EMBPS_ETCD_EV_PUT;
      char kv_err[EMBPS_ETCD_ERR_MAX];
      int rc = parse_kv((site_t){kv_err, w->name}, &d,
                        embps_json_get(&d, ev_t, "kv"), &ev.kv);
      if (!rc && (rc = queue_event(w, &ev))) {
        embps_etcd_event_free(&ev);
        snprintf(kv_err, sizeof kv_err, "out of memory");
      }
      if (rc)
        watch_end(w, rc, "%s", kv_err);
    }
    flag = 0;
    if ((t = embps_json_get(&d, res, "canceled")) >= 0 &&
        !embps_json_bool(&d, t, &flag) && flag) {
      opt_int64(&d, res, "compact_revision", &w->compacted);
      char reason[200] = "";
      embps_json_string(&d, embps_json_get(&d, res, "cancel_reason"), reason,
                        sizeof reason, NULL);
      char shown[300];
      embps_escape(reason, shown, sizeof shown);
      if (w->compacted)
        watch_end(w, -ECANCELED, "cancelled: revisions before %" PRId64
                  " were compacted", w->compacted);
      else
        watch_end(w, -ECANCELED, "cancelled by etcd (%s)",
                  shown[0] ? shown : "no reason given");
    }
  }
  embps_json_free(&d);
}

/* Takes every whole message out of w->in. */
static void watch_take(embps_etcd_watch_t *w) {
  size_t off = 0;
  while (!w->ended) {
    long n = embps_json_frame(w->in.p + off, w->in.len - off);
    if (n < 0) {
      watch_end(w, -EPROTO, "the stream is not a sequence of JSON objects");
      break;
    }
    if (!n)
      break;
    watch_message(w, w->in.p + off, (size_t)n);
    off += (size_t)n;
  }
  if (off) {
    memmove(w->in.p, w->in.p + off, w->in.len - off);
    w->in.len -= off;
    w->in.p[w->in.len] = 0;
  }
}

/* Runs the transfer until an event is queued (1), deadline_ms passes or
 * the watch is woken (0), or it ends (its code). until_created: return 1
 * once etcd confirmed the watch instead. */
static int watch_pump(embps_etcd_watch_t *w, uint64_t deadline_ms,
                      int until_created) {
  for (;;) {
    if (until_created ? w->created : w->q_n > 0)
      return 1;
    if (w->ended)
      return w->end_rc;
    if (w->paused) {
      w->paused = 0;
      curl_easy_pause(w->easy, CURLPAUSE_CONT);
    }
    int running = 0;
    size_t before = w->in.len;
    curl_multi_perform(w->multi, &running);
    if (w->in.len != before)
      watch_take(w);
    int left_msgs;
    CURLMsg *m;
    while ((m = curl_multi_info_read(w->multi, &left_msgs))) {
      if (m->msg != CURLMSG_DONE)
        continue;
      watch_take(w);
      if (w->over)
        watch_end(w, -EMSGSIZE, "a message larger than %u bytes",
                  EMBPS_ETCD_REPLY_MAX);
      else if (m->data.result != CURLE_OK)
        watch_end(w, m->data.result == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT
                                                                : -ECONNRESET,
                  "%s", w->curl_err[0] ? w->curl_err
                                       : curl_easy_strerror(m->data.result));
      else
        watch_end(w, -ECONNRESET, "the stream was closed");
    }
    if (until_created ? w->created : w->q_n > 0)
      return 1;
    if (w->ended)
      continue;
    if (atomic_exchange(&w->woken, 0))
      return 0;
    const uint64_t now = now_ms();
    if (now >= deadline_ms)
      return 0;
    uint64_t left = deadline_ms - now;
    curl_multi_poll(w->multi, NULL, 0, (int)(left > 1000 ? 1000 : left), NULL);
  }
}

void embps_etcd_watch_close(embps_etcd_watch_t *w) {
  if (!w)
    return;
  if (w->multi && w->easy)
    curl_multi_remove_handle(w->multi, w->easy);
  if (w->easy)
    curl_easy_cleanup(w->easy);
  if (w->multi)
    curl_multi_cleanup(w->multi);
  curl_slist_free_all(w->headers);
  for (size_t i = 0; i < w->q_n; i++)
    embps_etcd_event_free(&w->q[w->q_head + i]);
  free(w->q);
  free(w->in.p);
  free(w);
}

/* One try at endpoint ep: 0 once created, or a code with w->err. */
static int watch_try(embps_etcd_t *e, const endpoint_t *ep, const char *body,
                     size_t body_len, uint64_t deadline,
                     embps_etcd_watch_t **out) {
  embps_etcd_watch_t *w = calloc(1, sizeof *w);
  if (!w)
    return -ENOMEM;
  snprintf(w->name, sizeof w->name, "%s", ep->name);
  w->in.max = EMBPS_ETCD_REPLY_MAX;
  w->multi = curl_multi_init();
  w->easy = curl_easy_init();
  w->headers = curl_slist_append(NULL, "Content-Type: application/json");
  if (!w->multi || !w->easy || !w->headers) {
    embps_etcd_watch_close(w);
    return -ENOMEM;
  }
  char url[sizeof ep->base + 16];
  snprintf(url, sizeof url, "%s/v3/watch", ep->base);
  common_opts(w->easy, w->headers, w->curl_err);
  curl_easy_setopt(w->easy, CURLOPT_URL, url);
  curl_easy_setopt(w->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
  curl_easy_setopt(w->easy, CURLOPT_COPYPOSTFIELDS, body);
  const uint64_t now = now_ms();
  curl_easy_setopt(w->easy, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(deadline > now + 10 ? deadline - now : 10));
  /* a stream lives on: a peer gone silent is found by TCP keepalives
     (and by the coordinator's own calls) */
  curl_easy_setopt(w->easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(w->easy, CURLOPT_TCP_KEEPIDLE, 2L);
  curl_easy_setopt(w->easy, CURLOPT_TCP_KEEPINTVL, 1L);
  curl_easy_setopt(w->easy, CURLOPT_WRITEFUNCTION, on_watch_data);
  curl_easy_setopt(w->easy, CURLOPT_WRITEDATA, w);
  curl_multi_add_handle(w->multi, w->easy);
  int rc = watch_pump(w, deadline, 1);
  if (rc == 1) {
    *out = w;
    return 0;
  }
  if (rc == 0)
    watch_end(w, -ETIMEDOUT, "not confirmed in time");
  rc = w->end_rc;
  set_err(e->err, "%s", w->err);
  embps_etcd_watch_close(w);
  return rc;
}

int embps_etcd_watch_open(embps_etcd_t *e, const void *key, size_t key_len,
                          int prefix, int64_t start_rev,
                          embps_etcd_watch_t **out) {
  *out = NULL;
  int rc = check_sizes(e, key_len, 0);
  if (rc)
    return rc;
  embps_jw_t jw;
  embps_jw_init(&jw, BODY_MAX);
  embps_jw_obj(&jw);
  embps_jw_key(&jw, "create_request");
  embps_jw_obj(&jw);
  put_key(&jw, key, key_len, prefix);
  if (start_rev > 0) {
    embps_jw_key(&jw, "start_revision");
    embps_jw_int64(&jw, start_rev);
  }
  embps_jw_obj_end(&jw);
  embps_jw_obj_end(&jw);
  char *body;
  size_t len;
  if (embps_jw_finish(&jw, &body, &len)) {
    set_err(e->err, "etcd watch: request too large");
    return -EMSGSIZE;
  }
  const uint64_t deadline = now_ms() + e->timeout_ms;
  char why[EMBPS_ETCD_ERR_MAX] = "";
  size_t why_len = 0;
  rc = -ETIMEDOUT;
  for (size_t k = 0; k < e->n_ep && now_ms() < deadline; k++) {
    const size_t i = (e->cur + k) % e->n_ep;
    rc = watch_try(e, &e->ep[i], body, len, deadline, out);
    if (!rc) {
      e->cur = i;
      break;
    }
    why_len += (size_t)snprintf(why + why_len, sizeof why - why_len, "%s%s",
                                why_len ? "; " : "", e->err);
    if (why_len >= sizeof why)
      why_len = sizeof why - 1;
    if (rc == -ECANCELED || rc == -EINVAL || rc == -ERANGE)
      break; /* etcd's answer, the same from every member */
  }
  free(body);
  if (rc)
    set_err(e->err, "%s", why[0] ? why : "etcd watch: no time left");
  return rc;
}

int embps_etcd_watch_next(embps_etcd_watch_t *w, uint32_t timeout_ms,
                          embps_etcd_event_t *ev) {
  int rc = watch_pump(w, now_ms() + timeout_ms, 0);
  if (rc != 1)
    return rc;
  *ev = w->q[w->q_head++];
  if (!--w->q_n)
    w->q_head = 0;
  return 1;
}

void embps_etcd_watch_wakeup(embps_etcd_watch_t *w) {
  atomic_store(&w->woken, 1);
  curl_multi_wakeup(w->multi);
}

const char *embps_etcd_watch_error(const embps_etcd_watch_t *w) {
  return w->err;
}

int64_t embps_etcd_watch_compacted(const embps_etcd_watch_t *w) {
  return w->compacted;
}
