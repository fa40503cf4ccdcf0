#!/usr/bin/python3
"""test_sass_waits.py - scripts/sass-waits against control codes chosen here: random functions in
cuobjdump --dump-sass's format (fresh seed each run, printed), each instruction's second word
built from a stall count, yield, write and read barriers, a wait mask and reuse flags at the
places the sm_70+ encoding keeps them (bits 105 - 127), which the listing must print back, and,
for an instruction asked about with --at, every instruction that sets a barrier it waits for,
nearest first going back around the function, as computed here; then bad input (no such
function, an instruction without its second word) must end with an error and status 1, and a
reader that stops early (`| head`) must not get a traceback.

  test_sass_waits.py SCRIPTS_DIR
"""
import os
import random
import re
import subprocess
import sys
import tempfile

from tool_test import finish, run, seed


def control(stall, yld, wr, rd, wait, reuse):
    return (stall | yld << 4 | wr << 5 | rd << 8 | wait << 11 | reuse << 17) << 41


def function_text(name, insns):
    lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"']
    for k, i in enumerate(insns):
        text = f"{i['op']} R{k % 200}, R{(k + 7) % 200} ;"
        lines.append(f"        /*{16 * k:04x}*/                   {text:<45} /* 0x{random.getrandbits(64):016x} */")
        high = control(i["stall"], i["yield"], i["wr"], i["rd"], i["wait"], i["reuse"]) | random.getrandbits(41)
        lines.append(f"{'':<80}/* 0x{high:016x} */")
    return lines


def random_insn():
    return {"op": random.choice(["IADD3", "LDG.E", "LDS.128", "HMMA.16816.F32.BF16", "BRA", "SHFL.IDX"]),
            "stall": random.randrange(16), "yield": random.randrange(2),
            "wr": random.choice([7, 7, random.randrange(6)]), "rd": random.choice([7, 7, 7, random.randrange(6)]),
            "wait": random.choice([0, 0, random.randrange(64)]), "reuse": random.randrange(16)}


def main():
    scripts = sys.argv[1]
    tool = os.path.join(scripts, "sass-waits")
    random.seed(seed("test_sass_waits"))
    failures = []
    funcs = {f"_Z4kern{n}v": [random_insn() for _ in range(random.randint(5, 60))] for n in range(3)}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.sass")
        with open(path, "w") as f:
            f.write("\nFatbin elf code:\n================\narch = sm_90\n\n")
            for name, insns in funcs.items():
                f.write("\n".join(function_text(name, insns)) + "\n\n")
        # the listing of one function: every control field back, in order
        name = random.choice(list(funcs))
        r = run(tool, path, "--function", name)
        lines = [l for l in r.stdout.splitlines() if not l.startswith("==")]
        if r.returncode != 0 or len(lines) != len(funcs[name]):
            failures.append(f"listing {name}: status {r.returncode}, {len(lines)} lines for {len(funcs[name])}: {r.stderr}")
        for k, (line, i) in enumerate(zip(lines, funcs[name])):
            sets = " ".join(f"{t}{b}" for t, b in (("w", i["wr"]), ("r", i["rd"])) if b != 7)
            waits = ",".join(str(b) for b in range(6) if i["wait"] >> b & 1)
            m = re.match(r"([0-9a-f]{5})  s(\d+)\s+((?:[wr]\d ?)*)\s*(?:wait ([\d,]+))?\s+(\S+)", line)
            got = m and (int(m.group(1), 16), int(m.group(2)), m.group(3).strip(), m.group(4) or "", m.group(5))
            want = (16 * k, i["stall"], sets, waits, i["op"])
            if got != want:
                failures.append(f"{name} instruction {k}: {line!r}, expected {want}")
        # --at: the setters of each barrier waited for, nearest first, around the function
        insns = funcs[name]
        waiting = [k for k, i in enumerate(insns) if i["wait"]] or [0]
        k = random.choice(waiting)
        r = run(tool, path, "--function", name, "--at", f"{16 * k:x}")
        want = []
        for b in range(6):
            if not insns[k]["wait"] >> b & 1:
                continue
            who = [d for d in range(1, len(insns)) if b in (insns[(k - d) % len(insns)]["wr"], insns[(k - d) % len(insns)]["rd"])]
            want.append((b, who[:8], len(who)))
        got, cur = [], None
        for line in r.stdout.splitlines():
            m = re.match(r"  barrier (\d): set by (\d+) instruction", line)
            if m:
                cur = (int(m.group(1)), [], int(m.group(2)))
                got.append(cur)
            m = re.match(r"    -(\d+)\s", line)
            if m and cur:
                cur[1].append(int(m.group(1)))
        if r.returncode != 0 or got != want:
            failures.append(f"--at {16 * k:x} of {name}: got {got}, expected {want} ({r.stderr})")
        # bad input: an unknown function; an instruction without its control word
        r = run(tool, path, "--function", "nosuch")
        if r.returncode != 1 or "no function matching" not in r.stderr:
            failures.append(f"unknown function: status {r.returncode}, {r.stderr!r}")
        cut = os.path.join(d, "cut.sass")
        text = open(path).read().splitlines()
        drop = next(n for n, l in enumerate(text) if re.match(r"^\s+/\* 0x", l))
        open(cut, "w").write("\n".join(text[:drop] + text[drop + 1:]) + "\n")
        r = run(tool, cut)
        if r.returncode != 1 or "has no second word" not in r.stderr:
            failures.append(f"a missing second word: status {r.returncode}, {r.stderr!r}")
        # a reader that stops early (`| head`): a quiet end, no traceback
        big = os.path.join(d, "big.sass")
        with open(big, "w") as f:
            f.write("\n".join(function_text("_Z3bigv", [random_insn() for _ in range(6000)])) + "\n")
        p = subprocess.Popen([sys.executable, tool, big], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        p.stdout.readline()
        p.stdout.close()
        err = p.stderr.read()
        p.wait()
        if "Traceback" in err:
            failures.append(f"a reader that stops early: {err.strip().splitlines()[-1]}")
    return finish("test_sass_waits", failures)


if __name__ == "__main__":
    sys.exit(main())
