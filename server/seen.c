/* seen.c - see seen.h. */
#include "seen.h"

#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "route.h"

void embps_seen_init(embps_seen_t *s) { memset(s, 0, sizeof *s); }

void embps_seen_close(embps_seen_t *s) {
  free(s->v);
  memset(s, 0, sizeof *s);
}

/* The slot of client: its own, or the empty one it would take. cap > 0. */
static embps_ckpt_seen_t *slot(const embps_seen_t *s, uint64_t client) {
  size_t mask = s->cap - 1;
  size_t h = embps_mix64(client) & mask;
  while (s->v[h].client && s->v[h].client != client)
    h = (h + 1) & mask;
  return &s->v[h];
}

int embps_seen_applied(const embps_seen_t *s, uint64_t client, uint64_t seq) {
  if (!client || !seq || !s->cap)
    return 0;
  const embps_ckpt_seen_t *e = slot(s, client);
  return e->client == client && seq <= e->seq;
}

/* Makes room for one more client: doubles the table (or resets it at
 * EMBPS_SEEN_MAX). 0, or -1 out of memory (the table unchanged, or empty
 * after a reset). */
static int grow(embps_seen_t *s) {
  size_t cap = s->cap ? 2 * s->cap : 1024;
  if (s->n >= EMBPS_SEEN_MAX) {
    LOG_WARN("exactly-once table full (%zu clients): reset", s->n);
    embps_seen_close(s);
    cap = 1024;
  }
  embps_ckpt_seen_t *v = calloc(cap, sizeof *v);
  if (!v)
    return -1;
  embps_seen_t old = *s;
  s->v = v;
  s->cap = cap;
  for (size_t i = 0; i < old.cap; i++)
    if (old.v[i].client)
      *slot(s, old.v[i].client) = old.v[i];
  free(old.v);
  return 0;
}

void embps_seen_record(embps_seen_t *s, uint64_t client, uint64_t seq) {
  if (!client) /* 0 marks an empty slot */
    return;
  if (s->n + 1 > s->cap / 2 && grow(s)) {
    LOG_WARN("no memory to remember client %llx",
             (unsigned long long)client);
    return;
  }
  embps_ckpt_seen_t *e = slot(s, client);
  if (!e->client) {
    e->client = client;
    s->n++;
  }
  e->seq = seq;
}

void embps_seen_note(embps_seen_t *s, uint64_t client, uint64_t seq) {
  if (!embps_seen_applied(s, client, seq))
    embps_seen_record(s, client, seq);
}

embps_ckpt_seen_t *embps_seen_copy(const embps_seen_t *s, size_t *n) {
  embps_ckpt_seen_t *v = malloc((s->n ? s->n : 1) * sizeof *v);
  *n = 0;
  for (size_t i = 0; v && i < s->cap; i++)
    if (s->v[i].client)
      v[(*n)++] = s->v[i];
  return v;
}

void embps_seen_move(embps_seen_t *dst, embps_seen_t *src) {
  embps_seen_close(dst);
  *dst = *src;
  embps_seen_init(src);
}
