"""nwcd_process.py - a throwaway nwcd for the Python benchmarks: started from a build tree on a
temporary store and socket, stopped with SIGTERM and its folder removed on exit; and the BF16
safetensors file they import.

    with nwcd(build, backend="cuda") as (sock, folder):
        c = nwc.connect(sock)
"""
import contextlib
import json
import os
import signal
import socket
import struct
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


def write_bf16_safetensors(path: str, tensors: dict) -> str:
    """A safetensors file of BF16 tensors: name -> numpy array of their bits (uint16 or int16,
    any shape), in order.  Returns path."""
    header, off = {}, 0
    for name, bits in tensors.items():
        header[name] = {"dtype": "BF16", "shape": list(bits.shape),
                        "data_offsets": [off, off + bits.nbytes]}
        off += bits.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for bits in tensors.values():
            f.write(bits.astype(bits.dtype.newbyteorder("<")).tobytes())
    return path
