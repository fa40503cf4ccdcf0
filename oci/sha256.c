/*
 * sha256.c - the sha256 helpers (libgcrypt) of nwc_oci: streaming state and the "sha256:hex" form.
 * libgcrypt is set up once (thread-safe), unless the application has set it up itself.
 */
#include "oci_internal.h"

#include <gcrypt.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void gcrypt_init(void) {
  if (!gcry_control(GCRYCTL_INITIALIZATION_FINISHED_P)) {
    gcry_check_version(NULL);
    gcry_control(GCRYCTL_DISABLE_SECMEM, 0);
    gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
  }
}

/* ---- sha256 --------------------------------------------------------------------------------- */

/* "sha256:" and the 64 hex digits of d. */
static void format_digest(const unsigned char d[32], char out[73]) {
  memcpy(out, "sha256:", 7);
  for (int i = 0; i < 32; i++) {
    out[7 + 2 * i] = "0123456789abcdef"[d[i] >> 4];
    out[8 + 2 * i] = "0123456789abcdef"[d[i] & 15];
  }
  out[71] = 0;
}

struct nwc_sha256 {
  gcry_md_hd_t md;
};

int nwc_sha256_new(nwc_sha256 **out) {
  pthread_once(&once, gcrypt_init);
  *out = NULL;
  nwc_sha256 *h = malloc(sizeof *h);
  if (!h) return -ENOMEM;
  if (gcry_md_open(&h->md, GCRY_MD_SHA256, 0)) {
    free(h);
    return nwc__fail(-ENOMEM, "sha256: gcry_md_open failed");
  }
  *out = h;
  return 0;
}

void nwc_sha256_update(nwc_sha256 *h, const void *p, size_t n) { gcry_md_write(h->md, p, n); }

void nwc_sha256_final(nwc_sha256 *h, char digest_out[73]) {
  const unsigned char *d = gcry_md_read(h->md, GCRY_MD_SHA256);
  format_digest(d, digest_out);
  gcry_md_reset(h->md);
}

void nwc_sha256_free(nwc_sha256 *h) {
  if (!h) return;
  gcry_md_close(h->md);
  free(h);
}

void nwc_sha256_buf(const void *p, size_t n, char digest_out[73]) {
  pthread_once(&once, gcrypt_init);
  unsigned char d[32];
  gcry_md_hash_buffer(GCRY_MD_SHA256, d, p, n);
  format_digest(d, digest_out);
}
