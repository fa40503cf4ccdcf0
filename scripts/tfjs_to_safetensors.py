#!/usr/bin/env python3
"""tfjs_to_safetensors.py - convert a TensorFlow.js layers model (model.json + binary shards) to a
BF16 safetensors file.

Float32 tensors are rounded to BF16 (round to nearest even, NaN kept quiet); other dtypes are
skipped. Shapes are kept as they are ([] becomes [1]). Usage:
    tfjs_to_safetensors.py MODEL_DIR/model.json OUT.safetensors
Only the Python standard library is used, so it runs on a bare Debian 12.
"""
import array
import json
import os
import struct
import sys


def f32_to_bf16(raw: bytes) -> bytes:
    """Round little-endian float32 values to BF16 (nearest even) and return BF16 bytes."""
    words = array.array("I")
    words.frombytes(raw)
    if sys.byteorder != "little":
        words.byteswap()
    out = array.array("H", bytes(2 * len(words)))
    for i, u in enumerate(words):
        if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN: keep it quiet
            out[i] = (u >> 16) | 0x40
        else:
            out[i] = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    if sys.byteorder != "little":
        out.byteswap()
    return out.tobytes()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    model_json, out_path = sys.argv[1], sys.argv[2]
    base = os.path.dirname(model_json)
    with open(model_json, encoding="utf-8") as f:
        model = json.load(f)
    header, blobs, offset = {}, [], 0
    for group in model["weightsManifest"]:
        data = b"".join(open(os.path.join(base, p), "rb").read() for p in group["paths"])
        pos = 0
        for w in group["weights"]:
            shape = list(w["shape"])
            numel = 1
            for d in shape:
                numel *= d
            size = numel * 4  # float32 and int32 are both 4 bytes in TF.js manifests
            chunk = data[pos:pos + size]
            if len(chunk) != size:
                print(f"{w['name']}: shard data ends early", file=sys.stderr)
                return 1
            pos += size
            if w.get("dtype", "float32") != "float32":
                continue
            bf16 = f32_to_bf16(chunk)
            header[w["name"]] = {"dtype": "BF16", "shape": shape or [1],
                                 "data_offsets": [offset, offset + len(bf16)]}
            blobs.append(bf16)
            offset += len(bf16)
    header["__metadata__"] = {"source": "tfjs", "converted": "float32 to bf16, round to nearest even"}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # align the data section to 8 bytes
    tmp = out_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, out_path)
    print(f"{out_path}: {len(blobs)} tensors, {offset} bytes of BF16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
