/*
 * fuzz_protocol.c - libFuzzer target for the nwcd frame parser (proto/proto.c): the bytes a
 * client sends are outside input to the daemon, and the daemon's replies are outside input to
 * libnwc-client.
 *
 * Each input is read as a stream of frames, the way the daemon reads a connection: a header
 * (nwc_proto_hdr_decode), then as many payload bytes as it claims (or what is left); each
 * request is decoded (nwc_proto_req_decode, exact lengths) and, if accepted, re-encoded and
 * decoded again, which must give the same bytes.  The same payload is also given to every
 * reply decoder the client uses.  Crashes, sanitizer reports and round-trip mismatches are bugs.
 * The seed corpus (corpus/protocol) is the golden frames of tests/golden/protocol.
 */
#include "nwc_proto.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void replies(const uint8_t *p, size_t n) {
  nwc_pr r;
  nwc_proto_hello h;
  nwc_pr_init(&r, p, n), nwc_proto_get_hello(&r, &h), nwc_pr_end(&r, "x");
  nwc_proto_model m;
  nwc_pr_init(&r, p, n);
  for (uint32_t k = nwc_pr_u32(&r), i = 0; i < k && !r.err; i++) nwc_proto_get_model(&r, &m);
  nwc_proto_tensor t;
  nwc_pr_init(&r, p, n);
  for (uint32_t k = nwc_pr_u32(&r), i = 0; i < k && !r.err; i++) nwc_proto_get_tensor(&r, &t);
  nwc_proto_info in;
  nwc_pr_init(&r, p, n), nwc_proto_get_tensor(&r, &t), nwc_proto_get_info(&r, &in);
  nwc_proto_ps ps;
  nwc_pr_init(&r, p, n);
  for (uint32_t k = nwc_pr_u32(&r), i = 0; i < k && !r.err; i++) nwc_proto_get_ps(&r, &ps);
  nwc_proto_place pl;
  nwc_pr_init(&r, p, n);
  for (uint32_t k = nwc_pr_u32(&r), i = 0; i < k && !r.err; i++) nwc_proto_get_place(&r, &pl);
  nwc_proto_result res;
  nwc_pr_init(&r, p, n), nwc_proto_get_result(&r, &res);
  nwc_proto_skipped sk; /* import2: the result, then the skipped tensors */
  for (uint32_t k = nwc_pr_u32(&r), i = 0; i < k && !r.err; i++)
    if (nwc_proto_get_skipped(&r, &sk) < 0) break;
  nwc_proto_compute c;
  nwc_pr_init(&r, p, n), nwc_proto_get_compute(&r, &c), nwc_pr_bytes(&r, c.bytes);
  nwc_proto_stats s;
  nwc_pr_init(&r, p, n), nwc_proto_get_stats(&r, &s);
  nwc_proto_map mp;
  nwc_pr_init(&r, p, n), nwc_proto_get_map(&r, &mp), nwc_pr_end(&r, "x");
  nwc_proto_gmap_head gh; /* map_gpu: the head, then its records */
  nwc_proto_gmap gm;
  nwc_pr_init(&r, p, n);
  if (nwc_proto_get_gmap_head(&r, &gh) == 0)
    for (uint32_t i = 0; i < gh.n; i++)
      if (nwc_proto_get_gmap(&r, &gm) < 0) break;
  uint64_t a, b;
  nwc_pr_init(&r, p, n), nwc_proto_get_progress(&r, &a, &b);
  char msg[NWC_PROTO_MAX_MSG];
  nwc_pr_init(&r, p, n), nwc_pr_str(&r, msg, sizeof msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  while (size >= NWC_PROTO_HEADER) {
    nwc_proto_hdr h;
    int rc = nwc_proto_hdr_decode(data, &h);
    data += NWC_PROTO_HEADER, size -= NWC_PROTO_HEADER;
    if (rc < 0) h.length = (uint32_t)(size < 64 ? size : 64); /* keep going on what follows */
    if (h.length > size) h.length = (uint32_t)size;
    uint8_t *payload = malloc(h.length ? h.length : 1); /* exactly sized: overreads are caught */
    memcpy(payload, data, h.length);
    replies(payload, h.length);
    if (rc == 0) {
      nwc_proto_req req;
      if (nwc_proto_req_decode(&h, payload, &req) == 0) {
        nwc_pw w;
        nwc_pw_init(&w);
        req.flags = 0;
        int64_t n = nwc_proto_req_encode(&req, &w);
        if (n > 0) {
          nwc_proto_hdr h2;
          nwc_proto_req again;
          if (nwc_proto_hdr_decode(w.buf, &h2) != 0 ||
              nwc_proto_req_decode(&h2, w.buf + NWC_PROTO_HEADER, &again) != 0 ||
              (uint64_t)n != NWC_PROTO_HEADER + (uint64_t)h.length ||
              memcmp(w.buf + NWC_PROTO_HEADER, payload, h.length))
            abort(); /* an accepted request must re-encode to the same bytes */
          nwc_proto_req_clear(&again);
        }
        nwc_pw_free(&w);
      }
      nwc_proto_req_clear(&req);
    }
    free(payload);
    data += h.length, size -= h.length;
  }
  return 0;
}
