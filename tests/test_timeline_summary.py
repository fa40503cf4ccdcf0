#!/usr/bin/python3
"""test_timeline_summary.py - scripts/timeline-summary against numbers computed here: a timeline of
random warps (fresh seed each run, printed) in the format nwc_k_timeline_dump writes, whose marks'
percentiles, durations, per-SM means and the middle launch's CTAs by tenths the summary must
print as this test computes them independently; then bad input (a short line, a missing file, no
records for --tag) must end with a one-line error and a non-zero status.

  test_timeline_summary.py SCRIPTS_DIR
"""
import os
import random
import statistics
import sys
import tempfile

from tool_test import finish, run, seed

CLOCK_MHZ = 1500.0  # not the default: the option must reach the conversion


def pct(values, p):
    v = sorted(values)
    return v[min(len(v) - 1, int(p / 100 * len(v)))]


def main():
    script = os.path.join(sys.argv[1], "timeline-summary")
    rng = random.Random(seed("test_timeline_summary"))
    failures = []
    lines, warps = [], {}
    per_ns = CLOCK_MHZ / 1000.0
    for launch in (7, 8, 9):
        recs = []
        for cta in range(rng.randint(2, 12)):
            for w in range(8):
                g0 = 10**9 + launch * 10**6 + rng.randint(0, 5000)
                clk = [rng.randint(0, 10**6)]
                for _ in range(4):
                    clk.append(clk[-1] + rng.randint(1, 20000))
                sm = rng.randint(0, 5)
                g4 = g0 + int((clk[4] - clk[0]) / per_ns) + rng.randint(0, 500)
                recs.append((cta, w, sm, g0, g4, clk))
                lines.append(f"9x13 {launch} {cta} {w} {sm} {g0} {g4} " + " ".join(map(str, clk)))
        warps[launch] = recs
    lines.append("1x1 3 0 0 0 5 6 1 2 3 4 5")  # another shape, left out by --tag
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "tl.txt")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        r = run(script, path, "--clock-mhz", str(CLOCK_MHZ), "--tag", "9x13")
        if r.returncode != 0:
            failures.append(f"exit {r.returncode}: {r.stderr.strip()}")
        out = r.stdout
        if "1x1" in out:
            failures.append("--tag 9x13 printed the other shape")
        for launch, recs in warps.items():
            base = min(g0 for _, _, _, g0, _, _ in recs)
            block = out.split(f" launch {launch}:", 1)[1] if f" launch {launch}:" in out else ""
            for i, name in enumerate(["wait passed", "range end"], start=1):
                mark = 1 if i == 1 else 3
                at = [(g0 + (clk[mark] - clk[0]) / per_ns - base) / 1e3 for _, _, _, g0, _, clk in recs]
                want = " ".join("%7.2f" % pct(at, p) for p in (0, 10, 50, 90, 100))
                if f"   {name:<11} {want}" not in block:
                    failures.append(f"launch {launch}: {name} is not {want}")
            stream = [(clk[3] - clk[1]) / per_ns / 1e3 for *_, clk in recs]
            want = " ".join("%7.2f" % pct(stream, p) for p in (10, 50, 90))
            if f"streaming {want}" not in block:
                failures.append(f"launch {launch}: streaming durations are not {want}")
        mid = sorted(warps)[1]
        by_sm = {}
        for _, _, sm, _, _, clk in warps[mid]:
            by_sm.setdefault(sm, []).append((clk[3] - clk[1]) / per_ns / 1e3)
        means = sorted(sum(v) / len(v) for v in by_sm.values())
        want = " ".join("%7.2f" % pct(means, p) for p in (0, 10, 50, 90, 100))
        if f"launch {mid}, streaming (wait to range end): per-SM mean {want}" not in out:
            failures.append(f"per-SM means are not {want}")
        recs = warps[mid]
        base = min(g0 for _, _, _, g0, _, _ in recs)
        ctas = max(cta for cta, *_ in recs) + 1
        for t in sorted({cta * 10 // ctas for cta, *_ in recs}):
            g = [r for r in recs if r[0] * 10 // ctas == t]
            at = lambda r, i: (r[3] + (r[5][i] - r[5][0]) / per_ns - base) / 1e3
            want = (f"   {t}: {statistics.median(at(r, 0) for r in g):7.2f}"
                    f" {statistics.median(at(r, 1) for r in g):7.2f}"
                    f" {statistics.median(at(r, 3) for r in g):7.2f}"
                    f" {statistics.median((r[5][3] - r[5][1]) / per_ns / 1e3 for r in g):7.2f}")
            if want not in out.split("CTAs by tenths", 1)[-1]:
                failures.append(f"CTAs' tenth {t} is not {want.strip()}")
        if out.count("correlation") != 2:
            failures.append("not one correlation line per pair of launches")

        with open(path, "a") as f:
            f.write("9x13 7 0 0\n")
        for args, what in (([path], "a short line"), ([os.path.join(tmp, "none.txt")], "a missing file"),
                           ([path, "--tag", "5x5"], "no records")):
            if what == "no records":
                with open(path, "w") as f:
                    f.write("\n".join(lines) + "\n")
            r = run(script, *args)
            err = r.stderr.strip().splitlines()
            if r.returncode == 0 or len(err) != 1 or not err[0].startswith("timeline-summary: "):
                failures.append(f"{what}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    return finish("test_timeline_summary", failures)


if __name__ == "__main__":
    sys.exit(main())
