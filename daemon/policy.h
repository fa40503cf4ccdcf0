/*
 * policy.h - who may change the store (policy.c): root, the daemon's uid, the admin group.
 */
#ifndef NWCD_POLICY_H
#define NWCD_POLICY_H

#include "nwc_proto.h"

#include <sys/types.h>

/* Sets the admin group by name (NULL or "": none); -EINVAL with a detail when it is unknown. */
int nwcd_policy_set_admin_group(const char *name);
/* May the peer on fd (SO_PEERCRED uid/gid/pid) run request r?  0, or -EPERM with a detail for
 * the reply, after logging the refusal with uid, subject and the time the check took. */
int nwcd_policy_check(int fd, uid_t uid, gid_t gid, pid_t pid, const nwc_proto_req *r);


#endif
