/* registry.c - see registry.h. A small array under a rwlock: servers hold
 * tens of tables, and a lookup is a few string compares. */
#include "registry.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void embps_registry_init(embps_registry_t *r) {
  memset(r, 0, sizeof *r);
  pthread_rwlock_init(&r->lock, NULL);
}

void embps_registry_close(embps_registry_t *r) {
  for (size_t i = 0; i < r->n; i++)
    embps_table_unref(r->tables[i]);
  free(r->tables);
  pthread_rwlock_destroy(&r->lock);
}

static size_t find_locked(const embps_registry_t *r, const char *name) {
  for (size_t i = 0; i < r->n; i++)
    if (strcmp(embps_table_spec(r->tables[i])->name, name) == 0)
      return i;
  return SIZE_MAX;
}

/* Room for one more table. 0 or -ENOMEM. */
static int grow_locked(embps_registry_t *r) {
  if (r->n < r->cap)
    return 0;
  size_t cap = r->cap ? 2 * r->cap : 8;
  embps_table_t **v = realloc(r->tables, cap * sizeof *v);
  if (!v)
    return -ENOMEM;
  r->tables = v;
  r->cap = cap;
  return 0;
}

int embps_registry_create(embps_registry_t *r, const embps_table_spec_t *spec,
                          uint32_t n_shards, uint32_t cluster_size,
                          size_t max_tables) {
  embps_table_t *t;
  int rc = 0;
  pthread_rwlock_wrlock(&r->lock);
  if (find_locked(r, spec->name) != SIZE_MAX) {
    rc = EMBPS_EEXIST;
  } else if (r->n >= max_tables) {
    rc = EMBPS_ELIMIT;
  } else {
    rc = grow_locked(r);
  }
  if (!rc)
    rc = embps_table_create(spec, n_shards, cluster_size, &t);
  if (!rc)
    r->tables[r->n++] = t;
  pthread_rwlock_unlock(&r->lock);
  return rc;
}

int embps_registry_drop(embps_registry_t *r, const char *name) {
  embps_table_t *t = NULL;
  pthread_rwlock_wrlock(&r->lock);
  size_t i = find_locked(r, name);
  if (i != SIZE_MAX) {
    t = r->tables[i];
    r->tables[i] = r->tables[--r->n];
  }
  pthread_rwlock_unlock(&r->lock);
  if (!t)
    return EMBPS_ENOTABLE;
  embps_table_unref(t);
  return 0;
}

embps_table_t *embps_registry_get(embps_registry_t *r, const char *name) {
  embps_table_t *t = NULL;
  pthread_rwlock_rdlock(&r->lock);
  size_t i = find_locked(r, name);
  if (i != SIZE_MAX) {
    t = r->tables[i];
    embps_table_ref(t);
  }
  pthread_rwlock_unlock(&r->lock);
  return t;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const embps_table_info_t *)a)->spec.name,
                ((const embps_table_info_t *)b)->spec.name);
}

int embps_registry_list(embps_registry_t *r, embps_table_info_t **out,
                        size_t *n) {
  pthread_rwlock_rdlock(&r->lock);
  embps_table_info_t *v = calloc(r->n ? r->n : 1, sizeof *v);
  if (!v) {
    pthread_rwlock_unlock(&r->lock);
    return -ENOMEM;
  }
  for (size_t i = 0; i < r->n; i++)
    embps_table_info(r->tables[i], &v[i]);
  *n = r->n;
  pthread_rwlock_unlock(&r->lock);
  qsort(v, *n, sizeof *v, by_name);
  *out = v;
  return 0;
}

int embps_registry_add(embps_registry_t *r, embps_table_t *t) {
  int rc = 0;
  pthread_rwlock_wrlock(&r->lock);
  if (find_locked(r, embps_table_spec(t)->name) != SIZE_MAX)
    rc = EMBPS_EEXIST;
  else
    rc = grow_locked(r);
  if (!rc)
    r->tables[r->n++] = t;
  pthread_rwlock_unlock(&r->lock);
  return rc;
}

int embps_registry_refs(embps_registry_t *r, embps_table_t ***out,
                        size_t *n) {
  pthread_rwlock_rdlock(&r->lock);
  embps_table_t **v = malloc((r->n ? r->n : 1) * sizeof *v);
  if (!v) {
    pthread_rwlock_unlock(&r->lock);
    return -ENOMEM;
  }
  for (size_t i = 0; i < r->n; i++) {
    v[i] = r->tables[i];
    embps_table_ref(v[i]);
  }
  *n = r->n;
  pthread_rwlock_unlock(&r->lock);
  *out = v;
  return 0;
}

void embps_registry_swap(embps_registry_t *a, embps_registry_t *b) {
  pthread_rwlock_wrlock(&a->lock);
  pthread_rwlock_wrlock(&b->lock);
  embps_table_t **v = a->tables;
  size_t n = a->n, cap = a->cap;
  a->tables = b->tables;
  a->n = b->n;
  a->cap = b->cap;
  b->tables = v;
  b->n = n;
  b->cap = cap;
  pthread_rwlock_unlock(&b->lock);
  pthread_rwlock_unlock(&a->lock);
}
