/* cli.h - the parts of the embps CLI that live in their own files. */
#ifndef EMBPS_CLI_H
#define EMBPS_CLI_H
#include <stdint.h>

#include "embps/embps.h"

/* `embps bench ...`: argv holds the arguments after "bench". Returns the
 * process exit status. */
int embps_cli_bench(const embps_client_options_t *copts, int argc,
                    char **argv);
/* create-table's admission and eviction options (cli_dyn.c): 1 if `a`
 * with value v was one (spec set), 0 if not one of them, -1 bad value. */
int embps_cli_dyn_option(const char *a, const char *v,
                         embps_table_spec_t *spec);
/* `tables`: the table's admission and eviction settings and counters, as
 * JSON members (json) or indented lines (none when the table has none). */
void embps_cli_dyn_print(const embps_table_info_t *x, int json);
/* `embps backup --out DIR` (cli_backup.c): every member of the cluster,
 * or member `member` (< the servers listed). The process exit status. */
int embps_cli_backup(const embps_client_options_t *copts, uint32_t member,
                     int argc, char **argv);
/* `embps evict NAME`: the process exit status. */
int embps_cli_dyn_evict(embps_client_t *c, int argc, char **argv);
#endif
