/*
 * ops_reply.c - how the request handlers answer: frames built with nwc_pw and handed to
 * nwcd_server_send (which frees the job after its final one), error replies carrying the
 * thread's error detail, and progress events no more often than every 50 ms.
 */
#include "ops_internal.h"

#include "clock.h"
#include "nwcd.h"
#include "server.h"

#include <errno.h>
#include <stdio.h>

/* Sends w's frame (status, flags) for j; final marks j's last frame (NWC_PF_ALONE added where j
 * is alone), after which j is gone.  When the frame cannot be built, sends -ENOMEM instead. */
static void send_frame(nwcd_job *j, nwc_pw *w, int32_t status, uint16_t flags, bool final) {
  if (final && j->alone) flags |= NWC_PF_ALONE;
  int64_t n = nwc_pw_finish(w, j->req.op, flags, status, j->req.id);
  if (n < 0) { /* could not build the reply: send the failure instead */
    nwc_pw_free(w);
    nwc_pw_init(w);
    nwc_pw_str(w, "the daemon could not build the reply (out of memory or too large)");
    n = nwc_pw_finish(w, j->req.op, 0, -ENOMEM, j->req.id);
    if (n < 0) {
      nwc_pw_free(w);
      nwcd_server_send(j, NULL, 0, final);
      return;
    }
  }
  nwcd_server_send(j, w->buf, (size_t)n, final);
  w->buf = NULL;
}

void nwcd_reply(nwcd_job *j, nwc_pw *w) { send_frame(j, w, 0, 0, true); }

void nwcd_reply_error(nwcd_job *j, int rc) {
  const char *detail = nwc_error_detail();
  char msg[NWC_PROTO_MAX_MSG];
  snprintf(msg, sizeof msg, "%s", detail && *detail ? detail : nwc_strerror(rc));
  atomic_fetch_add(&j->d->stats.errors, 1);
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_pw_str(&w, msg);
  send_frame(j, &w, rc, 0, true);
}

void nwcd_send_progress(nwcd_progress *p, uint64_t done, uint64_t total, bool force) {
  uint64_t now = nwcd_now_ns();
  if (!force && now - p->last_ns < 50000000) return;
  p->last_ns = now;
  nwc_pw w;
  nwc_pw_init(&w);
  nwc_proto_put_progress(&w, done, total);
  send_frame(p->j, &w, 0, NWC_PF_EVENT, false);
}
