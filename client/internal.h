/* internal.h - what the library's files share beyond embps.h (not
 * exported): client.c's last error and the servers' frame limit, for
 * export.c. */
#ifndef EMBPS_CLIENT_INTERNAL_H
#define EMBPS_CLIENT_INTERNAL_H
#include <stdint.h>

#include "embps/embps.h"

/* Sets c's last error to msg; returns code. */
int embps_client_set_error_(embps_client_t *c, int code, const char *msg);
/* The smallest --max-frame-bytes a server of c announced (0: none). */
uint64_t embps_client_max_frame_(const embps_client_t *c);
#endif
