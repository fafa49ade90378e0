/* replay.c - runs a fuzz target's entry point on every file of the corpus
 * directories (or files) given, without libFuzzer: built with the normal
 * compiler, it makes each committed corpus a plain test. A failed
 * invariant aborts, naming the file being replayed. */
#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>

#include "fuzz.h"

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
    return -1;
  }
  size_t cap = 4096, len = 0;
  uint8_t *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) {
      uint8_t *v = realloc(buf, 2 * cap);
      if (!v) {
        free(buf);
        buf = NULL;
      }
      buf = v;
      cap *= 2;
    }
  }
  fclose(f);
  if (!buf) {
    fprintf(stderr, "replay: %s: out of memory\n", path);
    return -1;
  }
  /* an exact-size copy, as libFuzzer hands it, so over-reads are caught */
  uint8_t *exact = malloc(len ? len : 1);
  if (!exact) {
    free(buf);
    return -1;
  }
  memcpy(exact, buf, len);
  free(buf);
  fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
  LLVMFuzzerTestOneInput(exact, len);
  free(exact);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replays every regular file of dir, in name order; returns files run or
 * -1. */
static long replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.')
      continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **v = realloc(names, cap * sizeof *v);
      FUZZ_CHECK(v);
      names = v;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    FUZZ_CHECK(names[n]);
    snprintf(names[n], len, "%s/%s", dir, e->d_name);
    n++;
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  long run = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (stat(names[i], &st) == 0 && S_ISREG(st.st_mode)) {
      if (replay_file(names[i]))
        run = -1;
      else if (run >= 0)
        run++;
    }
    free(names[i]);
  }
  free(names);
  return run;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  long total = 0;
  for (int i = 1; i < argc; i++) {
    struct stat st;
    long run;
    if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
      run = replay_dir(argv[i]);
    else
      run = replay_file(argv[i]) ? -1 : 1;
    if (run < 0)
      return 1;
    total += run;
  }
  if (total == 0) {
    fprintf(stderr, "replay: no corpus files found\n");
    return 1;
  }
  printf("replayed %ld inputs\n", total);
  return 0;
}
