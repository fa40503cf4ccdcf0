#!/usr/bin/python3
"""nwc_torch_bench.py - nwc.torch on a GPU against the same model in BF16 (JSON lines).

    bench/nwc_torch_bench.py BUILD_DIR [--layers N] [--layout 0|1|2] [--tokens T] [--prompt P]
                             [--new G] [--device N] [--seed S]

A Qwen3-style model made by transformers from a config with Qwen3-4B's widths (hidden 2560, MLP
9728, 32 query and 8 key/value heads of 128, vocabulary 151936, tied embeddings) and --layers
layers (default 4), random weights in BF16 on cuda:N, saved with save_pretrained (safetensors),
imported with nwcctl into a throwaway nwcd (--backend cuda) in --layout, and patched with
nwc.torch.patch (one GPU map of the whole model).  Lines, each {"bench": "nwc_torch", "what": ..}:

  setup    the seed, shapes, the import's time and sizes;
  memory   device bytes of the weights: the BF16 model's parameters against the patched model's
           (the parameters left, the norms; nwcd's shared copies; the map's scratch and staging;
           nwc.torch's dense scratch, made by the first input of more than 8 rows: the chunk
           of rows the prefill path dequantizes at a time);
  logits   teacher-forced logits of T random tokens (default 64), patched against BF16: once as
           one forward of T rows ("prefill": the dense path, F.linear on the dequantized BF16
           weights) and once token by token with a cache ("steps": the fused matvecs);
           max |patched - bf16| / max |bf16|, the same in RMS, and argmax agreement; "fp32":
           the same measures of both models against a float32 copy of the weights (one
           forward, TF32 off), the exact reference that tells the kernels' error from BF16's
           own rounding noise; and a line "bf16_steps_vs_prefill": the BF16 model against
           itself, the noise floor of these measures (docs/python.md, "Accuracy");
  decode   greedy decoding of G tokens (default 64) after a P-token prompt (default 16) per
           model: tokens/s, and "mode": "static_cache+cuda_graph" where transformers' static
           cache lets one decode step be captured in a torch CUDA graph (the step then replays
           with the token and position in device memory, nothing read back), else
           "static_cache+eager" or "dynamic_cache+eager", with the reason; whether the graph's
           tokens equal eager decoding's, and the agreement of the two models' tokens.

Needs PyTorch with CUDA, transformers with Qwen3 (written against PyTorch 2.11 and transformers
5.17), a build tree configured with -DNWC_WITH_CUDA=ON, and a GPU with room for the model
five times in BF16 (twice, and a float32 copy for the reference).  Run with the python that has them (Debian's /usr/bin/python3 has no CUDA torch).
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import time

from nwcd_process import nwcd

WIDTHS = dict(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
              num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              max_position_embeddings=40960, rms_norm_eps=1e-6, tie_word_embeddings=True)


def die(msg: str) -> None:
    print(f"nwc_torch_bench: {msg}", file=sys.stderr)
    sys.exit(2)


def emit(what: str, **kw) -> None:
    print(json.dumps({"bench": "nwc_torch", "what": what, **kw}), flush=True)


def args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[2:]))
    ap.add_argument("build", help="the build tree (with daemon/nwcd, client/nwcctl, python/nwc)")
    ap.add_argument("--layers", type=int, default=4, help="decoder layers (default 4)")
    ap.add_argument("--layout", type=int, choices=(0, 1, 2), default=0, help="nwc layout")
    ap.add_argument("--tokens", type=int, default=64, help="teacher-forced tokens (64)")
    ap.add_argument("--prompt", type=int, default=16, help="prompt tokens for decoding (16)")
    ap.add_argument("--new", type=int, default=64, help="tokens decoded greedily (64)")
    ap.add_argument("--device", type=int, default=0, help="CUDA device, torch's and nwcd's (0)")
    ap.add_argument("--seed", type=int, default=None, help="default: fresh, printed")
    a = ap.parse_args()
    if a.layers < 1 or a.tokens < 2 or a.prompt < 1 or a.new < 3:
        die("--layers and --prompt must be >= 1, --tokens >= 2, --new >= 3")
    return a


def imports(build: str):
    """torch, the transformers classes and nwc, or a clear exit saying what is missing."""
    for f in ("daemon/nwcd", "client/nwcctl", "python/nwc/__init__.py"):
        if not os.path.exists(os.path.join(build, f)):
            die(f"{build} is not a built tree: no {f}")
    sys.path.insert(0, os.path.join(build, "python"))
    try:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM
    except ImportError as e:
        die(f"needs torch and transformers with Qwen3 ({e})")
    if not torch.cuda.is_available():
        die(f"torch {torch.__version__} has no CUDA device")
    import nwc
    from nwc import _cuda
    if not _cuda.available():
        die("libnwc-cuda is not in the build tree (configure with -DNWC_WITH_CUDA=ON)")
    return torch, Qwen3Config, Qwen3ForCausalLM, nwc


def make_model(torch, Qwen3Config, Qwen3ForCausalLM, layers: int, dev):
    """A Qwen3-4B-wide model of `layers` layers, random BF16 weights made on dev."""
    cfg = Qwen3Config(num_hidden_layers=layers, **WIDTHS)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with dev:
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    return cfg, model.to(dev, torch.bfloat16).eval()


def saved(model, folder: str) -> str:
    """save_pretrained into folder; the safetensors file (or the shards' index) to import."""
    model.save_pretrained(folder)
    for name in ("model.safetensors", "model.safetensors.index.json"):
        if os.path.exists(os.path.join(folder, name)):
            return os.path.join(folder, name)
    die(f"save_pretrained wrote no safetensors into {folder}: {sorted(os.listdir(folder))}")


def compare(torch, got, ref) -> dict:
    """Errors of got against ref (float logits of one shape) relative to ref's scale."""
    d = (got - ref).float()
    return {"max_rel": round(d.abs().max().item() / ref.abs().max().item(), 6),
            "rms_rel": round(d.norm().item() / ref.norm().item(), 6),
            "argmax_agree": round((got.argmax(-1) == ref.argmax(-1)).float().mean().item(), 4)}


def stepwise(torch, model, ids):
    """Teacher-forced logits of ids [1, T], one token a forward, with transformers' cache."""
    out, past = [], None
    for t in range(ids.shape[1]):
        r = model(ids[:, t:t + 1], past_key_values=past, use_cache=True)
        past = r.past_key_values
        out.append(r.logits[:, -1].float())
    return torch.stack(out, 1)


def static_cache(cfg, length: int, dev, torch):
    """transformers' StaticCache of length positions (its signature differs across versions)."""
    from transformers import StaticCache
    for kw in (dict(config=cfg, max_cache_len=length),
               dict(config=cfg, max_batch_size=1, max_cache_len=length, device=dev,
                    dtype=torch.bfloat16)):
        try:
            return StaticCache(**kw)
        except TypeError:
            continue
    raise RuntimeError("this transformers' StaticCache takes neither known signature")


def decode(torch, model, cfg, prompt, new: int, how: str):
    """Greedy decoding of new tokens after prompt [1, P]; how: "graph", "static" (eager) or
    "dynamic" (eager, DynamicCache).  Returns (tokens [new] on the host, steps timed, seconds).
    The first token comes from the prompt's forward, the second from a warm-up step (which
    the graph's capture needs); the remaining new - 2 steps are timed."""
    dev, P = prompt.device, prompt.shape[1]
    cache = static_cache(cfg, P + new, dev, torch) if how != "dynamic" else None
    toks = torch.empty(new, dtype=torch.long, device=dev)
    state = {"past": cache}
    r = model(prompt, past_key_values=cache, use_cache=True,
              cache_position=torch.arange(P, device=dev))
    state["past"] = r.past_key_values
    ids = r.logits[:, -1:].argmax(-1)
    pos = torch.tensor([P], device=dev)

    def step():
        out = model(ids, past_key_values=state["past"], use_cache=True, cache_position=pos)
        if how == "dynamic":
            state["past"] = out.past_key_values
        ids.copy_(out.logits[:, -1:].argmax(-1))
        pos.add_(1)

    toks[0:1].copy_(ids.view(1))
    run = step
    if how == "graph":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        run = graph.replay
    else:
        step()
    toks[1:2].copy_(ids.view(1))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(2, new):
        run()
        toks[i:i + 1].copy_(ids.view(1))
    torch.cuda.synchronize()
    return toks.cpu(), new - 2, time.perf_counter() - t0


def bench_decode(torch, name: str, model, cfg, prompt, new: int) -> list:
    """One decode line for model, the fastest mode that works; returns its tokens."""
    why = ""
    eager = None
    for how, mode in (("graph", "static_cache+cuda_graph"), ("static", "static_cache+eager"),
                      ("dynamic", "dynamic_cache+eager")):
        try:
            toks, steps, secs = decode(torch, model, cfg, prompt, new, how)
        except Exception as e:  # noqa: BLE001 - reported, the next mode is tried
            why += f"{mode}: {type(e).__name__}: {str(e)[:300]}; "
            torch.cuda.synchronize()
            continue
        if how == "graph":
            eager = decode(torch, model, cfg, prompt, new, "static")[0]
        emit("decode", model=name, mode=mode, tokens=new, timed_steps=steps,
             tokens_per_s=round(steps / secs, 2), ms_per_token=round(1e3 * secs / steps, 4),
             graph_equals_eager=None if eager is None else bool(torch.equal(toks, eager)),
             fallback_reason=why or None)
        return toks.tolist()
    raise RuntimeError(f"{name}: no decoding mode worked: {why}")


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def main() -> None:
    a = args()
    build = os.path.abspath(a.build)
    torch, Qwen3Config, Qwen3ForCausalLM, nwc = imports(build)
    from nwc.torch import dense_scratch_bytes, patch
    seed = a.seed if a.seed is not None else int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 reference is float32
    with nwcd(build, "cuda", threads=8) as (sock, folder), torch.no_grad():
        cfg, model = make_model(torch, Qwen3Config, Qwen3ForCausalLM, a.layers, dev)
        path = saved(model, os.path.join(folder, "hf"))
        t0 = time.perf_counter()
        r = subprocess.run([os.path.join(build, "client", "nwcctl"), "--socket", sock, "import",
                            "qwen", path, "--layout", str(a.layout)], capture_output=True,
                           text=True)
        if r.returncode:
            die(f"nwcctl import failed: {r.stderr.strip()}")
        import_s = time.perf_counter() - t0
        c = nwc.connect(sock)
        m = {x.name: x for x in c.models()}["qwen"]
        emit("setup", seed=seed, layers=a.layers, layout=a.layout, device=str(dev),
             torch=torch.__version__, transformers=__import__("transformers").__version__,
             params=sum(p.numel() for p in model.parameters()), raw_bytes=m.raw_bytes,
             nwc_bytes=m.nwc_bytes, ratio=round(m.ratio, 4), import_s=round(import_s, 2))

        patched = copy.deepcopy(model)
        patch(patched, c, "qwen")
        gmap = patched.model.embed_tokens.gpu_map
        ids = torch.randint(0, cfg.vocab_size, (1, a.tokens), device=dev)
        logits = {"prefill": (patched(ids).logits.float(), model(ids).logits.float()),
                  "steps": (stepwise(torch, patched, ids), stepwise(torch, model, ids))}
        exact = copy.deepcopy(model).float()(ids).logits.float()
        for kind, (got, ref) in logits.items():
            emit("logits", path=kind, tokens=a.tokens, **compare(torch, got, ref),
                 fp32={"nwc": compare(torch, got, exact), "bf16": compare(torch, ref, exact)})
        emit("logits", path="bf16_steps_vs_prefill", tokens=a.tokens,
             **compare(torch, logits["steps"][1], logits["prefill"][1]))
        del logits, exact
        torch.cuda.empty_cache()
        gpu = [p for p in c.devices() if p.name == f"cuda:{a.device}"]
        emit("memory", bf16_param_bytes=param_bytes(model),
             patched_param_bytes=param_bytes(patched),
             nwc_copy_bytes=sum(t.bytes for t in gmap.tensors.values()),
             map_scratch_bytes=gmap.scratch_bytes,
             map_staging_bytes=gmap.staging_bytes, dense_scratch_bytes=dense_scratch_bytes(dev),
             nwcd_device_resident_bytes=gpu[0].resident_bytes if gpu else None,
             read_only=gmap.read_only)

        prompt = torch.randint(0, cfg.vocab_size, (1, a.prompt), device=dev)
        ref = bench_decode(torch, "bf16", model, cfg, prompt, a.new)
        got = bench_decode(torch, "nwc", patched, cfg, prompt, a.new)
        same = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), len(ref))
        emit("decode_agreement", tokens=a.new, equal_prefix=same,
             agree=round(sum(x == y for x, y in zip(got, ref)) / len(ref), 4))
        del patched, gmap
        c.close()


if __name__ == "__main__":
    main()
