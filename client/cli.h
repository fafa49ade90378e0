/* cli.h - the parts of the embps CLI that live in their own files. */
#ifndef EMBPS_CLI_H
#define EMBPS_CLI_H
#include "embps/embps.h"

/* `embps bench ...`: argv holds the arguments after "bench". Returns the
 * process exit status. */
int embps_cli_bench(const embps_client_options_t *copts, int argc,
                    char **argv);
#endif
