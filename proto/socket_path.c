/*
 * socket_path.c - where nwcd listens when nothing says otherwise (docs/protocol.md): the one
 * definition of the default socket path, used by nwcd (daemon/) and libnwc-client (client/) so
 * that the two cannot disagree.
 */
#include "nwc_proto.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

const char *nwc_proto_default_socket(char *buf, size_t n) {
  const char *env = getenv("NWC_SOCKET"), *xdg = getenv("XDG_RUNTIME_DIR");
  if (env && *env) snprintf(buf, n, "%s", env);
  else if (geteuid() == 0) snprintf(buf, n, "/run/nwc/nwcd.sock");
  else if (xdg && *xdg) snprintf(buf, n, "%s/nwc/nwcd.sock", xdg);
  else snprintf(buf, n, "/tmp/nwc-%u/nwcd.sock", (unsigned)geteuid());
  return buf;
}
