#!/usr/bin/python3
"""test_sass_local.py - scripts/sass-local without nvcc, network or a real nvdisasm: a stand-in
nvdisasm, given with --nvdisasm, prints a listing written here in nvdisasm -c -hex's form
(random functions, fresh seed each run, printed: instructions with random words, labels and
branches to them, a subroutine inside a kernel's section that a CALL reaches, its RET naming the
kernel, and instructions printed as their two words alone, as an nvdisasm prints one it does not
know).  The output must be cuobjdump --dump-sass's form: a Function line for each kernel alone,
every instruction at its offset with its two words (UNKNOWN.0xNNN, its guard kept, for the bare
ones), branch targets as offsets, and scripts/sass-waits must read it.  The stand-in acts two
nvdisasm versions: one that reads nvcc 13's ELF ABI 8 header (the cubin must come unpatched)
and one that refuses it as 11.8 does, which must get a copy with the ABI 7 header (byte 8 = 7,
e_flags 0x005a055a) and leave the cubin as it was.  Then bad input must end with status 1 and a
message (not a cubin, another e_machine, sm_80's header, ABI 6, a missing file, an nvdisasm
that is not executable), an unknown option with 2, and --help with 0 and the usage; nothing is
fetched into the cache (NWC_CACHE is a fresh folder) when --nvdisasm is given.

  test_sass_local.py SCRIPTS_DIR
"""
import os
import random
import re
import stat
import struct
import subprocess
import sys
import tempfile

from tool_test import finish, run, seed

STANDIN = r'''#!{python}
import os, struct, sys
if "--version" in sys.argv:
    print("nvdisasm: stand-in\nCuda compilation tools, release {release}, V0")
    sys.exit(0)
path = sys.argv[-1]
data = open(path, "rb").read()
abi, flags = data[8], struct.unpack_from("<I", data, 0x30)[0]
open(os.environ["STANDIN_SEEN"], "a").write(f"{{abi}} {{flags:08x}} {{path}}\n")
if {old} and abi == 8:
    sys.exit("nvdisasm fatal   : Elf file '" + path + "' does not contain Cuda architecture information")
if ({old} and (abi, flags) != (7, 0x5A055A)) or (not {old} and abi != 8):
    sys.exit(f"stand-in: unexpected header: ABI {{abi}}, e_flags 0x{{flags:08x}}")
sys.stdout.write(open(os.environ["STANDIN_LISTING"]).read())
'''


def cubin(abi=8, flags=0x06005A04, machine=190):
    head = bytearray(b"\x7fELF\x02\x01\x01\x41" + bytes([abi]) + bytes(7))
    head += struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 64, 0, flags, 64, 56, 0, 64, 0, 0)
    return bytes(head) + bytes(range(256)) * 4


def insn_line(off, text, low):
    return f"        /*{off:04x}*/                   {text:<57}/* 0x{low:016x} */"


def word_line(word):
    return f"{'':92}/* 0x{word:016x} */"


def make_listing(nfuncs):
    """(nvdisasm's text, {function: [(offset, expected text, low, high)]})."""
    out = ['\t.headerflags\t@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90"', '\t.elftype\t@"ET_EXEC"', ""]
    want, label_no = {}, 0
    for f in range(nfuncs):
        name = f"_ZN5nwc_k6kernel{f}ILi{f}EEEvv"
        sub = f"$__internal_{f}_$__cuda_sm20_div_u64" if f == nfuncs - 1 else None
        n, nsub = random.randint(20, 80), (random.randint(5, 15) if sub else 0)
        kinds = [random.choice("nnnnnbbuL") for _ in range(n + nsub)]
        if f == 0:
            kinds[0] = "u"  # a function that starts with one
        labels = {}  # instruction index -> label
        for k, kind in enumerate(kinds):
            if kind == "L" or random.random() < 0.1:
                labels[k] = f".L_x_{label_no}"
                label_no += 1
        targets = list(labels)
        out += [f"//--------------------- .text.{name} --------------------------",
                f'\t.section\t.text.{name},"ax",@progbits', "\t.align\t128", f".text.{name}:",
                f"        .type           {name},@function",
                f"        .size           {name},(.L_x_end{f} - {name})",
                f'        .other          {name},@"STO_CUDA_ENTRY STV_DEFAULT"', f"{name}:"]
        rows = []
        for k, kind in enumerate(kinds):
            if sub and k == n:
                out += [f"        .weak           {sub}", f"        .type           {sub},@function",
                        f"        .size           {sub},(.L_x_end{f} - {sub})", f"{sub}:"]
            if k in labels:
                out.append(f"{labels[k]}:")
            low, high, off = random.getrandbits(64), random.getrandbits(64), 16 * k
            if kind == "u":  # an instruction this nvdisasm does not know: its words alone
                pred = random.randrange(16)
                low = low & ~0xF000 | pred << 12
                guard = "" if pred & 7 == 7 else f"@{'!' if pred & 8 else ''}P{pred & 7} "
                out += [word_line(low), word_line(high)]
                rows.append((off, f"{guard}UNKNOWN.0x{low & 0xFFF:03x}", low, high))
                continue
            if kind == "b" and targets:
                t = random.choice(targets)
                text, expect = f"@!P{k % 7} BRA `({labels[t]}) ;", f"@!P{k % 7} BRA 0x{16 * t:x}"
            elif sub and k == 1:
                text, expect = f"CALL.REL.NOINC `({sub}) ;", f"CALL.REL.NOINC 0x{16 * n:x}"
            elif sub and k == n + nsub - 1:
                text, expect = f"RET.REL.NODEC R6 `({name}) ;", "RET.REL.NODEC R6 0x0"
            else:
                text = f"IADD3 R{k % 200}, R{(k + 3) % 200}, 0x{k:x}, RZ ;"
                expect = text.rstrip(" ;")
            out += [insn_line(off, text, low), word_line(high)]
            rows.append((off, expect, low, high))
        out += [f".L_x_end{f}:", "", ""]
        want[name] = rows
    return "\n".join(out) + "\n", want


def read_output(path):
    """{function: [(offset, text, low, high)]} from sass-local's output."""
    got, cur, lines = {}, None, open(path).read().splitlines()
    for k, line in enumerate(lines):
        m = re.match(r"^\t\tFunction : (\S+)$", line)
        if m:
            cur = got.setdefault(m.group(1), [])
            continue
        m = re.match(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/$", line)
        if m and cur is not None:
            high = re.match(r"^\s*/\* 0x([0-9a-f]{16}) \*/$", lines[k + 1])
            cur.append((int(m.group(1), 16), m.group(2), int(m.group(3), 16), high and int(high.group(1), 16)))
    return got


def main():
    scripts = sys.argv[1]
    tool = os.path.join(scripts, "sass-local")
    random.seed(seed("test_sass_local"))
    failures = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NWC_CACHE=os.path.join(d, "cache"), STANDIN_SEEN=os.path.join(d, "seen"),
                   STANDIN_LISTING=os.path.join(d, "listing.txt"), TMPDIR=d)
        listing, want = make_listing(random.randint(2, 4))
        open(env["STANDIN_LISTING"], "w").write(listing)
        standins = {}
        for old, release in ((False, "12.4"), (True, "11.8")):
            path = os.path.join(d, f"nvdisasm-{release}")
            open(path, "w").write(STANDIN.format(python=sys.executable, release=release, old=old))
            os.chmod(path, stat.S_IRWXU)
            standins[release] = path
        k_cubin = os.path.join(d, "k.cubin")
        original = cubin()
        open(k_cubin, "wb").write(original)

        def sass_local(*args):
            return subprocess.run([tool, *args], capture_output=True, text=True, env=env)

        for release, nvdisasm in standins.items():
            out = os.path.join(d, f"out-{release}", "k.sass")
            open(env["STANDIN_SEEN"], "w").close()
            r = sass_local("--out", out, "--nvdisasm", nvdisasm, k_cubin)
            if r.returncode != 0:
                failures.append(f"nvdisasm {release}: status {r.returncode}: {r.stderr}")
                continue
            m = re.search(r": (\d+) functions from 1 file", r.stdout)
            if not m or int(m.group(1)) != len(want):
                failures.append(f"nvdisasm {release}: reported {m and m.group(1)} functions for {len(want)}: {r.stdout}")
            got = read_output(out)
            if set(got) != set(want):
                failures.append(f"nvdisasm {release}: functions {sorted(got)}, expected {sorted(want)}")
            for name in want:
                for g, w in zip(got.get(name, []), want[name]):
                    if g != w:
                        failures.append(f"nvdisasm {release}: {name}: {g}, expected {w}")
                        break
                if len(got.get(name, [])) != len(want[name]):
                    failures.append(f"nvdisasm {release}: {name}: {len(got.get(name, []))} instructions for {len(want[name])}")
            unknown = sum("UNKNOWN" in t for rows in want.values() for _, t, _, _ in rows)
            if unknown and f"{unknown} instructions that nvdisasm {release} does not know" not in r.stderr:
                failures.append(f"nvdisasm {release}: no warning of {unknown} unknown instructions: {r.stderr!r}")
            seen = open(env["STANDIN_SEEN"]).read().split("\n")
            if release == "12.4" and not seen[0].startswith("8 06005a04 "):
                failures.append(f"nvdisasm 12.4 got a patched cubin: {seen}")
            if release == "11.8" and not (seen[0].startswith("8 06005a04 ") and seen[1].startswith("7 005a055a ")):
                failures.append(f"nvdisasm 11.8: headers it saw {seen}, expected ABI 8 then the patched ABI 7")
            if open(k_cubin, "rb").read() != original:
                failures.append(f"nvdisasm {release}: the cubin itself was changed")
            w = run(os.path.join(scripts, "sass-waits"), out)
            n = sum(len(v) for v in want.values())
            if w.returncode != 0 or len([l for l in w.stdout.splitlines() if not l.startswith("==")]) != n:
                failures.append(f"sass-waits on nvdisasm {release}'s output: status {w.returncode}, {w.stderr}")

        # bad input
        def bad(name, data, expect):
            path = os.path.join(d, name)
            open(path, "wb").write(data)
            r = sass_local("--out", os.path.join(d, "bad", "k.sass"), "--nvdisasm", standins["12.4"], path)
            if r.returncode != 1 or expect not in r.stderr:
                failures.append(f"{name}: status {r.returncode}, {r.stderr!r} (expected 1 and {expect!r})")
        bad("text.cubin", b"not an ELF file at all, but long enough to have a header" * 2, "not an ELF file")
        bad("x86.cubin", cubin(machine=62), "not 190 (EM_CUDA)")
        bad("sm80.cubin", cubin(flags=0x06005004), "sm_90 only")
        bad("sm80-abi7.cubin", cubin(abi=7, flags=0x500550), "sm_90 only")
        bad("abi6.cubin", cubin(abi=6), "ELF ABI version 6")
        r = sass_local("--nvdisasm", standins["12.4"], os.path.join(d, "nosuch.cubin"))
        if r.returncode != 1 or "file not found" not in r.stderr:
            failures.append(f"a missing file: status {r.returncode}, {r.stderr!r}")
        r = sass_local("--nvdisasm", env["STANDIN_LISTING"], k_cubin)
        if r.returncode != 1 or "not an executable file" not in r.stderr:
            failures.append(f"an nvdisasm that is not executable: status {r.returncode}, {r.stderr!r}")
        r = sass_local("--no-such-option")
        if r.returncode != 2 or "unknown option" not in r.stderr:
            failures.append(f"an unknown option: status {r.returncode}, {r.stderr!r}")
        r = sass_local("--help")
        if r.returncode != 0 or "scripts/sass-local [--out FILE]" not in r.stdout:
            failures.append(f"--help: status {r.returncode}, {r.stdout[:200]!r}")
        if os.path.exists(env["NWC_CACHE"]):
            failures.append(f"{env['NWC_CACHE']} created though --nvdisasm was given")
    return finish("test_sass_local", failures)


if __name__ == "__main__":
    sys.exit(main())
