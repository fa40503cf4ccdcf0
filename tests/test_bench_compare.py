#!/usr/bin/python3
"""test_bench_compare.py - scripts/bench-compare against numbers computed here: two runs of random
nwc_gpu_bench records (fresh seed each run, printed), with other records and table lines mixed in
and a shape only one run has, whose per-shape times, speed-ups and geometric means the comparison
must print as this test computes them; then bad input (a missing file, a malformed record, a run
without records, --names of the wrong count) must end with a one-line error and status 2.

  test_bench_compare.py SCRIPTS_DIR
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile


def run(script, *args):
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def main():
    script = os.path.join(sys.argv[1], "bench-compare")
    seed = int.from_bytes(os.urandom(8), "little")
    print(f"test_bench_compare: seed {seed}")
    rng = random.Random(seed)
    failures = []
    shapes = [f"{rng.randint(1, 99999)}x{rng.randint(1, 99999)}" for _ in range(rng.randint(2, 9))]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for r in range(2):
            rows, lines = {}, ['{"bench":"device","name":"H200"}', "shape   nwc_us  cublas_us"]
            for s in shapes + ([f"only{r}x1"] if r == 1 else []):
                nwc, cublas = round(rng.uniform(1, 500), 2), round(rng.uniform(1, 500), 2)
                rows[s] = (nwc, cublas)
                lines.append(json.dumps({"bench": "linear_bf16", "shape": s, "nwc_graph_us": nwc,
                                         "cublas_graph_us": cublas, "speedup_graph": 0}))
                lines.append(json.dumps({"bench": "dequant_bf16", "shape": s, "graph_us": 1.0}))
            nwc, cublas = round(rng.uniform(1000, 3000), 1), round(rng.uniform(1000, 3000), 1)
            rows["token step: m"] = (nwc, cublas)
            lines.append(json.dumps({"bench": "token_step", "model": "m", "nwc_graph_us": nwc,
                                     "cublas_graph_us": cublas}))
            paths.append(os.path.join(tmp, f"run{r}.jsonl"))
            write(paths[-1], lines)
            runs.append(rows)
        p = run(script, *paths, "--names", "a,b")
        if p.returncode != 0:
            failures.append(f"exit {p.returncode}: {p.stderr.strip()}")
        out = {line.split()[0] if not line.startswith("token step") else "token step: m": line
               for line in p.stdout.splitlines()[1:]}
        for s in shapes + ["only1x1", "token step: m"]:
            line = out.get(s)
            if line is None:
                failures.append(f"{s}: no line")
                continue
            cells = line[len(s):].split() if s != "token step: m" else line[len("token step: m"):].split()
            want = []
            for rows in runs:
                if s in rows:
                    nwc, cublas = rows[s]
                    want += [f"{nwc:.2f}", f"{cublas / nwc:.3f}x"]
                else:
                    want += ["-"]
            if cells != want:
                failures.append(f"{s}: printed {cells}, want {want}")
        for i, rows in enumerate(runs):
            x = [c / n for k, (n, c) in rows.items() if not k.startswith("token")]
            want = f"{math.exp(sum(map(math.log, x)) / len(x)):.3f}x"
            got = out.get("geomean", "").split()[1:]
            if len(got) != 2 or got[i] != want:
                failures.append(f"run {i}: geomean {got}, want {want}")
        if "a" not in p.stdout.splitlines()[0].split() or "b" not in p.stdout.splitlines()[0].split():
            failures.append(f"header {p.stdout.splitlines()[0]!r} lacks the --names")

        bad = os.path.join(tmp, "bad.jsonl")
        write(bad, ['{"bench":"linear_bf16","shape":"1x1"}'])
        empty = os.path.join(tmp, "empty.jsonl")
        write(empty, ['{"bench":"device"}', "table"])
        for what, args in (("a missing file", [os.path.join(tmp, "none")]), ("a malformed record", [bad]),
                           ("no records", [empty]), ("--names of the wrong count", [paths[0], "--names", "a,b"])):
            p = run(script, *args)
            if p.returncode != 2 or len(p.stderr.strip().splitlines()) != 1 or p.stdout:
                failures.append(f"{what}: exit {p.returncode}, stderr {p.stderr!r}, stdout {p.stdout!r}")
    for f in failures:
        print("FAIL:", f)
    print("test_bench_compare:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
