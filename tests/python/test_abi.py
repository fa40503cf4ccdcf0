"""test_abi.py - the ctypes mirrors in python/nwc/_lib.py and _cuda.py against the C
compiler's layout of client/nwc_client.h and nwc_cuda.h (abi_dump, built from the headers):
every struct's size, every field's offset and size, the flag values; and every function the
package declares is exported by the built libnwc-client (and libnwc-cuda, in CUDA builds)."""
import ctypes
import json
import os
import subprocess

import pytest

from nwc import _cuda, _lib


def test_structs_match_the_header():
    out = subprocess.run([os.environ["NWC_ABI_DUMP"]], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    structs, consts = json.loads(out[0]), json.loads(out[1])
    mine = {cls.__name__: cls for cls in _lib.STRUCTS + (_cuda.nwc_cuda_tensor,)}
    assert set(mine) == set(structs)
    for name, fields in structs.items():
        cls = mine[name]
        assert ctypes.sizeof(cls) == fields.pop("sizeof"), name
        for f, (off, size) in fields.items():
            d = getattr(cls, f)
            assert (d.offset, d.size) == (off, size), f"{name}.{f}"
    for k, v in consts.items():
        assert getattr(_lib, k) == v, k


def test_every_prototype_is_exported():
    lib = _lib.lib()
    for name in _lib._PROTOS:
        assert hasattr(lib, name), name


def test_every_cuda_prototype_is_exported():
    lib = _cuda.load()
    if lib is None:
        pytest.skip("libnwc-cuda is not built (no CUDA)")
    for name in _cuda._PROTOS:
        assert hasattr(lib, name), name
