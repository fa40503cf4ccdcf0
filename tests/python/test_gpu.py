"""test_gpu.py - the GPU half of the package against a real nwcd with --backend cuda: GPU maps
(nwc.GpuMap through libnwc-cuda) of the sample model ($NWC_SAMPLE) and of a small model written
here whose K is not a multiple of 16 (the sample has none: x goes through the staging buffer),
both imported in layouts 0, 1 and 2, and nwc.torch on CUDA.

  - dequant and gather bit for bit against the safetensors files' BF16 values (gather from host
    and from device indices); dequant_rows of random aligned ranges likewise;
  - matvec of 1..8 columns (1-D and 2-D x, float32 and BF16 x, a bias) within 1e-5 of each
    output's sum |w||x| of a float64 reference, BF16 x with aligned columns too (read as it is
    by layouts 1 and 2, nwc_cuda_matvec_bf16x); its BF16 output and linear's within one BF16 ulp
    of the rounding of the float32 result;
  - every argument error raises NwcError EINVAL (ENOENT for an unknown name, EBADF once closed);
  - a map's lifetime (ps counts its maps; close releases them);
  - NwcLinear's dense path through a dense scratch of 16..100 rows (several chunks) against
    a float64 product (float32 accumulation noise; BF16 output within one ulp more) and, with
    one chunk, equal to F.linear on the whole dequantized weight; the scratch stays its size;
  - NwcLinear (matvec and dense paths) and NwcEmbedding captured in a torch CUDA graph replay
    equal to eager on fresh inputs;
  - test_torch's tiny transformer on cuda, patched (one GpuMap for the model): logits within
    BF16 rounding of the unpatched model (5 tokens, matvecs) and near-equal (20 tokens, dense).

Skipped (exit 77) without a CUDA torch, libnwc-cuda or the sample.  Seeds are fresh and printed.
"""
import copy
import errno
import os

import numpy as np
import pytest
import torch
from conftest import Daemon, bf16_bits, bf16_float, read_safetensors, write_safetensors

import nwc
from nwc import _cuda

if not _cuda.available():
    pytest.skip("no CUDA torch or no libnwc-cuda", allow_module_level=True)
SAMPLE = os.environ.get("NWC_SAMPLE", "")
if not SAMPLE or not os.access(SAMPLE, os.R_OK):
    pytest.skip(f"no sample model (NWC_SAMPLE={SAMPLE}): run scripts/fetch-sample",
                allow_module_level=True)

from nwc.torch import (NwcEmbedding, NwcLinear, dense_scratch_bytes, patch,  # noqa: E402
                       set_dense_scratch_bytes)
from test_torch import make_tiny  # noqa: E402

DEV = torch.device("cuda", 0)
PM, PK = 96, 700  # the padded model's matrix: K not a multiple of 16


@pytest.fixture(scope="module")
def gpu_daemon():
    d = Daemon(backend="cuda")
    yield d
    rc = d.stop()
    os.system(f"rm -rf '{d.dir}'")
    assert rc == 0, f"nwcd exited with {rc}: {d.tail()}"


@pytest.fixture(scope="module")
def client(gpu_daemon):
    with nwc.connect(gpu_daemon.sock) as c:
        yield c


@pytest.fixture(scope="module")
def refs(gpu_daemon, rng):
    """{model file: (path, BF16 bits by name)}: the sample and the padded model written here."""
    pad = {"w": bf16_bits(rng.standard_normal((PM, PK)) * 0.05),
           "w.b": bf16_bits(rng.standard_normal(PM)),
           "emb": bf16_bits(rng.standard_normal((40, 24)))}
    path = write_safetensors(os.path.join(gpu_daemon.dir, "pad.safetensors"), pad)
    return {"use": (SAMPLE, read_safetensors(SAMPLE)), "pad": (path, pad)}


@pytest.fixture(scope="module", params=[0, 1, 2])
def maps(request, client, refs):
    """Per layout: [(GpuMap of the whole model, {name: bits as [rows, cols]})] for both models."""
    out = []
    for name, (path, bits) in refs.items():
        model = f"{name}{request.param}"
        client.import_(model, path, layout=request.param, progress=False)
        m = client.map(model, device=0)
        shapes = {t.name: (t.rows, t.cols) for t in client.tensors(model)}
        assert set(m.tensors) == set(shapes) == set(bits)
        out.append((m, {n: b.reshape(shapes[n]) for n, b in bits.items()}))
    yield out
    for m, _ in out:
        m.close()


def host_bits(t):
    return t.detach().contiguous().cpu().view(torch.int16).numpy().view(np.uint16)


def bf16_ulp(r):
    """One BF16 ulp of each value of r (BF16): 2^(exponent - 7), the smallest normal's for 0."""
    e = torch.frexp(r.float().abs().clamp_min(2.0 ** -126)).exponent
    return torch.ldexp(torch.ones_like(r, dtype=torch.float32), e - 8)


def within_ulp(y, y32):
    r = y32.to(torch.bfloat16)
    return bool(((y.float() - r.float()).abs() <= bf16_ulp(r)).all())


def test_dequant_and_gather_bit_for_bit(maps, rng):
    for m, ref in maps:
        print(f"{m}: scratch {m.scratch_bytes} B, read-only {m.read_only}")
        for name, bits in ref.items():
            t = m[name]
            d = m.dequant(name)
            assert d.shape == bits.shape and d.dtype == torch.bfloat16 and d.device == DEV
            assert np.array_equal(host_bits(d), bits), name
            idx = rng.integers(0, t.rows, (3, int(rng.integers(1, 7))))
            for rows in (idx.tolist(), torch.from_numpy(idx), torch.from_numpy(idx).to(DEV)):
                g = m.gather(t, rows)
                assert g.shape == idx.shape + (t.cols,)
                assert np.array_equal(host_bits(g), bits[idx]), name


def test_dequant_rows(maps, rng):
    A = _cuda.ROW_ALIGN
    for m, ref in maps:
        for name, bits in ref.items():
            t = m[name]
            groups = -(-t.rows // A)
            g0 = int(rng.integers(0, groups))
            g1 = int(rng.integers(g0 + 1, groups + 1))
            for r0, nr in ((0, min(A, t.rows)), (g0 * A, min(g1 * A, t.rows) - g0 * A),
                           (g0 * A, t.rows - g0 * A)):
                d = m.dequant_rows(t, r0, nr)
                assert d.shape == (nr, t.cols) and d.dtype == torch.bfloat16
                assert np.array_equal(host_bits(d), bits[r0:r0 + nr]), (name, r0, nr)
            for r0, nr in ((A // 2, A), (0, t.rows + 1), (t.rows + A, 0)):
                with pytest.raises(nwc.NwcError) as e:
                    m.dequant_rows(t, r0, nr)
                assert e.value.errno == errno.EINVAL and "multiple of 16" in e.value.message


def test_dense_path_in_chunks(client, maps, rng):
    for m, ref in maps:
        name = max((n for n in ref if m[n].rows > 1), key=lambda n: m[n].rows * m[n].k16)
        t = m[name]
        w = m.dequant(t)
        w64 = w.double()
        lin = NwcLinear(client, m.model, name, gpu_map=m)
        # cuBLAS may otherwise add split-K partial sums in BF16 (more than the bound below)
        reduced = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        try:
            for R in (16, 48, 100):  # scratch of R rows: chunks of R // 16 * 16 rows
                set_dense_scratch_bytes(R * t.k16 * 2)
                for n, dt in ((9, torch.float32), (20, torch.bfloat16)):
                    x = torch.from_numpy(rng.standard_normal((2, n, t.cols))
                                         .astype(np.float32)).to(DEV, dt)
                    y = lin(x)
                    ref64 = x.double() @ w64.T
                    bound = x.double().abs() @ w64.abs().T
                    err = (y.double() - ref64).abs()
                    if dt is torch.bfloat16:
                        err = (err - bf16_ulp(ref64.to(torch.bfloat16)).double()).clamp_min(0)
                    assert y.shape == (2, n, t.rows) and y.dtype == dt
                    assert bool((err <= 1e-5 * bound + 1e-7).all()), (name, R, n, err.max())
                print(f"{name} ({t.rows} x {t.cols}, layout {t.layout}): scratch "
                      f"{dense_scratch_bytes(DEV)} B for {R} rows")
                assert dense_scratch_bytes(DEV) == max(min(R, t.rows), 16) * t.k16 * 2
                assert m.dense_bytes == 0  # no whole-tensor buffer
            set_dense_scratch_bytes(t.rows * t.k16 * 2)  # one chunk: F.linear on the whole
            x = torch.randn(20, t.cols, device=DEV, dtype=torch.bfloat16)
            assert torch.equal(lin(x), torch.nn.functional.linear(x, w))
        finally:
            set_dense_scratch_bytes()
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = reduced


def test_matvec_and_linear(maps, rng):
    for m, ref in maps:
        for name, bits in ref.items():
            t = m[name]
            if t.rows == 1:
                continue
            w64 = torch.from_numpy(bf16_float(bits)).to(DEV).double()
            bias = torch.from_numpy(rng.standard_normal(t.rows).astype(np.float32)).to(DEV)
            for n in range(1, 9):
                x = torch.from_numpy(rng.standard_normal((n, t.cols)).astype(np.float32)).to(DEV)
                y32, y16 = m.matvec(t, x, bias, out=(torch.empty(n, t.rows, device=DEV),
                                                     torch.empty(n, t.rows, device=DEV,
                                                                 dtype=torch.bfloat16)))
                ref64 = x.double() @ w64.T + bias.double()
                bound = x.double().abs() @ w64.abs().T + bias.double().abs()
                err = (y32.double() - ref64).abs()
                assert bool((err <= 1e-5 * bound + 1e-7).all()), (name, n, err.max().item())
                assert within_ulp(y16, y32), (name, n)
                assert torch.equal(m.matvec(t, x, bias), y32)  # allocated output, same call
                xb = x.to(torch.bfloat16)  # staged, converted on the stream
                yb = m.matvec(t, xb, dtype=torch.bfloat16)
                assert yb.dtype == torch.bfloat16 and within_ulp(yb, m.matvec(t, xb.float()))
                # BF16 x in columns 16-byte apart: layouts 1 and 2 read it as it is
                xd = torch.zeros(n, (t.cols + 7) // 8 * 8, device=DEV, dtype=torch.bfloat16)
                xd = xd[:, :t.cols].copy_(xb)
                yd = m.matvec(t, xd, bias)
                refb = xb.double() @ w64.T + bias.double()
                boundb = xb.double().abs() @ w64.abs().T + bias.double().abs()
                errb = (yd.double() - refb).abs()
                assert bool((errb <= 1e-5 * boundb + 1e-7).all()), (name, n, "BF16 x", errb.max().item())
            x1 = torch.randn(2 * t.cols, device=DEV)[::2]  # 1-D, strided: staged
            y1 = m.matvec(t, x1)
            assert y1.shape == (t.rows,) and torch.equal(y1, m.matvec(t, x1.contiguous()))
            yl = m.linear(t, x1, bias)
            assert yl.dtype == torch.bfloat16 and yl.shape == (t.rows,)
            assert within_ulp(yl, m.matvec(t, x1, bias))


def test_argument_errors(maps, client):
    (m, _), (p, _) = maps[1], maps[0]  # the padded model's map, the sample's
    t = m["w"]
    x = torch.randn(2, PK, device=DEV)
    y = torch.empty(2, PM, device=DEV)
    bad = [
        (lambda: m.matvec(t, x.cpu()), "on cpu"),
        (lambda: m.matvec(t, [1.0] * PK), "torch tensor"),
        (lambda: m.matvec(t, x[:, :-1]), "takes floats"),
        (lambda: m.matvec(t, x.reshape(1, 2, PK)), "takes floats"),
        (lambda: m.matvec(t, x.int()), "takes floats"),
        (lambda: m.matvec(t, torch.randn(9, PK, device=DEV)), "9 rows"),
        (lambda: m.matvec(t, torch.randn(0, PK, device=DEV)), "0 rows"),
        (lambda: m.matvec(t, x, torch.zeros(PM + 1, device=DEV)), "bias"),
        (lambda: m.matvec(t, x, torch.zeros(PM, device=DEV, dtype=torch.bfloat16)), "bias"),
        (lambda: m.matvec(t, x, torch.zeros(PM)), "bias is on cpu"),
        (lambda: m.matvec(t, x, out=torch.empty(2, PM + 1, device=DEV)), "out"),
        (lambda: m.matvec(t, x, out=torch.empty(2, PM, device=DEV, dtype=torch.half)), "out"),
        (lambda: m.matvec(t, x, out=torch.empty(PM, 2, device=DEV).T), "contiguous"),
        (lambda: m.matvec(t, x, out=(y, y)), "out[1]"),
        (lambda: m.matvec(t, x, out=(y,)), "pair"),
        (lambda: m.matvec(t, x, dtype="int8"), "dtype"),
        (lambda: m.matvec(p[next(iter(p.tensors))], x), "not one of this GPU map"),
        (lambda: m.linear(t, x), "2 rows"),
        (lambda: m.linear(t, x[0], out=torch.empty(PM, device=DEV)), "out"),
        (lambda: m.dequant(t, out=torch.empty(PM, PK, device=DEV, dtype=torch.bfloat16)),
         "out"),
        (lambda: m.gather("emb", [40]), "out of range"),
        (lambda: m.gather("emb", [-1]), "out of range"),
        (lambda: m.gather("emb", torch.tensor([1.5])), "integers"),
        (lambda: m.gather("emb", ["a"]), "integers"),
        (lambda: m.gather("emb", [1], out=torch.empty(1, 24, device=DEV)), "out"),
    ]
    for fn, text in bad:
        with pytest.raises(nwc.NwcError) as e:
            fn()
        assert e.value.errno == errno.EINVAL and text in e.value.message, (text, e.value)
    with pytest.raises(nwc.NwcError) as e:
        m.matvec("nope", x)
    assert e.value.errno == errno.ENOENT and "nope" in e.value.message
    # an index out of range on the device is not read back (no sync): its row comes out zero
    g = m.gather("emb", torch.tensor([0, 40, 1], device=DEV))
    assert bool((g[1] == 0).all()) and not bool((g[0] == 0).all())


def gpu_maps_of(client, model, tensor):
    """How many maps hold model/tensor's copy on cuda:0 (nwcctl ps)."""
    return [r.maps for r in client.ps()
            if (r.model, r.tensor, r.device) == (model, tensor, "cuda:0")]


def test_map_lifetime(client, maps):
    model = maps[1][0].model
    before = gpu_maps_of(client, model, "w")
    assert before == [1]  # the fixture's whole-model map
    with client.map(model, "w", device="cuda:0") as one:
        assert list(one) == ["w"] and len(one) == 1 and "w" in one and "emb" not in one
        assert one["w"].rows == PM and one["w"].cols == PK and one["w"].k16 == 704
        assert gpu_maps_of(client, model, "w") == [2]
        assert "cuda:0" in repr(one)
    assert gpu_maps_of(client, model, "w") == [1]
    with pytest.raises(nwc.NwcError) as e:
        one.dequant("w")
    assert e.value.errno == errno.EBADF
    one.close()  # again: a no-op
    with pytest.raises(nwc.NwcError) as e:
        client.map("absent", device=0)
    assert e.value.errno == errno.ENOENT


def capture(fn, x):
    """fn(x) captured in a torch CUDA graph after the warm-up torch asks for; (graph, output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fn(x)
    return g, y


def test_modules_in_cuda_graphs(client, maps, rng):
    model = maps[1][0].model
    lin = NwcLinear(client, model, "w", "w.b")
    emb = NwcEmbedding(client, model, "emb")
    for rows, dt in ((1, torch.bfloat16), (5, torch.float32), (3, torch.bfloat16),
                     (20, torch.bfloat16)):  # 20: the dense path
        x = torch.zeros(rows, PK, device=DEV, dtype=dt)
        lin(x)  # maps the weight: eager, before any capture
        g, y = capture(lin, x)
        for _ in range(2):
            x.copy_(torch.from_numpy(rng.standard_normal((rows, PK)).astype(np.float32)))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(y, lin(x)), (rows, dt)
    assert lin.gpu_map is not None and lin.gpu_map.device == DEV
    ids = torch.zeros(2, 3, dtype=torch.int64, device=DEV)
    emb(ids)
    g, out = capture(emb, ids)
    bits = maps[1][1]["emb"]
    for _ in range(2):
        idx = rng.integers(0, 40, (2, 3))
        ids.copy_(torch.from_numpy(idx))
        g.replay()
        torch.cuda.synchronize()
        assert np.array_equal(host_bits(out), bits[idx])


def test_patched_transformer_on_cuda(client, gpu_daemon, rng):
    tiny = make_tiny(client, gpu_daemon.dir, rng).to(DEV)
    model = copy.deepcopy(tiny)
    done = patch(model, client, "tiny")
    assert len(done) == 2 + 2 * 6 + 1 and model.blocks[0].q.gpu_map is model.tok.gpu_map
    assert all("ln" in n for n, _ in model.named_parameters())
    for T in (5, 20):
        ids = torch.from_numpy(rng.integers(0, 320, (1, T))).to(DEV)
        with torch.no_grad():
            ref, got = tiny(ids).float(), model(ids).float()
        scale = ref.abs().max().item()
        err = (got - ref).abs().max().item()
        agree = (got.argmax(-1) == ref.argmax(-1)).float().mean().item()
        print(f"cuda T={T}: |patched-bf16| {err:.4g} (scale {scale:.3g}), argmax {agree:.2f}, "
              f"equal {torch.equal(got, ref)}")
        assert err <= (2e-2 if T <= 8 else 1e-2) * scale
