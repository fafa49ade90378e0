/* failpoint.c - see failpoint.h. */
#include "failpoint.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void embps_failpoint(const char *name) {
  static const char *env;
  static int read_env;
  if (!read_env) { /* first call is before any thread starts (durable.c) */
    env = getenv("EMBPS_FAILPOINT");
    read_env = 1;
  }
  if (name && env && !strcmp(env, name)) {
    LOG_WARN("failpoint %s: killing the server", name);
    raise(SIGKILL);
  }
}
