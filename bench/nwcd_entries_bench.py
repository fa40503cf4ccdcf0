#!/usr/bin/python3
"""nwcd_entries_bench.py - a request's cost as the daemon holds more tensors (JSON lines).

    bench/nwcd_entries_bench.py BUILD_DIR [--counts 50,5000] [--iters N] [--nwcd PATH]

For each count C: a throwaway nwcd (CPU backend, BUILD_DIR's or --nwcd's) imports and loads a
model of C small BF16 matrices (16 x 64, named model.layers.N.w) and times N (3000) socket
matvecs of one of them, one at a time, from Python (perf_counter_ns around each call), after 300
to warm up.  Every request finds its tensor's entries in residency.c: a cost that grows with the
entries (C here; tensors x places on a host of several GPUs) shows in the medians as C grows.
Prints {"bench": "nwcd_entries", "tensors": C, "p50_us": ..., "p90_us": ...} a line.
Run with Debian's python3 (numpy).
"""
import argparse
import json
import os
import sys
import time

import numpy as np

from nwcd_process import nwcd, write_bf16_safetensors


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--counts", default="50,5000")
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--nwcd", help="another nwcd binary (e.g. an older build's) with BUILD_DIR's client")
    a = ap.parse_args()
    sys.path.insert(0, os.path.join(a.build, "python"))
    import nwc  # the build's package
    rng = np.random.default_rng(1)
    for count in (int(c) for c in a.counts.split(",")):
        server = a.build
        if a.nwcd:  # nwcd_process starts BUILD/daemon/nwcd: a folder that has it there
            server = os.path.dirname(os.path.dirname(os.path.abspath(a.nwcd)))
        with nwcd(server) as (sock, folder):
            bits = {f"model.layers.{i}.w": rng.integers(0x3c00, 0x4000, (16, 64), dtype=np.uint16)
                    for i in range(count)}
            path = write_bf16_safetensors(os.path.join(folder, "m.safetensors"), bits)
            with nwc.connect(sock) as c:
                c.import_("m", path, progress=False)
                c.load("m", progress=False)
                x = rng.standard_normal(64).astype(np.float32)
                name = f"model.layers.{count // 2}.w"
                for _ in range(300):
                    c.matvec("m", name, x)
                ts = []
                for _ in range(a.iters):
                    t0 = time.perf_counter_ns()
                    c.matvec("m", name, x)
                    ts.append(time.perf_counter_ns() - t0)
            ts.sort()
            print(json.dumps({"bench": "nwcd_entries", "tensors": count,
                              "p50_us": round(ts[len(ts) // 2] / 1e3, 1),
                              "p90_us": round(ts[len(ts) * 9 // 10] / 1e3, 1)}), flush=True)


if __name__ == "__main__":
    main()
