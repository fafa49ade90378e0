/* registry.h - the tables of one server process, by name. Lookups hand out
 * a reference, so a table dropped while a request uses it lives until that
 * request lets go. */
#ifndef EMBPS_REGISTRY_H
#define EMBPS_REGISTRY_H
#include <pthread.h>
#include <stddef.h>

#include "table.h"

typedef struct {
  pthread_rwlock_t lock;
  embps_table_t **tables;
  size_t n, cap;
} embps_registry_t;

void embps_registry_init(embps_registry_t *r);
void embps_registry_close(embps_registry_t *r);
/* Creates a table from a spec that passed embps_table_spec_check, for a
 * server of a cluster of cluster_size servers (see embps_table_create:
 * dense tables of a cluster keep only this server's rows).
 * Returns 0, EMBPS_EEXIST, EMBPS_ELIMIT (max_tables reached) or -ENOMEM. */
int embps_registry_create(embps_registry_t *r, const embps_table_spec_t *spec,
                          uint32_t n_shards, uint32_t cluster_size,
                          size_t max_tables);
/* Returns 0 or EMBPS_ENOTABLE. */
int embps_registry_drop(embps_registry_t *r, const char *name);
/* A referenced table (release with embps_table_unref), or NULL. */
embps_table_t *embps_registry_get(embps_registry_t *r, const char *name);
/* Registers an existing table (restore), taking the caller's reference.
 * 0 or EMBPS_EEXIST / -ENOMEM (the reference stays the caller's). */
int embps_registry_add(embps_registry_t *r, embps_table_t *t);
/* Exchanges the tables of a and b (a follower installing a copy of its
 * primary: a lookup sees all the old tables or all the new ones). */
void embps_registry_swap(embps_registry_t *a, embps_registry_t *b);
/* Every table, referenced (*out malloc'd). 0 or -ENOMEM. */
int embps_registry_refs(embps_registry_t *r, embps_table_t ***out, size_t *n);
/* Infos of all tables, sorted by name; *out malloc'd. 0 or -ENOMEM. */
int embps_registry_list(embps_registry_t *r, embps_table_info_t **out,
                        size_t *n);
#endif
