"""tool_test.py - what the tests of scripts/' Python tools share (test_bench_compare,
test_sass_local, test_sass_loops, test_sass_waits, test_timeline_summary): the run's seed, running
a tool under this interpreter, and a test's end (a FAIL line a failure, the summary line, the exit
status)."""
import os
import random
import subprocess
import sys


def seed(name):
    """A fresh seed (NWC_SEED replays one), printed with how to replay it."""
    s = int(os.environ.get("NWC_SEED", random.SystemRandom().randrange(1 << 62)))
    print(f"{name}: seed {s} (replay with NWC_SEED={s})")
    return s


def run(script, *args):
    """The tool at `script` with args under this Python: its CompletedProcess, output as text."""
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True)


def finish(name, failures):
    """Prints the failures and `name: ok` or their count; returns the test's exit status."""
    for f in failures:
        print("FAIL:", f)
    print(f"{name}:", "ok" if not failures else f"{len(failures)} failures")
    return 1 if failures else 0
