/* about.h - what `embps-server --version` prints. */
#ifndef EMBPS_ABOUT_H
#define EMBPS_ABOUT_H
#include <stdio.h>

/* Writes the release, the source revision it was built from, the protocol
 * version, and the data directory formats written and read, one per line,
 * to out. */
void embps_server_version_print(FILE *out);
#endif
