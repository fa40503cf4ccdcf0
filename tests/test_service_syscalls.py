#!/usr/bin/env python3
"""test_service_syscalls.py - does nwcd stay inside nwcd.service's SystemCallFilter?

Runs a real nwcd under `strace -f` on a temporary store (CPU backend): start, import of the
sample model, load, evict, pin, matvec through nwcctl, SIGHUP with a config file, SIGTERM.
Every system call it made must be in the unit's allow list: `@system-service` expanded by this
machine's `systemd-analyze syscall-filter`, plus the calls the unit adds by name (read from
systemd/nwcd.service).  Calls made only by the CUDA driver are not covered (no GPU here).
Exit 0 pass, 1 fail, 77 skip (no strace, systemd-analyze or sample model).
usage: test_service_syscalls.py SOURCE_DIR NWCD NWCCTL
"""
import os, re, shutil, signal, subprocess, sys, tempfile, time

def expand(group, seen):
    out = set()
    res = subprocess.run(["systemd-analyze", "syscall-filter", group], capture_output=True, text=True)
    for line in res.stdout.splitlines()[1:]:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            if line not in seen:
                seen.add(line)
                out |= expand(line, seen)
        else:
            out.add(line)
    return out

def main():
    src, nwcd, nwcctl = sys.argv[1:4]
    sample = os.environ.get("NWC_SAMPLE", "")
    if not shutil.which("strace") or not shutil.which("systemd-analyze") or not os.path.exists(sample):
        print("needs strace, systemd-analyze and the sample model; skipped")
        return 77
    allowed = set()
    for line in open(os.path.join(src, "systemd", "nwcd.service")):
        m = re.match(r"SystemCallFilter=(.*)", line.strip())
        if m:
            for item in m.group(1).split():
                allowed |= expand(item, set()) if item.startswith("@") else {item}
    with tempfile.TemporaryDirectory(prefix="nwc-syscalls-") as d:
        sock, trace, conf = os.path.join(d, "s.sock"), os.path.join(d, "trace"), os.path.join(d, "c.conf")
        with open(conf, "w") as f:
            f.write("[daemon]\nstore = %s/st\nsocket = %s\n[memory]\nhost_budget = 64M\n" % (d, sock))
        log = open(os.path.join(d, "log"), "w")
        p = subprocess.Popen(["strace", "-f", "-qq", "-o", trace, nwcd, "--config", conf, "--threads", "2"],
                             stdout=subprocess.DEVNULL, stderr=log)
        env = dict(os.environ, NWC_SOCKET=sock)
        for _ in range(500):
            if os.path.exists(sock):
                break
            time.sleep(0.02)
        def ctl(*args):
            r = subprocess.run([nwcctl, *args], env=env, capture_output=True, text=True, timeout=60)
            if r.returncode:
                print("nwcctl %s: %s" % (" ".join(args), r.stderr.strip()))
            return r.stdout
        ctl("import", "use", sample)
        ctl("load", "use")
        ctl("evict", "use")
        ctl("pin", "use")
        ctl("unpin", "use")
        ctl("stats")
        pid = int(open(trace).readline().split()[0])  # the traced child is nwcd itself
        with open(conf, "a") as f:
            f.write("[preload]\nmodels = use\n")
        os.kill(pid, signal.SIGHUP)
        time.sleep(0.5)
        os.kill(pid, signal.SIGTERM)
        p.wait(timeout=60)
        log.close()
        used = set()
        for line in open(trace):
            line = re.sub(r"^\d+\s+", "", line)
            m = re.match(r"<\.\.\. (\w+) resumed", line) or re.match(r"(\w+)\(", line)
            if m:
                used.add(m.group(1))
        outside = sorted(used - allowed)
        print("nwcd made %d distinct system calls; the filter allows %d" % (len(used), len(allowed)))
        if "io_uring_setup" not in used:
            print("io_uring_setup never seen: the loader was not exercised")
            return 1
        if outside:
            print("outside SystemCallFilter: " + " ".join(outside))
            print(open(os.path.join(d, "log")).read())
            return 1
    return 0

if __name__ == "__main__":
    sys.exit(main())
