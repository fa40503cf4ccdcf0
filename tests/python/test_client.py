"""test_client.py - nwc.Client and nwc.Mapping against a real nwcd (CPU backend, temporary store
and socket): every call of the package, checked against the values written into the
safetensors file (BF16 bits bit for bit, numpy fp64 matvecs), against nwcctl --json where it
shows the same thing, and every error path (NwcError's errno and the daemon's message).
"""
import errno
import gc
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import bf16_bits, bf16_float, write_safetensors

import nwc

M, K, V, D = 96, 700, 50, 64  # K not a multiple of 16: the raw plane pads rows to K16


@pytest.fixture(scope="module")
def sample(daemon, rng):
    """Weights written to m.safetensors (with an I64 tensor nwc skips), and their BF16 bits."""
    t = {"w": bf16_bits(rng.standard_normal((M, K)) * 0.02),
         "w.b": bf16_bits(rng.standard_normal(M)),
         "emb": bf16_bits(rng.standard_normal((V, D))),
         "vec": bf16_bits(rng.standard_normal(33)),
         "pos_ids": np.arange(7, dtype=np.int64)}
    path = write_safetensors(os.path.join(daemon.dir, "m.safetensors"), t)
    return path, t


def ctl(daemon, *args):
    r = subprocess.run([os.environ["NWCCTL_PATH"], "--socket", daemon.sock, *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def fp64_matvec(bits, x, bias=None):
    y = x.astype(np.float64) @ bf16_float(bits).astype(np.float64).T
    return y if bias is None else y + bf16_float(bias)


def check_close(y, ref, w_bits, x):
    """|y - ref| within fp32 accumulation error: 1e-5 of sum |w||x| per output."""
    bound = np.abs(x).astype(np.float64) @ np.abs(bf16_float(w_bits)).T.astype(np.float64)
    assert np.all(np.abs(y - ref) <= 1e-5 * bound + 1e-6), np.abs(y - ref).max()


def test_import_lists_and_info(client, daemon, sample):
    path, t = sample
    seen = []
    r = client.import_("m", path, progress=lambda done, total: seen.append((done, total)))
    assert r.tensors == 4 and r.skipped == 1
    assert r.skipped_tensors == [("pos_ids", (7,), "I64")]
    assert r.raw_bytes == sum(a.nbytes for n, a in t.items() if n != "pos_ids")
    assert seen and all(d <= tot for d, tot in seen)
    models = {m.name: m for m in client.models()}
    m = models["m"]
    assert (m.tensors, m.raw_bytes) == (4, r.raw_bytes) and m.nwc_bytes == r.bytes
    assert 0 < m.ratio and m.created > 0 and m.verified == 0
    js = {o["name"]: o for o in json.loads(ctl(daemon, "ls", "--json"))}
    assert (js["m"]["tensors"], js["m"]["raw_bytes"], js["m"]["nwc_bytes"]) == \
        (m.tensors, m.raw_bytes, m.nwc_bytes)
    ts = {x.name: x for x in client.tensors("m")}
    assert set(ts) == {"w", "w.b", "emb", "vec"}
    for name, x in ts.items():
        assert x.shape == t[name].shape and x.dtype == "BF16" and x.type == "bf16"
        auto = 2 if len(x.shape) >= 2 and x.shape[0] >= 16 else 0  # the default, layout auto
        assert x.layout == auto and x.state == "absent" and not x.pinned
    assert (ts["vec"].rows, ts["vec"].cols) == (1, 33)
    for o in json.loads(ctl(daemon, "ls", "m", "--json")):
        assert tuple(o["shape"]) == ts[o["name"]].shape
        assert (o["raw_bytes"], o["nwc_bytes"]) == (ts[o["name"]].raw_bytes,
                                                    ts[o["name"]].nwc_bytes)
    i = client.info("m", "w")
    assert (i.rows, i.cols, i.shape) == (M, K, (M, K)) and os.path.exists(i.path)
    assert i.offset % 4096 == 0 and i.length % 4096 == 0 and i.nblocks > 0
    assert i.format_version > 0 and i.conversion == "none" and i.nchunks >= 1


def test_load_ps_devices_stats_pin(client, sample):
    r = client.load("m", progress=False)
    assert r.tensors == 4
    ps = {(p.model, p.tensor): p for p in client.ps()}
    assert set(ps) == {("m", n) for n in ("w", "w.b", "emb", "vec")}
    assert all(p.device == "cpu" for p in ps.values())
    places = client.devices()
    assert places[0].name == "cpu" and places[0].budget > 0
    st = client.stats()
    total = sum(p.bytes for p in ps.values())
    assert st["resident_bytes"] == places[0].resident_bytes >= total
    assert st["backend"] == client.backend == "cpu" and st["threads"] == 2
    assert client.daemon_version.startswith("nwcd")
    client.pin("m", "w")
    assert [p.pinned for p in client.ps() if (p.model, p.tensor) == ("m", "w")] == [True]
    assert client.stats()["pinned_bytes"] == ps[("m", "w")].bytes
    with pytest.raises(nwc.NwcError) as e:
        client.evict("m", "w")
    assert e.value.errno == errno.EBUSY and "pinned" in e.value.message
    client.unpin("m", "w")
    assert client.evict("m", "w").tensors == 1
    assert all(p.tensor != "w" for p in client.ps())
    assert client.tensors("m")[0].state in ("absent", "resident")
    r = client.load("m", "w", device="cpu", progress=False)
    assert r.tensors == 1
    # pin onto a place: that replica pinned (evict refused, naming the place); none on cuda:0 here
    assert client.pin("m", "w", device="cpu").tensors == 1
    with pytest.raises(nwc.NwcError) as e:
        client.evict("m", "w")
    assert e.value.errno == errno.EBUSY and "on cpu is pinned" in e.value.message
    with pytest.raises(nwc.NwcError) as e:
        client.pin("m", "w", device="cuda:0")
    assert e.value.errno == errno.ENODEV
    client.unpin("m", "w")
    # evict one place's replica: here the only one; a place the daemon lacks refused
    with pytest.raises(nwc.NwcError) as e:
        client.evict("m", "w", device="cuda:0")
    assert e.value.errno == errno.ENODEV
    assert client.evict("m", "w", device="cpu").tensors == 1
    assert all(p.tensor != "w" for p in client.ps())
    # a list of places: one load_places, each blob read once (raw_bytes: the bytes read); a
    # place named twice counts once; nothing read for a replica already resident
    r = client.load("m", "w", device=["cpu", "cpu"], progress=False)
    assert r.tensors == 1 and r.raw_bytes == r.bytes > 0
    assert client.load("m", "w", device=("cpu",), progress=False).raw_bytes == 0
    with pytest.raises(nwc.NwcError) as e:
        client.load("m", "w", device=["cpu", "cuda:0"])
    assert e.value.errno == errno.ENODEV and "cuda:0" in e.value.message
    with pytest.raises(nwc.NwcError) as e:
        client.load("m", "w", device=[])
    assert e.value.errno == errno.EINVAL
    assert client.pin("m", "w", device=["cpu"]).tensors == 1
    assert [p.pinned for p in client.ps() if (p.model, p.tensor) == ("m", "w")] == [True]
    client.unpin("m", "w")
    # split: each tensor at one place; over host memory alone, every tensor there, each blob
    # read once; a GPU named is refused, and split without a list of places or with a tensor
    client.evict("m")
    names = sorted(t.name for t in client.tensors("m"))
    r = client.load("m", device=["cpu"], split=True, progress=False)
    assert r.tensors == len(names) and r.raw_bytes == r.bytes > 0
    rows = [p for p in client.ps() if p.model == "m"]
    assert sorted(p.tensor for p in rows) == names and {p.device for p in rows} == {"cpu"}
    with pytest.raises(nwc.NwcError) as e:
        client.load("m", device=["cuda:0", "cpu"], split=True)
    assert e.value.errno == errno.ENODEV
    for bad in ({"device": ["cpu"], "tensor": "w"}, {"device": "cpu"}, {}):
        with pytest.raises(ValueError):
            client.load("m", split=True, **bad)
    assert client.pin("m", device=["cpu"], split=True).tensors == len(names)
    assert all(p.pinned for p in client.ps() if p.model == "m")
    client.unpin("m")


def test_dequant_gather_matvec(client, sample, rng):
    _, t = sample
    assert np.array_equal(client.dequant("m", "w"), bf16_float(t["w"]))
    assert np.array_equal(client.dequant("m", "w", dtype="bfloat16"), t["w"])
    v = client.dequant("m", "vec")
    assert v.shape == (33,) and np.array_equal(v, bf16_float(t["vec"]))
    rows = rng.integers(0, V, size=(3, 5))
    g = client.gather("m", "emb", rows)
    assert g.shape == (3, 5, D) and np.array_equal(g, bf16_float(t["emb"])[rows])
    assert np.array_equal(client.gather("m", "emb", [4], dtype="bf16")[0], t["emb"][4])
    for n in (None, 1, 3, 8, 70):  # 70 columns: the library sends two requests
        x = rng.standard_normal(K if n is None else (n, K)).astype(np.float32)
        y = client.matvec("m", "w", x)
        assert y.shape == ((M,) if n is None else (n, M))
        check_close(y, fp64_matvec(t["w"], x), t["w"], x)
        yb = client.matvec("m", "w", x, bias="w.b", scale=0.5, inline=True)
        check_close(yb, 0.5 * fp64_matvec(t["w"], x) + bf16_float(t["w.b"]), t["w"], x)
    y16 = client.matvec("m", "w", x, dtype="bfloat16")
    assert y16.dtype == np.uint16
    assert np.allclose(bf16_float(y16), y, rtol=2 ** -8, atol=1e-6)
    assert client.matvec("m", "w", np.zeros((0, K), np.float32)).shape == (0, M)
    assert client.gather("m", "emb", np.zeros(0, np.int64)).shape == (0, D)


def test_torch_in_torch_out(client, sample, rng):
    torch = pytest.importorskip("torch")
    _, t = sample
    x = torch.from_numpy(rng.standard_normal((2, K)).astype(np.float32))
    y = client.matvec("m", "w", x)
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and y.shape == (2, M)
    check_close(y.numpy(), fp64_matvec(t["w"], x.numpy()), t["w"], x.numpy())
    assert isinstance(client.matvec("m", "w", x, as_torch=False), np.ndarray)
    w = client.dequant("m", "w", dtype=torch.bfloat16, as_torch=True)
    assert w.dtype == torch.bfloat16
    assert np.array_equal(w.view(torch.int16).numpy().view(np.uint16), t["w"])
    g = client.gather("m", "emb", torch.tensor([[1, 2], [3, 4]]), dtype="bfloat16")
    assert g.shape == (2, 2, D) and g.dtype == torch.bfloat16
    assert np.array_equal(g.view(torch.int16).numpy().view(np.uint16), t["emb"][[[1, 2], [3, 4]]])
    with pytest.raises(nwc.NwcError) as e:
        client.matvec("m", "w", torch.zeros(K, device="meta"))
    assert e.value.errno == errno.ENOTSUP and "meta" in e.value.message


def test_layouts_and_fp8(client, sample, rng):
    path, t = sample
    for layout in (1, 2):
        client.import_(f"m{layout}", path, layout=layout, progress=False)
        ti = {x.name: x for x in client.tensors(f"m{layout}")}
        assert ti["w"].layout == layout
        assert np.array_equal(client.dequant(f"m{layout}", "w", "bf16"), t["w"])
        x = rng.standard_normal((2, K)).astype(np.float32)
        check_close(client.matvec(f"m{layout}", "w", x), fp64_matvec(t["w"], x), t["w"], x)
    client.import_("m8", path, elem="fp8", progress=False)
    assert {x.name: x.type for x in client.tensors("m8")}["w"] == "fp8"
    with client.map("m8", "w") as mp:
        assert mp.type == "fp8" and mp.scales is not None and mp.scales.shape == (M,)
        w8 = mp.dequant() * mp.scales[:, None]  # unscaled fp8 values times the row scales
        w = bf16_float(t["w"])
        assert np.all(np.abs(w8 - w) <= np.abs(w) * 2 ** -3 + np.abs(w).max() * 2 ** -9)
        x = rng.standard_normal(K).astype(np.float32)
        ref = w8.astype(np.float64) @ x
        assert np.allclose(client.matvec("m8", "w", x), ref, rtol=1e-4, atol=1e-4)
        assert np.allclose(mp.matvec(x), ref, rtol=1e-4, atol=1e-4)


def test_map(client, sample, rng):
    path, t = sample
    client.import_("m0", path, layout=0, progress=False)
    with client.map("m0", "w") as m0:
        assert m0.layout == 0
        raw0 = m0.raw_plane  # zero-copy: the low byte of every weight, rows padded to K16
        assert raw0.shape == (M, (K + 15) // 16 * 16)
        assert np.array_equal(raw0[:, :K], (t["w"] & 0xFF).astype(np.uint8))
        assert not raw0[:, K:].any() and m0.scales is None
        del raw0
    m = client.map("m", "w")
    assert (m.rows, m.cols, m.shape, m.type, m.layout) == (M, K, (M, K), "bf16", 2)  # auto: M >= 16
    assert m.size >= m.rows * m.cols and m.fd >= 0
    assert m.blob[:4].tobytes() == b"NWCB" and not m.blob.flags.writeable
    raw = m.raw_plane  # layout 2's planes: a flat view
    assert raw.ndim == 1 and m.scales is None
    first = int(raw[0])
    assert np.array_equal(m.dequant(), bf16_float(t["w"]))
    assert np.array_equal(m.dequant("bfloat16"), t["w"])
    for _ in range(6):  # any range of rows, aligned to the row groups or not
        r0 = int(rng.integers(0, M))
        n = int(rng.integers(0, M - r0 + 1))
        assert np.array_equal(m.dequant_rows(r0, n, "bfloat16"), t["w"][r0:r0 + n])
    buf = np.empty((M - 3, K), np.float32)  # into a caller's buffer
    assert m.dequant_rows(3, M - 3, out=buf) is buf and np.array_equal(buf, bf16_float(t["w"])[3:])
    for bad in ((M, 1), (0, M + 1)):
        with pytest.raises(nwc.NwcError) as e:
            m.dequant_rows(*bad)
        assert e.value.errno == errno.EINVAL and "rows" in e.value.message
    with pytest.raises(nwc.NwcError) as e:
        m.dequant_rows(0, 2, out=np.empty((3, K), np.float32))
    assert e.value.errno == errno.EINVAL and "shape" in e.value.message
    rows = rng.integers(0, M, 9)
    assert np.array_equal(m.gather(rows), bf16_float(t["w"])[rows])
    x = rng.standard_normal((4, K)).astype(np.float32)
    b = bf16_float(t["w.b"])
    check_close(m.matvec(x, bias=b), fp64_matvec(t["w"], x, t["w.b"]), t["w"], x)
    assert [p.maps for p in client.ps() if (p.model, p.tensor) == ("m", "w")] == [1]
    with pytest.raises(nwc.NwcError) as e:
        client.evict("m", "w")
    assert e.value.errno == errno.EBUSY and "mapped" in e.value.message
    for bad, what in ((lambda: m.gather([M]), "out of range"),
                      (lambda: m.matvec(np.zeros(K + 1, np.float32)), "last dimension"),
                      (lambda: m.matvec(x, bias=np.zeros(3, np.float32)), "bias")):
        with pytest.raises(nwc.NwcError) as e:
            bad()
        assert e.value.errno == errno.EINVAL and what in e.value.message
    m.close()  # the view keeps the mapping: still mapped, still readable
    assert raw[0] == first
    assert [p.maps for p in client.ps() if (p.model, p.tensor) == ("m", "w")] == [1]
    with pytest.raises(nwc.NwcError) as e:
        m.dequant()
    assert e.value.errno == errno.EBADF
    del raw
    gc.collect()
    assert [p.maps for p in client.ps() if (p.model, p.tensor) == ("m", "w")] == [0]
    from nwc import _cuda
    if not _cuda.available():  # else test_gpu.py maps (this daemon is a CPU one)
        with pytest.raises(nwc.NwcError) as e:
            client.map("m", "w", device="cuda:0")
        assert e.value.errno == errno.ENOTSUP and "libnwc-cuda" in e.value.message
    with pytest.raises(nwc.NwcError) as e:
        client.map("m")
    assert e.value.errno == errno.EINVAL and "tensor name" in e.value.message


def test_verify_finds_damage(client, daemon, sample):
    path, _ = sample
    client.import_("v", path, progress=False)
    r = client.verify("v")
    assert r.problems == 0 and r.problem_lines == [] and r.chunks >= 4
    i = client.info("v", "w")
    with open(i.path, "r+b") as f:  # one byte of the blob's data flipped on disk
        f.seek(i.offset + i.length // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    r = client.verify("v")
    assert r.problems >= 1 and len(r.problem_lines) == r.problems
    assert any("w" in line for line in r.problem_lines)
    client.remove("v")
    assert "v" not in {m.name for m in client.models()}


def test_errors(client, daemon, sample, monkeypatch):
    path, _ = sample

    def fails(code, text, fn, *args, **kw):
        with pytest.raises(nwc.NwcError) as e:
            fn(*args, **kw)
        assert e.value.errno == code, e.value
        assert text in e.value.message and text in str(e.value)
        assert isinstance(e.value, OSError) and e.value.strerror == e.value.message
        return e.value

    e = fails(errno.ENOENT, "nope", client.tensors, "nope")
    assert e.name == "ENOENT"
    fails(errno.ENOENT, "m/zz", client.info, "m", "zz")
    fails(errno.ENOENT, "m/zz", client.dequant, "m", "zz")
    fails(errno.ENOENT, "nope", client.load, "nope", progress=False)
    fails(errno.ENOENT, "nope", client.evict, "nope")
    fails(errno.ENOENT, "nope", client.pin, "nope")
    fails(errno.ENOENT, "nope", client.unpin, "nope")
    fails(errno.ENOENT, "nope", client.remove, "nope")
    fails(errno.ENOENT, "nope", client.verify, "nope")
    fails(errno.ENOENT, "nope", client.map, "nope", "w")
    fails(errno.EINVAL, "out of range", client.gather, "m", "emb", [V])
    fails(errno.EINVAL, "out of range", client.gather, "m", "emb", [-1])
    fails(errno.EINVAL, "integers", client.gather, "m", "emb", [0.5])
    fails(errno.EINVAL, "K = 700", client.matvec, "m", "w", np.zeros(K - 1, np.float32))
    fails(errno.EINVAL, "scalar", client.matvec, "m", "w", np.float32(1))
    fails(errno.EINVAL, "bias", client.matvec, "m", "w", np.zeros(K, np.float32), bias="emb")
    fails(errno.ENOENT, "nob", client.matvec, "m", "w", np.zeros(K, np.float32), bias="nob")
    fails(errno.EINVAL, "dtype", client.dequant, "m", "w", dtype="float16")
    fails(errno.EINVAL, "elem", client.import_, "x", path, elem="int4")
    fails(errno.EINVAL, "layout", client.import_, "x", path, layout=3)
    fails(errno.EINVAL, "device", client.load, "m", device="gpu0")
    fails(errno.ENODEV, "cuda:0", client.load, "m", device="cuda:0", progress=False)
    fails(errno.EEXIST, "m", client.import_, "m", path, progress=False)
    fails(errno.ENOENT, "missing.safetensors", client.import_, "x",
          os.path.join(daemon.dir, "missing.safetensors"))
    junk = os.path.join(daemon.dir, "junk.safetensors")
    with open(junk, "wb") as f:
        f.write(b"\x10" + b"\0" * 7 + b"not json at all!")
    e = fails(errno.EBADMSG, "", client.import_, "x", junk, progress=False)
    assert e.message
    fails(errno.ENOTSUP, "pos_ids", client.import_, "x", path, strict=True, progress=False)
    assert "x" not in {m.name for m in client.models()}
    fails(errno.ECANCELED, "", client.import_, "y", path, progress=lambda d, t: True)

    class Boom(Exception):
        pass

    def boom(done, total):
        raise Boom("from the progress callback")
    with pytest.raises(Boom):
        client.load("m", progress=boom)
    fails(errno.EINVAL, "", client.set_spin, 2_000_000)
    client.set_spin(0)
    assert client.matvec("m", "w", np.ones(K, np.float32)).shape == (M,)
    client.set_spin(2000)
    with client.map("m", "w") as mp:
        fails(errno.EBUSY, "mapped", client.remove, "m")
    fails(errno.ENOENT, "nwcd", nwc.connect, os.path.join(daemon.dir, "no.sock"))
    notsock = os.path.join(daemon.dir, "file")
    open(notsock, "w").close()
    fails(errno.ECONNREFUSED, "nwcd", nwc.connect, notsock)
    c2 = nwc.connect(daemon.sock)
    c2.close()
    c2.close()
    fails(errno.EBADF, "closed", c2.models)
    with nwc.connect(daemon.sock) as c3:
        assert c3.models()
    fails(errno.EBADF, "closed", c3.ps)
    assert mp._h is None


def test_default_socket_and_library(daemon, monkeypatch):
    monkeypatch.setenv("NWC_SOCKET", daemon.sock)
    assert nwc.default_socket() == daemon.sock
    with nwc.connect() as c:
        assert c.path == daemon.sock and c.backend == "cpu"
    assert nwc.lib_path() and os.path.exists(nwc.lib_path())
    # The package from the source tree (no _paths.py) with a wrong NWC_CLIENT_LIBRARY and no
    # installed library: NwcError ENOENT naming what it tried.
    src = os.path.join(os.environ["NWC_SOURCE_DIR"], "python")
    code = ("import errno, nwc\n"
            "try:\n    nwc.connect()\nexcept nwc.NwcError as e:\n"
            "    assert e.errno == errno.ENOENT, e\n    print(e.message)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH",)}
    env.update(PYTHONPATH=src, NWC_CLIENT_LIBRARY="/nonexistent/libnwc-client.so",
               PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if "not found" not in r.stdout:  # an installed libnwc-client.so.0 answered instead
        assert r.returncode != 0 or "ENOENT" not in r.stderr, r.stderr
        pytest.skip("a libnwc-client is installed on this machine")
    assert "/nonexistent/libnwc-client.so" in r.stdout and "NWC_CLIENT_LIBRARY" in r.stdout
    # ... and the same package finds the built library through NWC_CLIENT_LIBRARY.
    env["NWC_CLIENT_LIBRARY"] = nwc.lib_path()
    env["NWC_SOCKET"] = daemon.sock
    r = subprocess.run([sys.executable, "-c", "import nwc; print(nwc.connect().backend)"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "cpu", r.stderr


def test_progress_bar_with_tqdm(client, sample, capsys):
    """progress=True: a tqdm bar on stderr where tqdm is installed (python3-tqdm, optional)."""
    pytest.importorskip("tqdm")
    path, _ = sample
    client.import_("bar", path)
    client.load("bar")
    err = capsys.readouterr().err
    assert "import bar" in err and "load bar" in err, err
    client.remove("bar")


def test_threads_share_a_client_and_a_mapping(client, daemon, sample, rng):
    """Calls on one Client take turns (the library's mutex, the GIL released); a Mapping's calls
    run at once; a Client per thread works too.  Every result against fp64."""
    import threading
    _, t = sample
    xs = [rng.standard_normal((3, K)).astype(np.float32) for _ in range(4)]
    errors = []
    mp = client.map("m", "w")

    def work(i, own):
        try:
            c = nwc.connect(daemon.sock) if own else client
            for _ in range(20):
                for y in (c.matvec("m", "w", xs[i]), mp.matvec(xs[i])):
                    check_close(y, fp64_matvec(t["w"], xs[i]), t["w"], xs[i])
            if own:
                c.close()
        except BaseException as e:  # noqa: B902 - reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work, args=(i, i % 2 == 1)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    mp.close()
    assert not errors, errors


@pytest.fixture
def registry(daemon):
    """Debian's docker-registry on a free loopback port with its own storage (skip without it)."""
    import shutil
    import socket
    import time
    import urllib.request
    if not shutil.which("docker-registry"):
        pytest.skip("docker-registry is not installed")
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    root = os.path.join(daemon.dir, f"registry-{port}")
    os.makedirs(root)
    cfg = os.path.join(root, "config.yml")
    with open(cfg, "w") as f:
        f.write(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {root}/data\n"
                f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n")
    p = subprocess.Popen(["docker-registry", "serve", cfg], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    yield f"127.0.0.1:{port}"
    p.kill()
    p.wait()


def test_push_pull(client, sample, registry, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))  # no credentials: none sent
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "absent.json"))
    if "m" not in {m.name for m in client.models()}:
        client.import_("m", sample[0], progress=False)
    ref = f"{registry}/py/m:v1"
    pushed = client.push("m", ref, plain_http=True, progress=False)
    assert pushed.digest.startswith("sha256:") and len(pushed.digest) == 71 and pushed.tensors == 4
    assert client.push("m", ref, plain_http=True, progress=False).digest == pushed.digest
    seen = []
    got = client.pull(ref, "m-pulled", plain_http=True,
                      progress=lambda done, total: seen.append((done, total)))
    assert got.digest == pushed.digest and got.skipped == 0 and got.tensors == 4
    assert seen and seen[-1][0] == seen[-1][1]
    for t in ("w", "w.b", "emb", "vec"):
        assert np.array_equal(client.dequant("m-pulled", t, "bfloat16"), client.dequant("m", t, "bfloat16")), t
    assert client.pull(ref, "m-pulled", plain_http=True, progress=False).skipped == 1
    with pytest.raises(nwc.NwcError) as e:
        client.pull(ref, "m", plain_http=True, progress=False)  # m came from an import
    assert e.value.errno == errno.EEXIST
    with pytest.raises(nwc.NwcError) as e:
        client.pull("no-registry-host/x", plain_http=True, progress=False)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(nwc.NwcError) as e:
        client.pull(ref, user="u", progress=False)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(nwc.NwcError) as e:
        client.pull(f"{registry}/py/absent:v1", "x", plain_http=True, progress=False)
    assert e.value.errno == errno.ENOENT
    client.remove("m-pulled")
