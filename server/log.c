/* log.c - see log.h. */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util.h"

static atomic_int min_level = EMBPS_LOG_INFO; /* a reload sets it */
static int json;
static const char *const names[] = {"debug", "info", "warn", "error"};

void embps_log_set_level(embps_log_level_t level) {
  atomic_store(&min_level, (int)level);
}
void embps_log_set_json(int on) { json = on; }

const char *embps_log_level_name(embps_log_level_t level) {
  return names[level];
}

int embps_log_parse_level(const char *s, embps_log_level_t *out) {
  for (int i = 0; i < 4; i++) {
    if (strcmp(s, names[i]) == 0) {
      *out = (embps_log_level_t)i;
      return 0;
    }
  }
  return -1;
}

/* msg as a JSON string body: quotes, backslashes and control bytes escaped
 * (bytes >= 0x80 pass through: messages are UTF-8 or ASCII). */
static void json_escape(const char *msg, char *out, size_t cap) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)msg; *p; p++) {
    char esc[8];
    size_t n;
    if (*p == '"' || *p == '\\')
      n = (size_t)snprintf(esc, sizeof esc, "\\%c", *p);
    else if (*p < 0x20)
      n = (size_t)snprintf(esc, sizeof esc, "\\u%04x", *p);
    else
      n = (size_t)snprintf(esc, sizeof esc, "%c", *p);
    if (o + n >= cap)
      break;
    memcpy(out + o, esc, n);
    o += n;
  }
  out[o] = '\0';
}

/* Writes one line: text "TIME embps-server LEVEL: MSG", or with `bare`
 * the message alone; JSON {"ts","level","msg"} (+ "event" when given). */
static void emit(const char *level, const char *event, int bare,
                 const char *fmt, va_list ap) {
  char msg[1024];
  vsnprintf(msg, sizeof msg, fmt, ap);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char when[96];
  snprintf(when, sizeof when, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ",
           tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
           tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000);
  if (json) {
    char esc[6 * sizeof msg];
    json_escape(msg, esc, sizeof esc);
    fprintf(stderr, "{\"ts\":\"%s\",\"level\":\"%s\",%s%s%s\"msg\":\"%s\"}\n",
            when, level, event ? "\"event\":\"" : "", event ? event : "",
            event ? "\"," : "", esc);
  } else if (bare) {
    fprintf(stderr, "%s\n", msg);
  } else {
    fprintf(stderr, "%s embps-server %s: %s\n", when, level, msg);
  }
}

void embps_log(embps_log_level_t level, const char *fmt, ...) {
  if ((int)level < atomic_load_explicit(&min_level, memory_order_relaxed))
    return;
  va_list ap;
  va_start(ap, fmt);
  emit(names[level], NULL, 0, fmt, ap);
  va_end(ap);
}

void embps_log_always(embps_log_level_t level, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit(names[level], NULL, 0, fmt, ap);
  va_end(ap);
}

int embps_log_read_level(const char *path, embps_log_level_t *out,
                         char *err, size_t err_len) {
  char buf[64] = "";
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, err_len, "--log-level-file %s: %s", path, strerror(errno));
    return -1;
  }
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *word = buf + strspn(buf, " \t\r\n");
  word[strcspn(word, " \t\r\n")] = 0;
  if (embps_log_parse_level(word, out)) {
    snprintf(err, err_len, "--log-level-file %s: \"%.20s\" is not "
             "debug|info|warn|error", path, word);
    return -1;
  }
  return 0;
}

void embps_log_ready(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  emit("info", "ready", 1, fmt, ap);
  va_end(ap);
  fflush(stderr);
}

int embps_log_limit_pass(embps_log_limit_t *l, uint64_t period_ms,
                         uint64_t *skipped) {
  uint64_t now = embps_now_ns();
  uint64_t next = atomic_load(&l->next_ns);
  if (now < next ||
      !atomic_compare_exchange_strong(&l->next_ns, &next,
                                      now + period_ms * 1000000u)) {
    atomic_fetch_add(&l->skipped, 1);
    return 0;
  }
  *skipped = atomic_exchange(&l->skipped, 0);
  return 1;
}
