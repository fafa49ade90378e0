/* log.c - see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static embps_log_level_t min_level = EMBPS_LOG_INFO;
static const char *const names[] = {"debug", "info", "warn", "error"};

void embps_log_set_level(embps_log_level_t level) { min_level = level; }

int embps_log_parse_level(const char *s, embps_log_level_t *out) {
  for (int i = 0; i < 4; i++) {
    if (strcmp(s, names[i]) == 0) {
      *out = (embps_log_level_t)i;
      return 0;
    }
  }
  return -1;
}

void embps_log(embps_log_level_t level, const char *fmt, ...) {
  if (level < min_level)
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ embps-server %s: %s\n",
          tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
          tm.tm_sec, ts.tv_nsec / 1000000, names[level], msg);
}
