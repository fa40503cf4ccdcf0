#!/usr/bin/python3
"""nwc_torch_accuracy.py - how far nwc.torch's logits are from exact, on the CPU (JSON lines).

    bench/nwc_torch_accuracy.py BUILD_DIR [--widths small|qwen3-4b] [--layers N] [--layout 0|2]
                                [--tokens T] [--seed S]

nwc_torch_bench.py measures the patched model against the BF16 model on a GPU; this asks what
that difference means, on the CPU where there is no GPU.  A Qwen3-style model written here in
plain torch (Debian's torch has no transformers): token embedding, per layer RMSNorm, attention
with 128-wide heads, grouped key/value heads, per-head RMSNorm of q and k, rotary positions, an
output projection, RMSNorm, a SwiGLU MLP; a final RMSNorm and an lm head tied to the embedding.
Numerics as transformers' Qwen3 in BF16: norms and softmax in float32, everything else in the
model's dtype.  Random weights as transformers initializes them (normal, std 0.02; norms 1),
rounded to BF16, saved as safetensors, imported with nwcctl into a throwaway nwcd (CPU backend)
in --layout and patched with nwc.torch.patch(mapped=True): host maps, the C library's CPU
matvec for 1..8 rows (float32 accumulation, one rounding to BF16), dequant and F.linear above.

The same weights run as four models: float64 (the reference: "exact"), BF16 (torch's own CPU
kernels), BF16 with exact linears (every nn.Linear's product in float64, rounded to BF16 once:
what a perfect float32-accumulating kernel would give) and nwc.  Teacher-forced logits of T
random tokens (default 64), both ways the GPU bench runs them: "prefill" (one forward of T rows)
and "steps" (token by token with a cache: the matvec path).  Each line compares two of them with
nwc_torch_bench's measure: max |got - ref| / max |ref| ("of the logits' scale"), the same in
RMS, and the share of positions whose argmax agrees.  A line "linear" says, for the first
layer's up_proj and 8 random BF16 rows, which share of the BF16 outputs of nwc's matvec and of
torch's F.linear differ from the correctly rounded product.  --widths qwen3-4b uses the bench's widths
(hidden 2560, MLP 9728, 32/8 heads, vocabulary 151936; about 8 GB of memory for 4 layers);
small (default) hidden 1024, MLP 3072, 8/4 heads, vocabulary 32768.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time
from types import SimpleNamespace

from nwc_torch_bench import compare, stepwise
from nwcd_process import nwcd, write_bf16_safetensors

WIDTHS = {"small": dict(V=32768, D=1024, F=3072, Hq=8, Hkv=4, hd=128),
          "qwen3-4b": dict(V=151936, D=2560, F=9728, Hq=32, Hkv=8, hd=128)}


def emit(what: str, **kw) -> None:
    print(json.dumps({"bench": "nwc_torch_accuracy", "what": what, **kw}), flush=True)


def build_model(torch, V, D, F, Hq, Hkv, hd, layers, eps=1e-6, theta=1e6):
    """The Qwen3-style model (parameter names as transformers' Qwen3ForCausalLM), float32."""
    nn = torch.nn

    def compute(x):  # norms and softmax: float32 for narrower dtypes, else x's own
        return x.float() if x.element_size() < 4 else x

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            h = compute(x)
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * h.to(x.dtype)

    def rope(x, pos):
        inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = pos.to(torch.float64)[:, None] * inv[None, :]
        ang = torch.cat((ang, ang), -1)
        cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat((-x2, x1), -1) * sin

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(D, Hq * hd, bias=False)
            self.k_proj = nn.Linear(D, Hkv * hd, bias=False)
            self.v_proj = nn.Linear(D, Hkv * hd, bias=False)
            self.o_proj = nn.Linear(Hq * hd, D, bias=False)
            self.q_norm, self.k_norm = RMSNorm(hd), RMSNorm(hd)

        def forward(self, x, pos, cache):
            B, T, _ = x.shape
            q = rope(self.q_norm(self.q_proj(x).view(B, T, Hq, hd)).transpose(1, 2), pos)
            k = rope(self.k_norm(self.k_proj(x).view(B, T, Hkv, hd)).transpose(1, 2), pos)
            v = self.v_proj(x).view(B, T, Hkv, hd).transpose(1, 2)
            if cache is not None:
                if cache:
                    k, v = torch.cat((cache[0], k), 2), torch.cat((cache[1], v), 2)
                cache[:] = [k, v]
            k, v = (t.repeat_interleave(Hq // Hkv, 1) for t in (k, v))
            a = (q @ k.transpose(-1, -2)) * hd ** -0.5
            S = k.shape[2]
            mask = torch.ones(T, S, dtype=torch.bool).triu(S - T + 1)
            a = a.masked_fill(mask, float("-inf"))
            a = torch.softmax(compute(a), -1).to(q.dtype)
            return self.o_proj((a @ v).transpose(1, 2).reshape(B, T, Hq * hd))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(D, F, bias=False)
            self.up_proj = nn.Linear(D, F, bias=False)
            self.down_proj = nn.Linear(F, D, bias=False)

        def forward(self, x):
            return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.post_attention_layernorm = RMSNorm(D), RMSNorm(D)
            self.self_attn, self.mlp = Attention(), MLP()

        def forward(self, x, pos, cache):
            x = x + self.self_attn(self.input_layernorm(x), pos, cache)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(V, D)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.norm = RMSNorm(D)

    class Qwen3Like(nn.Module):
        """model(ids [1, T], past_key_values=None, use_cache=False): .logits [1, T, V] and
        .past_key_values (a list of [k, v] per layer), as transformers' models answer."""

        def __init__(self):
            super().__init__()
            self.model = Body()
            self.lm_head = nn.Linear(D, V, bias=False)
            self.lm_head.weight = self.model.embed_tokens.weight

        def forward(self, ids, past_key_values=None, use_cache=False):
            past = past_key_values or ([[] for _ in self.model.layers] if use_cache else None)
            start = past[0][0].shape[2] if past and past[0] else 0
            pos = torch.arange(start, start + ids.shape[1])
            x = self.model.embed_tokens(ids)
            for i, layer in enumerate(self.model.layers):
                x = layer(x, pos, past[i] if past else None)
            return SimpleNamespace(logits=self.lm_head(self.model.norm(x)), past_key_values=past)

    model = Qwen3Like()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02)
    return model.eval()


def exact_linears(torch, model):
    """model with every nn.Linear's product computed in float64 and rounded to the model's dtype
    once (the result of an exactly-summing kernel)."""
    def forward(self, x):
        return torch.nn.functional.linear(x.double(), self.weight.double()).to(x.dtype)
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            m.forward = forward.__get__(m)
    return model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build")
    ap.add_argument("--widths", choices=sorted(WIDTHS), default="small")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--layout", type=int, choices=(0, 2), default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=None, help="default: fresh, printed")
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    sys.path.insert(0, os.path.join(build, "python"))
    import torch
    import nwc
    from nwc.torch import patch
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    w = WIDTHS[a.widths]
    bf16 = build_model(torch, layers=a.layers, **w).to(torch.bfloat16)
    ids = torch.randint(0, w["V"], (1, a.tokens))
    emit("setup", seed=seed, widths=a.widths, layers=a.layers, layout=a.layout,
         tokens=a.tokens, torch=torch.__version__, **w,
         params=sum(p.numel() for p in bf16.parameters()))
    with nwcd(build, "cpu", threads=2) as (sock, folder), torch.no_grad():
        path = write_bf16_safetensors(os.path.join(folder, "m.safetensors"), {
            k: v.view(torch.int16).numpy() for k, v in bf16.state_dict().items()
            if k != "lm_head.weight"})
        t0 = time.perf_counter()
        r = subprocess.run([os.path.join(build, "client", "nwcctl"), "--socket", sock, "import",
                            "m", path, "--layout", str(a.layout)], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"nwc_torch_accuracy: nwcctl import failed: {r.stderr.strip()}")
        emit("import", seconds=round(time.perf_counter() - t0, 2))
        c = nwc.connect(sock)
        patched = copy.deepcopy(bf16)
        patch(patched, c, "m", mapped=True)
        t0 = time.perf_counter()
        logits = {"fp64": copy.deepcopy(bf16).double()(ids).logits}
        exact = exact_linears(torch, copy.deepcopy(bf16))
        for name, m in (("bf16", bf16), ("bf16_exact_linear", exact), ("nwc", patched)):
            logits[f"{name}_prefill"] = m(ids).logits.double()
            logits[f"{name}_steps"] = stepwise(torch, m, ids).double()
        emit("forwards", seconds=round(time.perf_counter() - t0, 2))
        up, x = bf16.model.layers[0].mlp.up_proj, torch.randn(8, w["D"]).to(torch.bfloat16)
        rounded = (x.double() @ up.weight.double().T).float().to(torch.bfloat16)
        emit("linear", rows=8, shape=list(up.weight.shape), **{
            f"{k}_not_exact": round((y != rounded).float().mean().item(), 6) for k, y in
            (("nwc", patched.model.layers[0].mlp.up_proj(x)), ("torch", up(x)))})
        for got, ref in (("bf16_prefill", "fp64"), ("bf16_steps", "fp64"),
                         ("bf16_exact_linear_prefill", "fp64"), ("bf16_exact_linear_steps", "fp64"),
                         ("nwc_prefill", "fp64"), ("nwc_steps", "fp64"),
                         ("nwc_steps", "bf16_steps"), ("nwc_prefill", "bf16_prefill"),
                         ("bf16_steps", "bf16_prefill"), ("nwc_steps", "bf16_exact_linear_steps"),
                         ("bf16_steps", "bf16_exact_linear_steps")):
            emit("logits", got=got, ref=ref, **compare(torch, logits[got], logits[ref]))
        c.close()


if __name__ == "__main__":
    main()
