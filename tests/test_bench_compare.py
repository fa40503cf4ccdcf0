#!/usr/bin/python3
"""test_bench_compare.py - scripts/bench-compare against numbers computed here: two runs of random
nwc_gpu_bench records (fresh seed each run, printed), with other records and table lines mixed in
and a shape only one run has, whose per-shape times, speed-ups and geometric means the comparison
must print as this test computes them, and, by the runs' names (a, b and a, b, a, b), each name's
mean times and b's over a's; with --fp8 the same of the runs' linear_fp8 records (nwc against
nwc_k_ref_fp8), with --dequant of their dequant_bf16 records (time and TB/s out), none of the
others; then bad input (a missing file, a malformed record, a run
without records, --names of the wrong count) must end with a one-line error and status 2.

  test_bench_compare.py SCRIPTS_DIR
"""
import json
import math
import os
import random
import sys
import tempfile

from tool_test import finish, run, seed


def write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def by_name(text, runs, shapes, names):
    """The failures of the by-name section `text` for runs named names: each name's mean time of
    each shape all its runs have, b's over a's, and their geometric mean over those shapes."""
    failures, lines = [], text.splitlines()
    if not lines or not lines[0].startswith("mean us by name"):
        return [f"by name: no section ({text[:60]!r})"]
    rows = {line.split()[0] if not line.startswith("token step") else "token step: m": line for line in lines[1:]}
    ratios = []
    for s in shapes + ["only1x1", "token step: m"]:
        per = {n: [r[s][0] for m, r in zip(names, runs) if m == n and s in r] for n in ("a", "b")}
        if any(len(per[n]) != names.count(n) for n in per):
            if s in rows:
                failures.append(f"by name: {s} printed, but not every run has it")
            continue
        ma, mb = (sum(per[n]) / len(per[n]) for n in ("a", "b"))
        want = [f"{ma:.2f}", f"{mb:.2f}", f"{mb / ma:.4f}"]
        got = rows.get(s, "")[len(s):].split()
        if got != want:
            failures.append(f"by name: {s} printed {got}, want {want}")
        if not s.startswith("token"):
            ratios.append(mb / ma)
    want = f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.4f}"
    if rows.get("geomean", "").split()[1:] != [want]:
        failures.append(f"by name: geomean {rows.get('geomean')!r}, want {want}")
    return failures


def main():
    script = os.path.join(sys.argv[1], "bench-compare")
    rng = random.Random(seed("test_bench_compare"))
    failures = []
    shapes = [f"{rng.randint(1, 99999)}x{rng.randint(1, 99999)}" for _ in range(rng.randint(2, 9))]
    runs, fp8, deq = [], [{}, {}], [{}, {}]
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for r in range(2):
            rows, lines = {}, ['{"bench":"device","name":"H200"}', "shape   nwc_us  cublas_us"]
            for s in shapes + ([f"only{r}x1"] if r == 1 else []):
                nwc, cublas = round(rng.uniform(1, 500), 2), round(rng.uniform(1, 500), 2)
                rows[s] = (nwc, cublas)
                lines.append(json.dumps({"bench": "linear_bf16", "shape": s, "nwc_graph_us": nwc,
                                         "cublas_graph_us": cublas, "speedup_graph": 0}))
                dus, dtb = round(rng.uniform(1, 500), 2), round(rng.uniform(0.5, 4), 3)
                deq[r][s] = (dus, dtb)
                lines.append(json.dumps({"bench": "dequant_bf16", "shape": s, "graph_us": dus, "out_tbps": dtb}))
                nwc8, ref8 = round(rng.uniform(1, 500), 2), round(rng.uniform(1, 500), 2)
                fp8[r][s] = (nwc8, ref8)
                lines.append(json.dumps({"bench": "linear_fp8", "shape": s, "nwc_graph_us": nwc8,
                                         "ref_fp8_graph_us": ref8, "speedup_graph": 0}))
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
        first, _, second = p.stdout.partition("\n\n")
        out = {line.split()[0] if not line.startswith("token step") else "token step: m": line
               for line in first.splitlines()[1:]}
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
        failures += by_name(second, runs, shapes, ["a", "b"])

        # An A/B of two runs a name (a, b, a, b): each name's mean and b's time over a's.
        p = run(script, *paths, *paths, "--names", "a,b,a,b")
        second = p.stdout.partition("\n\n")[2]
        if p.returncode != 0:
            failures.append(f"a,b,a,b: exit {p.returncode}: {p.stderr.strip()}")
        failures += by_name(second, runs + runs, shapes, ["a", "b", "a", "b"])
        p = run(script, paths[0], paths[0], "--names", "a,a")
        if "\n\n" in p.stdout:
            failures.append("one name: a by-name section printed")

        # --fp8: the linear_fp8 records, each ref_fp8 time over its run's nwc time; --dequant: the
        # dequant records, time and TB/s out; nothing else
        for flag, recs, second_of, unit in (("--fp8", fp8, lambda t, o: o / t, "x"),
                                            ("--dequant", deq, lambda t, o: o, "T")):
            p = run(script, *paths, "--names", "a,b", flag)
            first, _, second = p.stdout.partition("\n\n")
            out = {line.split()[0]: line.split()[1:] for line in first.splitlines()[1:]}
            if p.returncode != 0 or set(out) != set(shapes + ["only1x1", "geomean"]):
                failures.append(f"{flag}: exit {p.returncode}, rows {sorted(out)}: {p.stderr.strip()}")
            for s in shapes + ["only1x1"]:
                want = []
                for rows in recs:
                    want += [f"{rows[s][0]:.2f}", f"{second_of(*rows[s]):.3f}{unit}"] if s in rows else ["-"]
                if out.get(s) != want:
                    failures.append(f"{flag} {s}: printed {out.get(s)}, want {want}")
            for i, rows in enumerate(recs):
                x = [second_of(*v) for v in rows.values()]
                want = f"{math.exp(sum(map(math.log, x)) / len(x)):.3f}{unit}"
                if len(out.get("geomean", [])) != 2 or out["geomean"][i] != want:
                    failures.append(f"{flag} run {i}: geomean {out.get('geomean')}, want {want}")
            failures += by_name(second, recs, shapes, ["a", "b"])

        bad = os.path.join(tmp, "bad.jsonl")
        write(bad, ['{"bench":"linear_bf16","shape":"1x1"}'])
        empty = os.path.join(tmp, "empty.jsonl")
        write(empty, ['{"bench":"device"}', "table"])
        for what, args in (("a missing file", [os.path.join(tmp, "none")]), ("a malformed record", [bad]),
                           ("no records", [empty]), ("--names of the wrong count", [paths[0], "--names", "a,b"]),
                           ("--fp8 without fp8 records", [empty, "--fp8"])):
            p = run(script, *args)
            if p.returncode != 2 or len(p.stderr.strip().splitlines()) != 1 or p.stdout:
                failures.append(f"{what}: exit {p.returncode}, stderr {p.stderr!r}, stdout {p.stdout!r}")
    return finish("test_bench_compare", failures)


if __name__ == "__main__":
    sys.exit(main())
