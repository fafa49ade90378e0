/* log.h - leveled logging to stderr, one line per event, safe from any
 * thread (a single fprintf per line), as text or as JSON objects
 * ({"ts","level","msg"}) with --log-format json. */
#ifndef EMBPS_LOG_H
#define EMBPS_LOG_H

typedef enum {
  EMBPS_LOG_DEBUG = 0,
  EMBPS_LOG_INFO = 1,
  EMBPS_LOG_WARN = 2,
  EMBPS_LOG_ERROR = 3,
} embps_log_level_t;

void embps_log_set_level(embps_log_level_t level);
/* 1: JSON lines; 0: text (the default). */
void embps_log_set_json(int on);
/* Parses debug|info|warn|error; returns 0 or -1. */
int embps_log_parse_level(const char *s, embps_log_level_t *out);
void embps_log(embps_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The ready line scripts wait for: printed whatever the level, as the bare
 * message in text (no time or level prefix), with "event":"ready" in JSON. */
void embps_log_ready(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

#define LOG_DEBUG(...) embps_log(EMBPS_LOG_DEBUG, __VA_ARGS__)
#define LOG_INFO(...) embps_log(EMBPS_LOG_INFO, __VA_ARGS__)
#define LOG_WARN(...) embps_log(EMBPS_LOG_WARN, __VA_ARGS__)
#define LOG_ERROR(...) embps_log(EMBPS_LOG_ERROR, __VA_ARGS__)
#endif
