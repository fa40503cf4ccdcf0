#!/usr/bin/python3
"""run_pytest.py TEST_FILE [MODULE...] - runs one pytest file of the Python package's tests
under ctest: exit 0 pass, 1 fail, 77 skip when a module it needs (pytest, numpy, and the ones
named) is missing, or when every test of the file skipped itself (no GPU, no sample, ...).
Debian's /usr/bin/python3 runs it (scripts/lib/common.sh installs python3-numpy, python3-torch
and python3-pytest); -p no:cacheprovider keeps the source tree clean.
"""
import importlib
import sys

missing = []
for m in ["pytest", "numpy"] + sys.argv[2:]:
    try:
        importlib.import_module(m)
    except ImportError:
        missing.append(m)
if missing:
    print(f"{sys.argv[1]}: skipped, {sys.executable} lacks {', '.join(missing)}")
    sys.exit(77)
import pytest  # noqa: E402


class Outcomes:
    """Counts the tests that ran and the tests (or modules) that skipped."""

    def __init__(self):
        self.ran = self.skipped = 0

    def pytest_runtest_logreport(self, report):
        if report.skipped:
            self.skipped += 1
        elif report.when == "call":
            self.ran += 1

    def pytest_collectreport(self, report):
        self.skipped += bool(report.skipped)


seen = Outcomes()
rc = pytest.main(["-q", "-s", "-p", "no:cacheprovider", "-rs", sys.argv[1]], plugins=[seen])
if rc in (0, 5) and seen.ran == 0 and seen.skipped:
    sys.exit(77)
sys.exit(0 if rc == 0 else 1)
