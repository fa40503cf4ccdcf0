/*
 * policy.c - who may do what on nwcd's socket (docs/security.md).
 *
 * Connecting is the first gate: the socket file's mode and group (0660, group nwc under
 * systemd) decide who reaches the daemon at all.  Past it:
 *   - anyone connected may list (models, tensors, info, ps, stats), verify and compute
 *     (dequant, gather, matvec; these may make a tensor resident under the budget's LRU);
 *   - import, remove, load, evict, pin and unpin change the store or what stays resident, and
 *     pull and push make the daemon fetch from or send the store's models to a host the client
 *     names; they need uid 0, the daemon's own uid, or membership of the admin group (admin_group in the
 *     config): the peer's primary gid from SO_PEERCRED, or one of its supplementary groups.
 * The supplementary groups are the peer process's own, taken from the socket with
 * SO_PEERGROUPS (Linux 4.13; fixed at connect like SO_PEERCRED, so no race with the pid);
 * where the kernel lacks it, getgrouplist() of the uid's user name (the group database).
 * A refusal is -EPERM with a message for the error reply and a warning in the log naming the
 * uid, pid, operation, subject and how long the check took.  The check runs on the loop thread
 * for the admin operations only (the others return at once), so its cost is one getsockopt.
 */
#include "policy.h"

#include "clock.h"
#include "log.h"

#include "nwc_error.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static bool have_admin;
static gid_t admin_gid;
static char admin_name[64];

int nwcd_policy_set_admin_group(const char *name) {
  if (!name || !*name) {
    have_admin = false, admin_name[0] = 0;
    return 0;
  }
  char buf[16384];
  struct group g, *res = NULL;
  int rc = getgrnam_r(name, &g, buf, sizeof buf, &res);
  NWC_RETURN_IF(rc, -rc, "group '%s': cannot look it up: %s", name, strerror(rc));
  NWC_RETURN_IF(!res, -ENOENT, "group '%s' does not exist", name);
  NWC_RETURN_IF(strlen(name) >= sizeof admin_name, -EINVAL, "group name '%s' is too long", name);
  have_admin = true, admin_gid = g.gr_gid;
  snprintf(admin_name, sizeof admin_name, "%s", name);
  nwcd_log(NWCD_LOG_INFO, "admin group %s (gid %u)", admin_name, (unsigned)admin_gid);
  return 0;
}

static bool needs_admin(unsigned op) {
  switch (op) {
    case NWC_OP_IMPORT: case NWC_OP_IMPORT2: case NWC_OP_REMOVE: case NWC_OP_LOAD:
    case NWC_OP_EVICT: case NWC_OP_PIN: case NWC_OP_UNPIN: case NWC_OP_LOAD_ON: case NWC_OP_EVICT_ON:
    case NWC_OP_LOAD_PLACES:
    case NWC_OP_PULL: case NWC_OP_PUSH: return true;
    default: return false;
  }
}

/* Is admin_gid among the peer's groups? */
static bool in_admin_group(int fd, uid_t uid, gid_t gid) {
  if (gid == admin_gid) return true;
  gid_t groups[256];
  socklen_t len = sizeof groups;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
    for (size_t i = 0; i < len / sizeof(gid_t); i++)
      if (groups[i] == admin_gid) return true;
    return false;
  }
  /* Old kernel (or more than 256 groups: ERANGE): the group database instead. */
  char buf[16384];
  struct passwd pw, *res = NULL;
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) || !res) return false;
  int n = 256;
  if (getgrouplist(res->pw_name, gid, groups, &n) < 0) return false;
  for (int i = 0; i < n; i++)
    if (groups[i] == admin_gid) return true;
  return false;
}

int nwcd_policy_check(int fd, uid_t uid, gid_t gid, pid_t pid, const nwc_proto_req *r) {
  if (!needs_admin(r->op)) return 0;
  if (uid == 0 || uid == geteuid()) return 0;
  uint64_t t0 = nwcd_now_ns();
  if (have_admin && in_admin_group(fd, uid, gid)) return 0;
  const char *op = nwc_proto_op_name(r->op) ? nwc_proto_op_name(r->op) : "?";
  char who[160];
  if (have_admin)
    snprintf(who, sizeof who, "root, uid %u or a member of group %s", (unsigned)geteuid(),
             admin_name);
  else
    snprintf(who, sizeof who, "root or uid %u (no admin_group configured)", (unsigned)geteuid());
  nwcd_log(NWCD_LOG_WARN, "refused %s %s%s%s for uid %u gid %u pid %d: needs %s (checked in %.3f ms)",
           op, r->model, r->tensor[0] ? "/" : "", r->tensor, (unsigned)uid, (unsigned)gid, (int)pid,
           who, (nwcd_now_ns() - t0) / 1e6);
  return nwc__fail(-EPERM, "%s needs %s; uid %u is not", op, who, (unsigned)uid);
}
