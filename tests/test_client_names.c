/*
 * test_client_names.c - every name the store accepts is usable, and nwcctl neither hangs on
 * nor echoes what it should not.  Real nwcd and nwcctl processes:
 *   - a tensor name of 1,023 bytes (the protocol's limit) imports, is listed whole by
 *     `nwcctl ls MODEL --json` and dequantizes by name; one of 1,024 bytes in two-byte
 *     characters is refused at import naming the limit (it used to be stored, then listed cut
 *     mid-character, so `ls --json` printed [] and the tensor could not be used);
 *   - a name holding an escape sequence is refused and nwcctl's message shows it as \x1b, with
 *     no raw control byte reaching the terminal;
 *   - `nwcctl import M FIFO` fails at once saying it is not a regular file (it blocked forever
 *     in open, holding a daemon connection), and so does a FIFO as matvec's X.npy.
 */
#include "test_daemon_util.h"
#include "test_store_util.h"

#include "nwc_client.h"

#include <jansson.h>

static uint16_t w4[4];

/* A safetensors file at dir/file holding one 2 x 2 BF16 tensor named name. */
static void one_tensor(const char *path, const char *name) {
  st_spec t = {name, "BF16", 2, {2, 2}, w4, sizeof w4};
  CHECK_RC(st_write(path, &t, 1));
}

static void test_long_names(void) {
  char path[400], name[1100];
  snprintf(path, sizeof path, "%s/long.safetensors", td_dir);
  memset(name, 'a' + (int)test_below(26), 1023);
  name[1023] = 0;
  one_tensor(path, name);
  char *out = NULL, *err = NULL;
  int st = td_nwcctl(&out, &err, (const char *[]){"import", "long", path, NULL});
  CHECK(st == 0, "import of a 1023-byte name: exit %d: %s", st, err);
  free(out), free(err);
  st = td_nwcctl(&out, &err, (const char *[]){"ls", "long", "--json", NULL});
  json_error_t e;
  json_t *j = st == 0 ? json_loads(out, 0, &e) : NULL;
  json_t *first = json_array_get(j, 0);
  const char *listed = json_string_value(json_object_get(first, "name"));
  CHECK(listed && !strcmp(listed, name), "ls --json of the 1023-byte name: exit %d, %.80s", st,
        out);
  json_decref(j);
  free(out), free(err);
  nwc_client *c;
  uint16_t back[4];
  CHECK_RC(nwc_client_connect(td_sock, &c));
  CHECK_RC(nwc_client_dequant(c, "long", name, NWC_CLIENT_BF16, back, sizeof back, NULL, NULL,
                              NULL));
  CHECK(!memcmp(back, w4, sizeof w4), "the 1023-byte name's tensor dequantizes wrong");
  nwc_client_free(c);

  for (int i = 0; i < 512; i++) name[2 * i] = (char)0xc3, name[2 * i + 1] = (char)0xa9; /* é */
  name[1024] = 0;
  snprintf(path, sizeof path, "%s/longer.safetensors", td_dir);
  one_tensor(path, name);
  st = td_nwcctl(&out, &err, (const char *[]){"import", "longer", path, NULL});
  CHECK(st != 0 && strstr(err, "1024 bytes") && strstr(err, "at most 1023"),
        "import of a 1024-byte name: exit %d: %s", st, err);
  free(out), free(err);
  st = td_nwcctl(&out, &err, (const char *[]){"ls", "--json", NULL});
  CHECK(st == 0 && strstr(out, "\"long\"") && !strstr(out, "\"longer\""),
        "ls --json after the refused import: exit %d: %s", st, out);
  free(out), free(err);
}

static void test_control_bytes(void) {
  char path[400];
  snprintf(path, sizeof path, "%s/esc.safetensors", td_dir);
  one_tensor(path, "\x1b]0;owned\x07\x1b[31mred");
  char *out = NULL, *err = NULL;
  int st = td_nwcctl(&out, &err, (const char *[]){"import", "esc", path, NULL});
  CHECK(st != 0 && strstr(err, "\\x1b") && !strchr(err, 0x1b) && !strchr(err, 0x07),
        "import of a name with control bytes: exit %d, stderr not escaped: %s", st, err);
  free(out), free(err);
}

static void test_fifo(void) {
  char fifo[400];
  snprintf(fifo, sizeof fifo, "%s/p", td_dir);
  CHECK(mkfifo(fifo, 0600) == 0, "mkfifo");
  alarm(30); /* the old nwcctl blocks in open: SIGALRM ends the test (failed) */
  char *out = NULL, *err = NULL;
  int st = td_nwcctl(&out, &err, (const char *[]){"import", "f", fifo, NULL});
  alarm(0);
  CHECK(st != 0 && strstr(err, "not a regular file") && strstr(err, "FIFO"),
        "import of a FIFO: exit %d: %s", st, err);
  free(out), free(err);
  char y[400];
  snprintf(y, sizeof y, "%s/y.npy", td_dir);
  alarm(30);
  st = td_nwcctl(&out, &err, (const char *[]){"matvec", "long/x", fifo, "-o", y, NULL});
  alarm(0);
  CHECK(st == 1 && strstr(err, "not a regular file"), "matvec with x a FIFO: exit %d: %s", st,
        err);
  free(out), free(err);
}

int main(void) {
  test_seed("test_client_names");
  if (td_mkdir("nwc-names") < 0) return 1;
  for (int i = 0; i < 4; i++) w4[i] = nwc_f32_to_bf16((float)test_uniform());
  pid_t d = td_start_daemon(NULL);
  CHECK(d > 0, "nwcd did not start");
  if (d <= 0) return td_show_log(), 1;
  setenv("NWC_SOCKET", td_sock, 1);
  test_long_names();
  test_control_bytes();
  test_fifo();
  CHECK(td_stop_daemon(d) == 0, "nwcd did not stop cleanly");
  if (test_failures) td_show_log();
  td_cleanup();
  return test_exit("test_client_names");
}
