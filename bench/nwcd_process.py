"""nwcd_process.py - a throwaway nwcd for the Python benchmarks: started from a build tree on a
temporary store and socket, stopped with SIGTERM and its folder removed on exit.

    with nwcd(build, backend="cuda") as (sock, folder):
        c = nwc.connect(sock)
"""
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator, Tuple


@contextlib.contextmanager
def nwcd(build: str, backend: str = "cpu", threads: int = 1) -> Iterator[Tuple[str, str]]:
    """(socket path, temporary folder) of an nwcd from build/daemon/nwcd while the block runs;
    RuntimeError with its log when it does not start within 10 s."""
    d = tempfile.mkdtemp(prefix="nwc-pybench-")
    sock, logpath = os.path.join(d, "nwcd.sock"), os.path.join(d, "nwcd.log")
    with open(logpath, "w") as log:
        proc = subprocess.Popen([os.path.join(build, "daemon", "nwcd"), "--store", d + "/store",
                                 "--socket", sock, "--backend", backend, "--threads",
                                 str(threads)], stdout=subprocess.DEVNULL, stderr=log,
                                env=dict(os.environ, NWCD_CONFIG=""))
    try:
        for _ in range(1000):
            if proc.poll() is not None:
                break
            with socket.socket(socket.AF_UNIX) as s:
                if s.connect_ex(sock) == 0:
                    break
            time.sleep(0.01)
        else:
            proc.kill()
        if proc.poll() is not None:
            with open(logpath) as f:
                raise RuntimeError(f"nwcd did not start (exit {proc.returncode}): "
                                   f"{f.read()[-2000:]}")
        yield sock, d
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        subprocess.run(["rm", "-rf", d], check=False)
