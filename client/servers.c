/* servers.c - the server list a client is given (EMBPS_SERVERS, --servers,
 * embps_client_options_t.servers): members in cluster order, separated by
 * commas, each one server or the `|`-separated servers of one member (its
 * primary and its followers, in any order):
 *
 *   a:7070|b:7070,c:7070|d:7070     two members of two servers each
 *
 * Parsing makes one member_t per entry and one connection per member, to
 * its primary: an entry of one server is a seed like any other (a follower
 * there sends the client to the primary it names), unless the client was
 * made servers_as_listed (tools addressing one server: the connection is
 * then to that server, whatever its role); a client reading from
 * followers gets a second connection for each member that lists more than
 * one server.
 * Every refusal names the entry and what is wrong with it; nothing is
 * connected before the whole list is good. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "embps/embps.h"
#include "internal.h"
#include "util.h"

#define MAX_MEMBERS 1024
/* The longest list read at all: every member with every server at the
 * longest address. */
#define LIST_MAX ((size_t)MAX_MEMBERS * EMBPS_MEMBER_SERVERS_MAX * 300)

/* Parses one entry (item, len bytes: "h:p" or "h:p|h:p...") into m. */
static int parse_member(member_t *m, uint32_t index, const char *item,
                        size_t len, char *err, size_t err_len) {
  uint32_t n = 1;
  for (size_t i = 0; i < len; i++)
    n += item[i] == '|';
  if (n > EMBPS_MEMBER_SERVERS_MAX) {
    snprintf(err, err_len, "server list entry %u (\"%.*s\") lists %u "
             "servers; a member has at most %d", index, (int)(len > 200 ? 200
             : len), item, n, EMBPS_MEMBER_SERVERS_MAX);
    return EMBPS_EINVAL;
  }
  m->alt = calloc(n + 1, sizeof *m->alt); /* + a primary learnt later */
  if (!m->alt) {
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
  }
  const char *p = item, *end = item + len;
  for (uint32_t i = 0; i < n; i++) {
    const char *bar = memchr(p, '|', (size_t)(end - p));
    size_t l = bar ? (size_t)(bar - p) : (size_t)(end - p);
    embps_server_addr_t *a = &m->alt[i];
    if (l == 0 || l >= sizeof a->addr) {
      snprintf(err, err_len, "server list entry %u (\"%.*s\"): %s", index,
               (int)(len > 200 ? 200 : len), item,
               l ? "an address longer than 299 bytes" : "an empty address");
      return EMBPS_EINVAL;
    }
    memcpy(a->addr, p, l);
    a->addr[l] = 0;
    if (embps_parse_hostport(a->addr, a->host, sizeof a->host, &a->port)) {
      snprintf(err, err_len, "server list entry %u: \"%s\" is not HOST:PORT",
               index, a->addr);
      return EMBPS_EINVAL;
    }
    for (uint32_t j = 0; j < i; j++) {
      if (strcmp(m->alt[j].addr, a->addr) == 0) {
        snprintf(err, err_len, "server list entry %u lists \"%s\" twice",
                 index, a->addr);
        return EMBPS_EINVAL;
      }
    }
    p = bar ? bar + 1 : end;
  }
  m->n_listed = m->n_alt = n;
  return 0;
}

/* Sets up connection k of member i, wanting `want`, at its first server. */
static void conn_init(embps_client_t *c, conn_t *k, uint32_t i, int want) {
  k->fd = -1;
  k->client = c;
  k->index = i;
  k->m = &c->members[i];
  k->want = want;
  k->alt = 0;
  snprintf(k->host, sizeof k->host, "%s", k->m->alt[0].host);
  k->port = k->m->alt[0].port;
  snprintf(k->addr, sizeof k->addr, "%s", k->m->alt[0].addr);
}

int embps_servers_parse_(embps_client_t *c, const char *list, char *err,
                         size_t err_len) {
  size_t total = strnlen(list, LIST_MAX + 1);
  if (total > LIST_MAX) {
    snprintf(err, err_len, "server list longer than %zu bytes", LIST_MAX);
    return EMBPS_EINVAL;
  }
  uint32_t n = 1;
  for (const char *p = list; *p; p++)
    n += *p == ',';
  if (n > MAX_MEMBERS) {
    snprintf(err, err_len, "more than %d servers", MAX_MEMBERS);
    return EMBPS_EINVAL;
  }
  c->members = calloc(n, sizeof *c->members);
  if (!c->members) {
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
  }
  const char *p = list;
  for (uint32_t i = 0; i < n; i++) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    if (len == 0) {
      snprintf(err, err_len, "server list entry %u is empty (\"%.200s\")",
               i, list);
      return EMBPS_EINVAL;
    }
    c->n = i + 1; /* freed by embps_servers_free_, even half made */
    int rc = parse_member(&c->members[i], i, p, len, err, err_len);
    if (rc)
      return rc;
    p = end ? end + 1 : p + len;
  }
  uint32_t n_conns = n + (c->read_from == EMBPS_READ_FOLLOWER ? n : 0);
  c->conns = calloc(n_conns, sizeof *c->conns);
  if (!c->conns) {
    snprintf(err, err_len, "out of memory");
    return -ENOMEM;
  }
  c->n_conns = n_conns;
  for (uint32_t i = 0; i < n; i++) {
    int multi = c->members[i].n_listed > 1;
    conn_init(c, &c->conns[i], i,
              multi || !c->servers_as_listed ? CONN_PRIMARY : CONN_ANY);
    if (n_conns > n)
      conn_init(c, &c->conns[n + i], i, multi ? CONN_FOLLOWER : CONN_ANY);
  }
  return 0;
}

void embps_servers_free_(embps_client_t *c) {
  for (uint32_t i = 0; c->members && i < c->n; i++)
    free(c->members[i].alt);
  free(c->members);
  free(c->conns);
  c->members = NULL;
  c->conns = NULL;
}

uint32_t embps_client_conn_for_(const embps_client_t *c, uint32_t s,
                                const embps_ticket_t *t) {
  if (t && t->reads && c->n_conns > c->n && c->members[s].n_listed > 1)
    return c->n + s;
  return s;
}
