"""test_torch.py - nwc.torch against a real nwcd (CPU backend): NwcLinear and NwcEmbedding
beside nn.Linear / nn.Embedding on the same BF16 weights, and a small transformer built here with
torch alone (token and position embeddings, two blocks of causal attention and MLP with
nn.Linear, an lm head tied to the token embedding as transformers saves it), written as
safetensors with the standard library, imported, patched: its logits against the unpatched BF16
model's and a float64 reference, on the matvec path (5 tokens) and the dense path (20 tokens,
bit for bit); the errors of patch (a parameter with no tensor, a shape that differs) and of the
modules.
"""
import copy
import errno
import math
import os

import numpy as np
import pytest
import torch
from conftest import write_safetensors
from torch import nn
from torch.nn import functional as F

import nwc
from nwc.torch import NwcEmbedding, NwcLinear, patch

V, D, H, FF, TMAX = 320, 128, 4, 352, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.q, self.k, self.v = nn.Linear(D, D), nn.Linear(D, D, bias=False), nn.Linear(D, D)
        self.o = nn.Linear(D, D)
        self.up, self.down = nn.Linear(D, FF), nn.Linear(FF, D)

    def forward(self, x):
        B, T, _ = x.shape
        h = self.ln1(x)
        q, k, v = (m(h).view(B, T, H, D // H).transpose(1, 2) for m in (self.q, self.k, self.v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(D // H)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
        x = x + self.o(y)
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Embedding(TMAX, D)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, V, bias=False)
        self.lm_head.weight = self.tok.weight  # tied: saved once, as tok.weight

    def forward(self, ids):
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for b in self.blocks:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def bits(t):
    return t.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def save(model, path, drop=()):
    """The model's state as BF16 safetensors, the tied lm_head once (as transformers does)."""
    sd = {k: bits(v.to(torch.bfloat16)) for k, v in model.state_dict().items()
          if k != "lm_head.weight" and k not in drop}
    return write_safetensors(path, sd)


def make_tiny(client, folder, rng):
    """A Tiny of random BF16 weights (norms near 1), saved into folder and imported as "tiny"."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    model = Tiny()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.normal_(0.0, 0.05).add_(1.0 if p.abs().mean() > 0.5 else 0.0)
    model = model.to(torch.bfloat16).eval()
    client.import_("tiny", save(model, os.path.join(folder, "tiny.safetensors")),
                   progress=False)
    return model


@pytest.fixture(scope="module")
def tiny(client, daemon, rng):
    return make_tiny(client, daemon.dir, rng)


def logits(model, ids):
    with torch.no_grad():
        return model(ids).float()


def test_linear_and_embedding_modules(client, tiny, rng):
    lin = tiny.blocks[0].up
    nl = NwcLinear(client, "tiny", "blocks.0.up.weight", "blocks.0.up.bias")
    assert (nl.in_features, nl.out_features) == (D, FF) and "nwc=tiny/" in repr(nl)
    w64, b64 = lin.weight.double(), lin.bias.double()
    for n in (1, 2, 5, 8, 9, 33):
        x = torch.from_numpy(rng.standard_normal((n, D)).astype(np.float32))
        y = nl(x)
        assert y.dtype == torch.float32 and y.shape == (n, FF)
        ref = x.double() @ w64.T + b64
        bound = x.double().abs() @ w64.abs().T
        err = (y.double() - ref).abs()
        if n <= 8:  # the daemon's matvec in fp32
            assert torch.all(err <= 1e-5 * bound + 1e-6), err.max()
        else:  # dense path: F.linear in float32 on the BF16 weight
            assert torch.allclose(y, F.linear(x, lin.weight.float(), lin.bias.float()),
                                  rtol=1e-5, atol=1e-5)
        xb = x.to(torch.bfloat16)
        yb = nl(xb)
        assert yb.dtype == torch.bfloat16
        assert torch.allclose(yb.float(), lin(xb).float(), rtol=2 ** -6, atol=2e-2)
        if n > 8:
            assert torch.equal(yb, lin(xb))
    x3 = torch.randn(2, 3, D)
    assert nl(x3).shape == (2, 3, FF)
    assert torch.allclose(nl(x3), nl(x3.reshape(6, D)).reshape(2, 3, FF))
    nm = NwcLinear(client, "tiny", "blocks.0.up.weight", "blocks.0.up.bias", mapped=True)
    x = torch.randn(4, D)
    assert torch.allclose(nm(x), nl(x), rtol=1e-6, atol=1e-6)
    # the dense path: the CPU's one scratch, of the weight's size under the set size; with a
    # scratch of 16 rows the weight comes in FF / 16 chunks, each product in its columns
    assert nl.mapping is None and nl.host_map() is not None
    assert nwc.torch.dense_scratch_bytes("cpu") == FF * D * 2
    x = torch.from_numpy(rng.standard_normal((12, D)).astype(np.float32))
    whole = nl(x)
    nwc.torch.set_dense_scratch_bytes(16 * D * 2)
    try:
        chunked = nl(x)
        assert nwc.torch.dense_scratch_bytes("cpu") == 16 * D * 2
        assert torch.allclose(chunked, whole, rtol=1e-6, atol=1e-6)
        assert torch.allclose(chunked, F.linear(x, lin.weight.float(), lin.bias.float()),
                              rtol=1e-5, atol=1e-5)
    finally:
        nwc.torch.set_dense_scratch_bytes()
    emb = NwcEmbedding(client, "tiny", "tok.weight")
    ids = torch.from_numpy(rng.integers(0, V, (3, 7)))
    assert torch.equal(emb(ids), tiny.tok(ids))
    assert torch.equal(NwcEmbedding(client, "tiny", "tok.weight", torch.float32)(ids),
                       tiny.tok(ids).float())
    for bad, code, text in ((lambda: nl(torch.randn(2, D + 1)), errno.EINVAL, "last dimension"),
                            (lambda: emb(torch.tensor([V])), errno.EINVAL, "out of range"),
                            (lambda: nl(torch.randn(2, D, device="meta")), errno.ENOTSUP,
                             "GPU"),
                            (lambda: NwcLinear(client, "tiny", "nope"), errno.ENOENT, "nope"),
                            (lambda: NwcLinear(client, "tiny", "ln_f.weight"), errno.EINVAL,
                             "matrix"),
                            (lambda: NwcLinear(client, "tiny", "blocks.0.up.weight",
                                               "blocks.0.q.bias"), errno.EINVAL, "bias")):
        with pytest.raises(nwc.NwcError) as e:
            bad()
        assert e.value.errno == code and text in e.value.message, e.value


def test_patched_transformer_matches(client, tiny, rng):
    ids = {T: torch.from_numpy(rng.integers(0, V, (1, T))) for T in (5, 20)}
    ref = {T: logits(tiny, x) for T, x in ids.items()}
    f64 = copy.deepcopy(tiny).double()
    ref64 = {T: logits(f64, x).double() for T, x in ids.items()}
    for mapped in (False, True):
        model = copy.deepcopy(tiny)
        done = patch(model, client, "tiny", mapped=mapped)
        assert done["lm_head"] == "tok.weight" and done["blocks.1.down"] == "blocks.1.down.weight"
        assert len(done) == 2 + 2 * 6 + 1
        left = {n for n, _ in model.named_parameters()}
        assert all("ln" in n for n in left), left  # only the LayerNorms keep parameters
        assert isinstance(model.lm_head, NwcLinear) and isinstance(model.tok, NwcEmbedding)
        for T, x in ids.items():
            before = client.stats()["requests"]
            got = logits(model, x)
            calls = client.stats()["requests"] - before - 1  # less the stats call itself
            q = model.blocks[0].q
            mapped_now = q.mapping is not None or q._dense_map is not None
            # 5 tokens: 2 gathers and one matvec per Linear (13), in the daemon or in-process,
            # no host map made; 20 tokens: the dense path, decoding from host maps (made now
            # where the modules had none)
            if T <= 8:
                assert (calls, mapped_now) == (2 + (0 if mapped else 13), mapped)
            else:
                assert mapped_now and calls > 2
            scale = ref[T].abs().max().item()
            err = (got - ref[T]).abs().max().item()
            err64 = (got.double() - ref64[T]).abs().max().item()
            bf64 = (ref[T].double() - ref64[T]).abs().max().item()
            agree = (got.argmax(-1) == ref[T].argmax(-1)).float().mean().item()
            print(f"T={T} mapped={mapped}: |patched-bf16| {err:.4g} (scale {scale:.3g}), "
                  f"|patched-fp64| {err64:.4g}, |bf16-fp64| {bf64:.4g}, argmax {agree:.2f}")
            if T > 8:  # the dense path is F.linear on the very same BF16 weights
                assert torch.equal(got, ref[T])
            else:  # matvecs accumulate in fp32: BF16 rounding apart from the BF16 model
                assert err <= 2e-2 * scale
                assert err64 <= max(2 * bf64, 1e-2 * scale)


def test_patch_errors_change_nothing(client, daemon, tiny):
    path = save(tiny, os.path.join(daemon.dir, "cut.safetensors"),
                drop=("blocks.1.up.weight", "blocks.0.v.bias"))
    client.import_("cut", path, progress=False)
    model = copy.deepcopy(tiny)
    with pytest.raises(nwc.NwcError) as e:
        patch(model, client, "cut")
    assert e.value.errno == errno.ENOENT
    assert "blocks.1.up.weight" in e.value.message and "blocks.0.v.bias" in e.value.message
    assert "2 parameter(s)" in e.value.message
    assert isinstance(model.blocks[1].up, nn.Linear) and model.blocks[1].up.weight is not None
    with pytest.raises(nwc.NwcError) as e:
        patch(model, client, "cut", prefix="model.")
    assert e.value.errno == errno.ENOENT and "model.tok.weight" in e.value.message
    wide = copy.deepcopy(tiny)
    wide.blocks[0].up = nn.Linear(D, FF + 16).to(torch.bfloat16)
    with pytest.raises(nwc.NwcError) as e:
        patch(wide, client, "tiny")
    assert e.value.errno == errno.EINVAL and "blocks.0.up.weight" in e.value.message
    assert "blocks.0.up.bias" in e.value.message and isinstance(wide.tok, nn.Embedding)
    with pytest.raises(nwc.NwcError) as e:
        patch(model, client, "absent")
    assert e.value.errno == errno.ENOENT and "absent" in e.value.message
