#!/usr/bin/python3
"""python_linear.py - Python's cost per NwcLinear call over the C call it makes (JSON lines).

    bench/python_linear.py BUILD_DIR [--iters N] [--rounds R]

Starts BUILD_DIR/daemon/nwcd (CPU backend) on a temporary store, imports a random BF16 matrix
of each size (written here with numpy and the standard library), and times, for 1 and 8 rows
of float32 input, on the two paths NwcLinear has (the daemon's matvec over the socket, and a
host map's in-process matvec):

  c_call_us   the C function called through ctypes with everything prepared (nwc_client_matvec
              or nwc_client_map_matvec, output preallocated): the C call as Python sees it,
              ctypes' own argument conversion included;
  forward_us  NwcLinear.forward(x): shape checks, the output tensor, the same C call;
  module_us   nwc_linear(x), through nn.Module.__call__ (what a model pays; nn.Linear too).

overhead_us and module_overhead_us: the median of the per-call differences forward - c_call and
module - c_call (the issue's target: at most 5 us).  The three are timed call by call, in turn,
R x N times (perf_counter_ns around each call); every figure is a median, so that a moment
when the shared machine runs something else spoils one sample, not the result.
Run with Debian's python3 (numpy, torch).
"""
import argparse
import json
import os
import statistics
import sys
import time

from nwcd_process import nwcd, write_bf16_safetensors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=15)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import numpy as np
    import torch
    import nwc
    from nwc import _lib
    from nwc.torch import NwcLinear
    torch.set_num_threads(1)

    with nwcd(build, "cpu") as (sock, d):
        c = nwc.connect(sock)
        rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
        for M, K in ((16, 64), (64, 512), (512, 1024)):
            w = (rng.standard_normal((M, K)) * 0.02).astype(np.float32)
            bits = (w.view(np.uint32) >> 16).astype(np.uint16)
            path = write_bf16_safetensors(os.path.join(d, f"w{M}.safetensors"), {"w": bits})
            name = f"w{M}x{K}"
            c.import_(name, path, progress=False)
            c.load(name, progress=False)
            for mapped in (False, True):
                lin = NwcLinear(c, name, "w", mapped=mapped)
                for n in (1, 8):
                    x = torch.from_numpy(rng.standard_normal((n, K)).astype(np.float32))
                    y = torch.empty(n, M)
                    fn = lib_call(_lib, c, lin, name, x, y, n, K, M, mapped)
                    kinds = {"c_call": fn, "forward": lambda: lin.forward(x),
                             "module": lambda: lin(x)}
                    for f in kinds.values():  # warm up
                        for _ in range(200):
                            f()
                    # Paired per-call times: each iteration times the three once, in turn, so
                    # a noisy moment hits one pair, and the medians ignore it.
                    pc = time.perf_counter_ns
                    fc, ff, fm = kinds["c_call"], kinds["forward"], kinds["module"]
                    tc, tf, tm, df, dm = [], [], [], [], []
                    for _ in range(a.rounds * a.iters):
                        t0 = pc()
                        fc()
                        t1 = pc()
                        ff()
                        t2 = pc()
                        fm()
                        t3 = pc()
                        tc.append(t1 - t0), tf.append(t2 - t1), tm.append(t3 - t2)
                        df.append((t2 - t1) - (t1 - t0)), dm.append((t3 - t2) - (t1 - t0))
                    us = lambda v: round(statistics.median(v) / 1e3, 3)  # noqa: E731
                    print(json.dumps({
                        "bench": "python_linear", "path": "map" if mapped else "daemon",
                        "M": M, "K": K, "rows": n, "calls": a.rounds * a.iters,
                        "c_call_us": us(tc), "forward_us": us(tf), "module_us": us(tm),
                        "overhead_us": us(df), "module_overhead_us": us(dm)}), flush=True)
                del lin
        c.close()


def lib_call(_lib, c, lin, name, x, y, n, K, M, mapped):
    """The bare C call, its arguments prepared once (as fast as Python can make it)."""
    L = _lib.lib()
    m, w, xp, yp, cap = name.encode(), b"w", x.data_ptr(), y.data_ptr(), n * M * 4
    if mapped:
        mp = lin.mapping._ptr()
        f = L.nwc_client_map_matvec
        return lambda: f(mp, None, 1.0, xp, n, 0, yp, cap)
    h = c.handle
    f = L.nwc_client_matvec
    return lambda: f(h, m, w, None, 1.0, xp, K, n, 0, yp, cap, None)


if __name__ == "__main__":
    main()
