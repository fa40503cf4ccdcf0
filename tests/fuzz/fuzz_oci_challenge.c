/*
 * fuzz_oci_challenge.c - libFuzzer target for what the registry client parses from the network
 * and the user before a request: a WWW-Authenticate challenge's parameters (oci__challenge_param,
 * bytes from the network) and a reference (nwc_oci_ref_parse).  A value found must be a string
 * no longer than the input; a parsed reference must have a registry and repository and a tag or
 * a valid digest.  Replayed over corpus/oci_challenge under ctest.
 */
#include "nwc_oci.h"
#include "oci_internal.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1); /* exactly sized, NUL-terminated as the client's header buffer is */
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  static const char *const keys[] = {"realm", "service", "scope", "error"};
  for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
    char *v = oci__challenge_param(s, keys[k]);
    if (v && strlen(v) > size) abort();
    free(v);
  }
  nwc_oci_ref r;
  if (nwc_oci_ref_parse(s, &r) == 0) {
    if (!r.registry || !*r.registry || !r.repository || !*r.repository) abort();
    if (!r.tag && !(r.digest && nwc_oci_digest_valid(r.digest))) abort();
    nwc_oci_ref_free(&r);
  }
  free(s);
  return 0;
}
