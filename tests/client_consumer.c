/*
 * client_consumer.c - a program outside the tree that uses the installed libnwc-client, built by
 * test_client_install.sh against nwc-client.pc twice (shared and static):
 *
 *   client_consumer SOCKET import MODEL FILE.safetensors
 *   client_consumer SOCKET dequant MODEL TENSOR OUT     (the tensor's BF16 bits, raw, into OUT)
 */
#include <nwc_client.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
  fprintf(stderr, "client_consumer: %s: %s\n", what, nwc_client_last_error());
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: client_consumer SOCKET import MODEL FILE | dequant MODEL TENSOR OUT\n");
    return 2;
  }
  nwc_client *c;
  if (nwc_client_connect(argv[1], &c) < 0) return fail("connect");
  int rc = 0;
  if (!strcmp(argv[2], "import")) {
    if (nwc_client_import(c, argv[3], argv[4], NULL, NULL) < 0) rc = fail("import");
  } else if (!strcmp(argv[2], "dequant") && argc == 6) {
    nwc_client_tensor_info ti;
    if (nwc_client_info(c, argv[3], argv[4], &ti) < 0) {
      rc = fail("info");
    } else {
      size_t n = (size_t)(ti.t.rows * ti.t.cols * 2);
      void *buf = malloc(n);
      FILE *f = fopen(argv[5], "wb");
      if (!buf || !f) {
        rc = 1;
      } else if (nwc_client_dequant(c, argv[3], argv[4], NWC_CLIENT_BF16, buf, n, NULL, NULL,
                                    NULL) < 0) {
        rc = fail("dequant");
      } else if (fwrite(buf, 1, n, f) != n) {
        rc = 1;
      }
      if (f && fclose(f)) rc = 1;
      free(buf);
    }
  } else {
    fprintf(stderr, "client_consumer: unknown command %s\n", argv[2]);
    rc = 2;
  }
  nwc_client_free(c);
  return rc;
}
