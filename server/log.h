/* log.h - leveled logging to stderr, one line per event, safe from any
 * thread (a single fprintf per line), as text or as JSON objects
 * ({"ts","level","msg"}) with --log-format json. */
#ifndef EMBPS_LOG_H
#define EMBPS_LOG_H
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
  EMBPS_LOG_DEBUG = 0,
  EMBPS_LOG_INFO = 1,
  EMBPS_LOG_WARN = 2,
  EMBPS_LOG_ERROR = 3,
} embps_log_level_t;

void embps_log_set_level(embps_log_level_t level);
/* The level in the file path: one word (debug|info|warn|error), spaces
 * and line ends around it ignored. 0, or -1 with err naming the file. */
int embps_log_read_level(const char *path, embps_log_level_t *out,
                         char *err, size_t err_len);
/* 1: JSON lines; 0: text (the default). */
void embps_log_set_json(int on);
/* "debug", "info", "warn" or "error". */
const char *embps_log_level_name(embps_log_level_t level);
/* Parses debug|info|warn|error; returns 0 or -1. */
int embps_log_parse_level(const char *s, embps_log_level_t *out);
void embps_log(embps_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* embps_log whatever the level set: for the lines an operator waits for
 * (a reload's outcome), which a quieter level must not hide. */
void embps_log_always(embps_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The ready line scripts wait for: printed whatever the level, as the bare
 * message in text (no time or level prefix), with "event":"ready" in JSON. */
void embps_log_ready(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* At most one line per period for an event that may repeat at the rate of
 * requests (a refused push): zero-initialised, shared by any threads. */
typedef struct {
  atomic_uint_fast64_t next_ns, skipped;
} embps_log_limit_t;

/* 1 when the event may be logged now (and the next may only be after
 * period_ms); *skipped then holds how many were not logged since the last
 * line. 0 when it must not be logged (it is counted). */
int embps_log_limit_pass(embps_log_limit_t *l, uint64_t period_ms,
                         uint64_t *skipped);

#define LOG_DEBUG(...) embps_log(EMBPS_LOG_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) embps_log(EMBPS_LOG_INFO, __VA_ARGS__)
#define LOG_WARN(...) embps_log(EMBPS_LOG_WARN, __VA_ARGS__)
#define LOG_ERROR(...) embps_log(EMBPS_LOG_ERROR, __VA_ARGS__)
#endif
