#!/usr/bin/python3
"""run_pytest.py TEST_FILE [MODULE...] - runs one pytest file of the Python package's tests
under ctest: exit 0 pass, 1 fail, 77 skip when a module it needs (pytest, numpy, and the ones
named) is missing.  Debian's /usr/bin/python3 runs it (scripts/lib/common.sh installs
python3-numpy, python3-torch and python3-pytest); -p no:cacheprovider keeps the source tree clean.
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

sys.exit(0 if pytest.main(["-q", "-s", "-p", "no:cacheprovider", "-rs", sys.argv[1]]) == 0 else 1)
