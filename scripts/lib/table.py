#!/usr/bin/env python3
"""table.py - print `nwc-bench codec` JSON lines (stdin) as a table: one row per tensor, then the
summary (names longer than the column keep their end, after "...")."""
import json
import sys

rows = [json.loads(line) for line in sys.stdin if line.strip()]
cols = ["rows", "cols", "ratio", "exact", "decode_gbps", "matvec_gbps", "plain_bf16_matvec_gbps"]
heads = ["rows", "cols", "ratio", "exact", "decode GB/s", "matvec GB/s", "bf16 mv GB/s"]
print(f"{'tensor':<44} " + " ".join(f"{h:>12}" for h in heads))
for r in rows:
    if "name" not in r:
        continue
    cells = []
    for c in cols:
        v = r[c]
        cells.append(f"{v:>12.3f}" if isinstance(v, float) else f"{str(v):>12}")
    name = r["name"] if len(r["name"]) <= 44 else "..." + r["name"][-41:]
    print(f"{name:<44} " + " ".join(cells))
for r in rows:
    if "summary" in r:
        print(f"\n{r['tensors']} tensors, {r['elem']} layout {r['layout']}: "
              f"{r['raw_bytes'] / 1e6:.2f} MB -> {r['nwc_bytes'] / 1e6:.2f} MB "
              f"(ratio {r['ratio']:.4f}; 11 largest matrices {r['top11_ratio']:.4f}, "
              f"entropy bound {r['top11_entropy_bound']:.4f}); every tensor bit-exact: {r['exact']}")
        print(f"one core: encode {r['encode_gbps']:.2f} GB/s, dequant {r['decode_gbps']:.2f} GB/s, "
              f"matvec {r['matvec_gbps']:.2f} GB/s vs plain BF16 matvec "
              f"{r['plain_bf16_matvec_gbps']:.2f} GB/s (GB/s of BF16 weights)")
