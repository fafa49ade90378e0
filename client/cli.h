/* cli.h - the parts of the embps CLI that live in their own files. */
#ifndef EMBPS_CLI_H
#define EMBPS_CLI_H
#include <stdint.h>

#include "embps/embps.h"
#include "flags.h"

/* `embps bench`'s flags (cli_bench.c): for its parse and for --help. */
extern const embps_flag_group_t embps_cli_bench_groups[];
/* `embps bench ...`: argv[0] is "bench", its flags follow. Returns the
 * process exit status. */
int embps_cli_bench(const embps_client_options_t *copts, int argc,
                    char **argv);
/* create-table's admission and eviction flags (cli_dyn.c), setting an
 * embps_table_spec_t; bench takes them too. */
extern const embps_flag_t embps_cli_dyn_flags[];
/* `tables`: the table's admission and eviction settings and counters, as
 * JSON members (json) or indented lines (none when the table has none). */
void embps_cli_dyn_print(const embps_table_info_t *x, int json);
/* `embps backup --out DIR` (cli_backup.c) through client c: every member
 * of the cluster, or member `member` when it is < the servers listed. The
 * process exit status. */
int embps_cli_backup(embps_client_t *c, uint32_t member, const char *out);
/* `embps evict NAME`: the process exit status. */
int embps_cli_dyn_evict(embps_client_t *c, const char *name);
#endif
