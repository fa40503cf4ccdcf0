#!/usr/bin/env python3
"""decode_layouts.py - an independent decoder of layouts 1 and 2, written from
docs/format-layouts.md (and docs/format.md for the record and the prefix code) without looking at
store/, in plain Python: it parses every l1_* / l2_* golden record (NAME.nwct), decodes it the way
the documents say and compares the result with NAME.out.  Exit 0 when all agree, 1 otherwise.

Usage: decode_layouts.py [GOLDEN_DIR]   (default: the directory of this script)
"""
import os
import struct
import sys


def u64(b, o):
    return struct.unpack_from("<Q", b, o)[0]


def parse_record(rec):
    assert rec[:4] == b"NWCT", "magic"
    elem, flags = rec[6], rec[7]
    M, K = u64(rec, 8), u64(rec, 16)
    psym = rec[24:40]
    NB, data_bytes, raw_bytes = u64(rec, 40), u64(rec, 48), u64(rec, 56)
    o = 72
    bases = list(struct.unpack_from("<%dQ" % (NB + 1), rec, o))
    o += 8 * (NB + 1)
    hdr = rec[o:o + 32 * NB]
    o += 32 * NB
    data = rec[o:o + data_bytes]
    o += data_bytes
    raw = rec[o:o + raw_bytes]
    return dict(elem=elem, M=M, K=K, psym=psym, NB=NB, bases=bases, hdr=hdr, data=data, raw=raw)


def fp8_bf16(b):
    """BF16 pattern of an fp8 e4m3fn byte (exact)."""
    s, e, m = b >> 7, (b >> 3) & 15, b & 7
    if e == 0 and m == 0:
        return s << 15
    if e == 0:  # m * 2^-9: normalise
        E, mant = 118, m
        while mant < 8:
            mant <<= 1
            E -= 1
        E += 3  # m = 1 -> 2^-9 = 2^(118-127)
        return s << 15 | E << 7 | (mant & 7) << 4
    return s << 15 | (e + 120) << 7 | m << 4


def geometry(M, K):
    K16 = (K + 15) // 16 * 16
    RB, CB = (M + 15) // 16, (K + 511) // 512
    nl = (K16 - 512 * (CB - 1)) // 16
    last = (nl + 1) // 2
    S = 16 * (CB - 1) + last
    return K16, RB, CB, S, last


def frag(L, j):
    r, q = L >> 2, L & 3
    return r + 8 * ((j >> 1) & 1), 8 * q + 4 * (j >> 3) + 2 * ((j >> 2) & 1) + (j & 1)


def bits_of(data, start_byte, nwords):
    """The bits of nwords little-endian 32-bit words, MSB first, as a string of 0/1."""
    out = []
    for w in range(nwords):
        v = struct.unpack_from("<I", data, start_byte + 4 * w)[0]
        out.append(format(v, "032b"))
    return "".join(out)


def decode_layout1(t):
    M, K, psym, fp8 = t["M"], t["K"], t["psym"], t["elem"] & 15 == 1
    K16, RB, CB, S, last = geometry(M, K)
    out = {}
    E = 8 if fp8 else 16
    for b in range(t["NB"]):
        g, cb = divmod(b, CB)
        nsc = 16 if cb < CB - 1 else last
        off = t["bases"][b]
        for L in range(32):
            n = t["hdr"][32 * b + L]
            s = bits_of(t["data"], off, n)
            off += 4 * n
            pos = 0
            for sc in range(nsc):
                slot = 16 * cb + sc
                lane_raw = t["raw"][((g * S + slot) * 32 + L) * E:][:E]
                for j in range(16):
                    z = 0
                    while s[pos + z] == "0":
                        z += 1
                    if not fp8 and z == 15:
                        h = int(s[pos + 16:pos + 24], 2)
                        pos += 24
                    else:
                        assert z < (10 if fp8 else 15), "bad code"
                        h = int(s[pos + z + 1]) << 7 | psym[z]
                        pos += z + 2
                    if fp8:
                        byte = lane_raw[(j & 3) + 4 * (j >> 3)]
                        lo = ((byte >> 4) if j & 4 else (byte & 15)) << 4
                    else:
                        lo = lane_raw[j]
                    tr, tc = frag(L, j)
                    out[(16 * g + tr, 32 * slot + tc)] = h << 8 | lo
            assert pos <= 32 * n, "lane overrun"
    return out


def decode_layout2(t):
    M, K, u, fp8 = t["M"], t["K"], t["psym"], t["elem"] & 15 == 1
    K16, RB, CB, S, last = geometry(M, K)
    P = (S + 1) // 2
    nib_bytes = RB * S * 256
    raw = t["raw"]
    out = {}
    for g in range(RB):
        for slot in range(S):
            for L in range(32):
                ls = (g * S + slot) * 32 + L
                if fp8:
                    pair = nib_bytes + (g * P + slot // 2) * 3 * 128
                    words = [struct.unpack_from("<I", raw, pair + (w * 32 + L) * 4)[0] for w in range(3)]
                    big = words[0] | words[1] << 32 | words[2] << 64
                for j in range(16):
                    nib = (raw[ls * 8 + (j >> 1)] >> (4 * (j & 1))) & 15
                    r = nib & 7
                    hi = u[r] | (nib & 8) << 4
                    if fp8:
                        m = (big >> (3 * (16 * (slot & 1) + j))) & 7
                        lo = m << 4 | u[8 + r]
                    else:
                        lo = raw[nib_bytes + ls * 16 + j]
                    tr, tc = frag(L, j)
                    out[(16 * g + tr, 32 * slot + tc)] = hi << 8 | lo
    eb = 2 if fp8 else 3
    for b in range(t["NB"]):
        g, cb = divmod(b, CB)
        off = t["bases"][b]
        for L in range(32):
            for _ in range(t["hdr"][32 * b + L]):
                e = t["data"][off:off + eb]
                off += eb
                idx = e[0]
                v = fp8_bf16(e[1]) if fp8 else e[1] | e[2] << 8
                tr, tc = frag(L, idx & 15)
                key = (16 * g + tr, 32 * (16 * cb + (idx >> 4)) + tc)
                assert out[key] & 0x7fff == 0, "an exception whose planes are not zero"
                out[key] = v
    return out


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    bad = n = 0
    with open(os.path.join(d, "golden.txt")) as f:
        for line in f:
            p = line.split()
            if not p or p[0].startswith("#") or len(p) < 5 or p[4] not in ("1", "2"):
                continue
            name, M, K = p[0], int(p[2]), int(p[3])
            t = parse_record(open(os.path.join(d, name + ".nwct"), "rb").read())
            assert (t["M"], t["K"], t["elem"] >> 4) == (M, K, int(p[4])), name
            got = decode_layout1(t) if p[4] == "1" else decode_layout2(t)
            want = open(os.path.join(d, name + ".out"), "rb").read()
            K16 = (K + 15) // 16 * 16
            diff = 0
            for r in range(M):
                for c in range(K16):
                    w = struct.unpack_from("<H", want, 2 * (r * K16 + c))[0]
                    if got.get((r, c)) != w:
                        if diff == 0:
                            print("%s: (%d, %d) decodes to %s, expected 0x%04x" % (name, r, c, got.get((r, c)), w))
                        diff += 1
            print("%-24s %s" % (name, "ok" if diff == 0 else "%d differences" % diff))
            bad += diff != 0
            n += 1
    print("decode_layouts: %d cases, %d failed" % (n, bad))
    return 1 if bad or n == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
