"""conftest.py - what the Python package's tests share: a fresh random seed (printed;
NWC_SEED replays one), safetensors files written with the standard library and numpy from
known values (the independent reference: BF16 rounded to nearest even here, not by nwc), and a
real nwcd on a temporary store and socket (NWCD_PATH, CPU backend unless asked), stopped with
SIGTERM and required to exit 0.
"""
import json
import os
import signal
import socket
import struct
import subprocess
import tempfile
import time

import numpy as np
import pytest


@pytest.fixture(scope="module")
def rng():
    seed = int(os.environ.get("NWC_SEED") or int.from_bytes(os.urandom(4), "little"))
    print(f"seed {seed} (NWC_SEED={seed} replays it)")
    return np.random.default_rng(seed)


def bf16_bits(a):
    """float32 -> BF16 bits (uint16), round to nearest even (finite values)."""
    b = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_float(bits):
    """BF16 bits -> float32 values."""
    return (np.asarray(bits, dtype=np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors):
    """tensors: name -> numpy array; uint16 arrays are written as BF16 bits, int64 as I64,
    float32 as F32.  Returns path."""
    kinds = {np.dtype(np.uint16): "BF16", np.dtype(np.int64): "I64",
             np.dtype(np.float32): "F32"}
    header, blobs, off = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": kinds[a.dtype], "shape": list(a.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    return path


def read_safetensors(path):
    """name -> the BF16 tensors of a safetensors file, their bits (uint16) in their own shape."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name != "__metadata__" and t["dtype"] == "BF16":
            a, b = t["data_offsets"]
            out[name] = np.frombuffer(data[a:b], dtype="<u2").reshape(t["shape"])
    return out


def _connectable(path):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


class Daemon:
    """A real nwcd: .dir (temporary), .sock, .log; stop() returns its exit status."""

    def __init__(self, *extra, backend="cpu"):
        self.dir = tempfile.mkdtemp(prefix="nwc-py-")
        self.sock = os.path.join(self.dir, "nwcd.sock")
        self.log = os.path.join(self.dir, "nwcd.log")
        env = dict(os.environ, NWCD_CONFIG="")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [os.environ["NWCD_PATH"], "--store", os.path.join(self.dir, "store"), "--socket",
                 self.sock, "--threads", "2", "--backend", backend, *extra],
                stdout=subprocess.DEVNULL, stderr=log, env=env)
        for _ in range(1000):
            if self.proc.poll() is not None:
                raise RuntimeError(f"nwcd exited with {self.proc.returncode}: {self.tail()}")
            if _connectable(self.sock):
                return
            time.sleep(0.01)
        self.proc.kill()
        raise RuntimeError("nwcd did not start: " + self.tail())

    def tail(self):
        with open(self.log) as f:
            return f.read()[-2000:]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return -1


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    rc = d.stop()
    subprocess.run(["rm", "-rf", d.dir], check=False)
    assert rc == 0, f"nwcd exited with {rc}: {d.tail()}"


@pytest.fixture(scope="module")
def client(daemon):
    import nwc
    with nwc.connect(daemon.sock) as c:
        yield c
