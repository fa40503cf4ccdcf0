/*
 * fuzz_replay.c - runs a fuzz target's LLVMFuzzerTestOneInput over every file of corpus
 * directories (the arguments, or FUZZ_CORPUS, the target's checked-in corpus), so that ctest
 * replays the seed corpus and all kept crash inputs with gcc and the sanitizers, without
 * libFuzzer.  Exit 0 when every input ran; 1 if a directory is missing, empty or unreadable.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int replay_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "fuzz_replay: cannot open %s\n", dir);
    return -1;
  }
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0, got;
    do {
      if (len == cap && !(buf = realloc(buf, cap = cap ? 2 * cap : 4096))) exit(1);
      got = fread(buf + len, 1, cap - len, f);
      len += got;
    } while (got);
    fclose(f);
    uint8_t *exact = malloc(len ? len : 1); /* exactly sized, for the sanitizers */
    if (!exact) exit(1);
    memcpy(exact, buf, len);
    free(buf);
    LLVMFuzzerTestOneInput(exact, len);
    free(exact);
    n++;
  }
  closedir(d);
  printf("fuzz_replay: %d inputs from %s\n", n, dir);
  return n;
}

int main(int argc, char **argv) {
  int rc = 0;
  if (argc > 1) {
    for (int i = 1; i < argc; i++) rc |= replay_dir(argv[i]) <= 0;
  } else {
#ifdef FUZZ_CORPUS
    rc = replay_dir(FUZZ_CORPUS) <= 0;
#else
    fprintf(stderr, "usage: %s CORPUS_DIR...\n", argv[0]);
    rc = 1;
#endif
  }
  return rc;
}
