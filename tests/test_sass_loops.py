#!/usr/bin/python3
"""test_sass_loops.py - scripts/sass-loops against functions built here (fresh seed each run,
printed): a prologue with a loop of its own, a main loop whose blocks of random lengths hold an
HMMA, `@!PT` dummies, a BRA.DIV, a conditional branch over a block and an inner loop, then EXIT
and a divergence handler that branches back into the main loop.  The script must find the main
loop (not the prologue's, not the handler's range), count its instructions, dummies and opcodes
as computed here, and count one pass with a branch taken and without it; then bad input (a
missing file, no such function, no loop with the opcode, a taken branch that leaves the loop)
must end with a one-line error and status 1.

  test_sass_loops.py SCRIPTS_DIR
"""
import collections
import os
import random
import re
import sys
import tempfile

from tool_test import finish, run, seed


def filler(rng, n):
    return [rng.choice(["IADD3 R1, R2, R3", "LOP3.LUT R4, R4, 0xf, RZ, 0xc0, !PT", "LDS R5, [R6]",
                        "@!PT LDS RZ, [RZ]", "PRMT R7, R8, 0x5140, R9", "@P1 IMAD R2, R3, R4, R5"])
            for _ in range(n)]


def build(rng):
    """The function's instructions (offset = 16 x index) and what the script must say of it."""
    ins = ["S2R R0, SR_TID.X"] + filler(rng, rng.randint(1, 5))
    pro_top = len(ins)
    ins += filler(rng, rng.randint(1, 4))
    ins.append(f"@P0 BRA {16 * pro_top:#x}")  # the prologue's loop: no HMMA
    top = len(ins)
    a = filler(rng, rng.randint(0, 6))
    ins += a + ["HMMA.16816.F32.BF16 R8, R12, R16, R8", "BRA.DIV UR4, 0x0"]
    skip_at = len(ins)
    ins.append("@!P2 BRA SKIP")
    skipped = filler(rng, rng.randint(1, 8))
    ins += skipped
    after = len(ins)
    inner_top = len(ins)
    ins += filler(rng, rng.randint(1, 4))
    ins.append(f"@P3 BRA {16 * inner_top:#x}")  # an inner loop, falling through once
    ins += filler(rng, rng.randint(0, 5))
    back = len(ins)
    ins.append(f"@P4 BRA {16 * top:#x}")
    ins += ["EXIT"] + filler(rng, rng.randint(0, 3))
    ins.append(f"BRA {16 * (top + 1):#x}")  # a handler's way back: its range holds EXIT
    ins[skip_at] = f"@!P2 BRA {16 * after:#x}"
    body = ins[top:back + 1]
    op = lambda t: (t.split()[1] if t.startswith("@") else t.split()[0]).split(".")[0]
    return ins, {
        "top": 16 * top, "back": 16 * back, "n": len(body), "dummies": sum(t.startswith("@!PT") for t in body),
        "ops": collections.Counter(op(t) for t in body), "skip": 16 * skip_at, "path_all": len(body),
        "path_skip": (len(body) - len(skipped), sum(t.startswith("@!PT") for t in body) -
                      sum(t.startswith("@!PT") for t in skipped))}


def listing(name, ins):
    lines = [f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"']
    for k, t in enumerate(ins):
        lines.append(f"        /*{16 * k:04x}*/                   {t + ' ;':<45} /* 0x{random.getrandbits(64):016x} */")
        lines.append(f"{'':<80}/* 0x{random.getrandbits(64):016x} */")
    return "\n".join(lines) + "\n"


def main():
    script = os.path.join(sys.argv[1], "sass-loops")
    rng = random.Random(seed("test_sass_loops"))
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.sass")
        funcs = {f"kernel_{i}": build(rng) for i in range(3)}
        with open(path, "w", encoding="utf-8") as f:
            for name, (ins, _) in funcs.items():
                f.write(listing(name, ins))
        for name, (_, want) in funcs.items():
            p = run(script, path, "--function", f"^{name}$", "--take", f"{want['skip']:x}")
            lines = p.stdout.splitlines()
            head = f"{name}: loop {want['top']:#x}..{want['back']:#x}: {want['n']} instructions, {want['dummies']} @!PT"
            if p.returncode != 0 or len(lines) != 3 or lines[0] != head:
                failures.append(f"{name}: printed {p.stdout!r} {p.stderr!r}, want first line {head!r}")
                continue
            got = dict(re.findall(r"(\S+) (\d+)", lines[1]))
            if {k: int(v) for k, v in got.items()} != dict(want["ops"]):
                failures.append(f"{name}: opcodes {lines[1]!r}, want {dict(want['ops'])}")
            n, dummies = want["path_skip"]
            if not lines[2].endswith(f": {n} instructions, {dummies} @!PT"):
                failures.append(f"{name}: path taking the skip {lines[2]!r}, want {n} and {dummies} @!PT")
            p = run(script, path, "--function", f"^{name}$", "--take", "ffff0", "--list")
            listed = [l for l in p.stdout.splitlines() if l.startswith("    ")]
            if p.returncode != 0 or f": {want['path_all']} instructions," not in p.stdout or \
                    len(listed) != want["path_all"]:
                failures.append(f"{name}: path taking nothing: {p.stdout[-200:]!r}, want {want['path_all']}")

        for what, args in (("a missing file", [os.path.join(tmp, "none")]),
                           ("no such function", [path, "--function", "nothing_here"]),
                           ("no loop with the opcode", [path, "--with", "FFMA"]),
                           ("a bad --take", [path, "--take", "zz"])):
            p = run(script, *args)
            if p.returncode != 1 or len(p.stderr.strip().splitlines()) != 1 or \
                    not p.stderr.startswith("sass-loops: "):
                failures.append(f"{what}: exit {p.returncode}, stderr {p.stderr!r}")
        # a path that takes a branch out of the loop (to before its top)
        out = os.path.join(tmp, "out.sass")
        with open(out, "w", encoding="utf-8") as f:
            f.write(listing("leaves", ["IADD3 R1, R2, R3", "HMMA.16816.F32.BF16 R8, R12, R16, R8",
                                       "@P1 BRA 0x0", "IADD3 R1, R2, R3", "@P4 BRA 0x10", "EXIT"]))
        p = run(script, out, "--take", "20")
        if p.returncode != 1 or "leaves the loop" not in p.stderr:
            failures.append(f"a branch out of the loop: exit {p.returncode}, stderr {p.stderr!r}")
    return finish("test_sass_loops", failures)


if __name__ == "__main__":
    sys.exit(main())
