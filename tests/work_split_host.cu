/*
 * work_split_host.cu - kernels/work.cuh's split of row groups among warps run on the CPU, for
 * test_work_split.c: make_split, Split's index arithmetic (start, warp_of, group_of by Div32,
 * contributors, part_slot, and the CTAs' sums: cta_adder, cta_part_slot) and
 * every warp's Cursor walk, batch by batch, exactly as the kernels run them (they are NWC_HD),
 * against what the split promises; then finish_parts' protocol on numbers: every row group's
 * rows come out once, as the sum of its contributors' parts, and every part slot written is read
 * (and so cleared) by the row group's last CTA.
 */
#include "work.cuh"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" int nwc_test_work_split(uint64_t groups, uint32_t S, uint32_t G, uint64_t warps, unsigned D,
                                   char *msg, size_t len);

namespace {

using namespace nwc_k;

int fail(char *msg, size_t len, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
  return -1;
}

/* A warp's piece: its entry, the part slot it would write, and whether it is a part. */
struct Piece {
  uint32_t k, slot;
  bool part;
};

template <int Dc>
int walk(const Split &sp, uint64_t groups, uint8_t *seen, uint32_t *owner, char *msg, size_t len) {
  for (uint32_t w = 0; w < sp.W; w++) {
    const uint32_t j0 = sp.start(w), j_end = sp.start(w + 1);
    if (j_end <= j0) return fail(msg, len, "warp %u has no granule (%u .. %u)", w, j0, j_end);
    for (uint32_t j = j0; j < j_end; j += (j_end - j0 + 7) / 8)
      if (sp.warp_of(j) != w) return fail(msg, len, "warp_of(%u) = %u, not %u", j, sp.warp_of(j), w);
    if (sp.warp_of(j_end - 1) != w) return fail(msg, len, "warp_of(%u) = %u, not %u", j_end - 1, sp.warp_of(j_end - 1), w);
    Cursor<Dc> c{};
    c.j = j0;
    c.open(sp, j0, j_end, nullptr, 0);
    Piece first{}, last{};
    uint32_t np = 0, k_prev = 0, s_prev = 0;
    bool any = false; /* a batch walked before this one */
    while (c.valid) {
      if (c.s == c.s0) { /* a new piece: the one before it, unless the warp's first, was a middle one */
        if (np > 1 && last.part) return fail(msg, len, "warp %u: a middle piece (entry %u) is a part", w, last.k);
        if (c.first != (np == 0)) return fail(msg, len, "warp %u piece %u: first is %d", w, np, c.first);
        if (c.s0 % sp.G) return fail(msg, len, "warp %u: piece starts at slot %u, not a granule", w, c.s0);
        last = Piece{c.k, sp.part_slot(w, c.k), !c.whole(sp)};
        if (np++ == 0) first = last;
      }
      const uint32_t e = c.end();
      if (e <= c.s || e > c.s_end || e - c.s > (uint32_t)Dc || (e - 1) / 16 != c.s / 16)
        return fail(msg, len, "warp %u: batch %u .. %u of piece %u .. %u", w, c.s, e, c.s0, c.s_end);
      if (any && (c.k < k_prev || (c.k == k_prev && c.s <= s_prev)))
        return fail(msg, len, "warp %u walks backwards", w);
      for (uint32_t s = c.s; s < e; s++) {
        uint8_t *v = seen + (uint64_t)c.k * sp.S + s;
        if (*v) return fail(msg, len, "entry %u slot %u streamed twice (warp %u)", c.k, s, w);
        *v = 1;
      }
      any = true, k_prev = c.k, s_prev = c.s;
      c.next(sp, j0, j_end, nullptr, 0);
    }
    const Piece *ends[2] = {&first, np > 1 ? &last : nullptr};
    for (int i = 0; i < 2; i++) {
      const Piece *pc = ends[i];
      if (!pc || !pc->part) continue;
      if (pc->slot != 2 * w + (uint32_t)i) return fail(msg, len, "warp %u: part_slot %u for its %s piece", w, pc->slot,
                                                     i ? "last" : "first");
      if (owner[pc->slot] != UINT32_MAX) return fail(msg, len, "warp %u: two parts in slot %u", w, pc->slot);
      owner[pc->slot] = pc->k;
    }
  }
  for (uint64_t i = 0; i < groups * sp.S; i++)
    if (!seen[i]) return fail(msg, len, "entry %llu slot %llu never streamed", (unsigned long long)(i / sp.S),
                              (unsigned long long)(i % sp.S));
  /* every entry's parts: exactly the warps contributors() names, in the slots the last one reads */
  for (uint32_t k = 0; k < groups; k++) {
    uint32_t wf, wl;
    sp.contributors(k, &wf, &wl);
    uint32_t n = 0;
    for (uint32_t s = 2 * wf; s <= 2 * wl + 1; s++) n += owner[s] == k;
    if (wf == wl) {
      if (n) return fail(msg, len, "entry %u: one warp (%u) but %u parts", k, wf, n);
      continue;
    }
    if (n != wl - wf + 1) return fail(msg, len, "entry %u: %u parts from warps %u .. %u", k, n, wf, wl);
    if (owner[sp.part_slot(wf, k)] != k) return fail(msg, len, "entry %u: first part not in slot %u", k, sp.part_slot(wf, k));
    for (uint32_t v = wf + 1; v <= wl; v++)
      if (owner[2 * v] != k) return fail(msg, len, "entry %u: warp %u's part not in slot %u", k, v, 2 * v);
  }
  return 0;
}

/* A warp's part of entry k, as a number whose sums are exact (mod 2^64). */
uint64_t value(uint32_t w, uint32_t k) { return (uint64_t)(w + 1) * UINT64_C(0x9e3779b97f4a7c15) ^ ((uint64_t)k << 20); }

/* finish_parts (work.cuh) for CTAs of wpc warps, on the parts `owner` holds (slot 2 w + i: entry
 * of warp w's first (i = 0) or last piece, or UINT32_MAX): each CTA's first contributor of an
 * entry adds the CTA's parts of it, writes the rows, or the CTA's part slot where it is not the
 * entry's last CTA; the last CTA adds the other CTAs' parts from their slots, clearing them, to
 * its own.  Every part must be added once, every entry with parts written once, with the sum of
 * all its contributors' parts, and every part slot written must be read and cleared (scratch is
 * zero after every call). */
int cta_sums(const Split &sp, uint64_t groups, const uint32_t *owner, uint32_t wpc, char *msg, size_t len) {
  const uint32_t nctas = (sp.W + wpc - 1) / wpc;
  uint64_t *cta_part = static_cast<uint64_t *>(calloc(2 * (size_t)nctas, sizeof(uint64_t)));
  uint32_t *cta_k = static_cast<uint32_t *>(malloc(2 * (size_t)nctas * sizeof(uint32_t)));
  uint64_t *rows = static_cast<uint64_t *>(calloc(groups, sizeof(uint64_t)));
  uint64_t *own = static_cast<uint64_t *>(calloc(groups, sizeof(uint64_t))); /* the last CTA's part */
  uint8_t *written = static_cast<uint8_t *>(calloc(groups, 1)), *used = static_cast<uint8_t *>(calloc(2 * (size_t)sp.W, 1));
  int rc = 0;
  if (!cta_part || !cta_k || !rows || !own || !written || !used) rc = fail(msg, len, "out of memory");
  if (!rc) memset(cta_k, 0xff, 2 * (size_t)nctas * sizeof(uint32_t));
  for (uint32_t w = 0; !rc && w < sp.W; w++) {
    const uint32_t c = w / wpc, w_last = (wpc * c + wpc < sp.W ? wpc * c + wpc : sp.W) - 1;
    for (uint32_t i = 0; !rc && i < 2; i++) {
      const uint32_t k = owner[2 * w + i];
      if (k == UINT32_MAX) continue;
      uint32_t wf, wl;
      sp.contributors(k, &wf, &wl);
      if (w != cta_adder(wpc, w, wf)) continue;
      uint64_t sum = 0;
      for (uint32_t u = w; !rc && u <= (wl < w_last ? wl : w_last); u++) {
        const uint32_t at = 2 * u + (sp.part_slot(u, k) & 1u);
        if (owner[at] != k) rc = fail(msg, len, "wpc %u: warp %u adds warp %u's part of entry %u from slot %u (entry %d)", wpc,
                                      w, u, k, at, (int)owner[at]);
        else if (used[at]++) rc = fail(msg, len, "wpc %u: warp %u's part of entry %u added twice", wpc, u, k);
        sum += value(u, k);
      }
      if (rc) break;
      if (wf >= wpc * c && wl <= w_last) {
        if (written[k]++) rc = fail(msg, len, "wpc %u: entry %u written twice (CTA %u)", wpc, k, c);
        rows[k] = sum;
      } else if (c == wl / wpc) {
        own[k] = sum;
      } else {
        const uint32_t slot = sp.cta_part_slot(wpc, c, k);
        if (slot >= 2 * nctas || cta_k[slot] != UINT32_MAX) rc = fail(msg, len, "wpc %u: CTA %u's part slot %u of entry %u taken", wpc, c, slot, k);
        else cta_k[slot] = k, cta_part[slot] = sum;
      }
    }
  }
  for (uint32_t i = 0; !rc && i < 2 * sp.W; i++)
    if (owner[i] != UINT32_MAX && !used[i]) rc = fail(msg, len, "wpc %u: warp %u's part of entry %u never added", wpc, i / 2, owner[i]);
  for (uint32_t k = 0; !rc && k < groups; k++) {
    uint32_t wf, wl;
    sp.contributors(k, &wf, &wl);
    const uint32_t cf = wf / wpc, cl = wl / wpc;
    if (cf != cl) { /* the last CTA's sums */
      uint64_t sum = 0;
      for (uint32_t x = cf; !rc && x < cl; x++) {
        const uint32_t slot = x == cf ? sp.cta_part_slot(wpc, cf, k) : 2 * x;
        if (cta_k[slot] != k) rc = fail(msg, len, "wpc %u: entry %u: CTA %u's part not in slot %u", wpc, k, x, slot);
        sum += cta_part[slot];
        cta_k[slot] = UINT32_MAX - 1; /* read and cleared */
      }
      sum += own[k];
      if (!rc && written[k]++) rc = fail(msg, len, "wpc %u: entry %u written by a CTA and by the last CTA", wpc, k);
      rows[k] = sum;
    }
    if (rc) break;
    uint64_t want = 0;
    for (uint32_t u = wf; u <= wl; u++) want += value(u, k);
    if (wf == wl && written[k]) rc = fail(msg, len, "wpc %u: entry %u is one warp's whole piece but was summed", wpc, k);
    else if (wf != wl && (!written[k] || rows[k] != want))
      rc = fail(msg, len, "wpc %u: entry %u (warps %u .. %u, CTAs %u .. %u) %s", wpc, k, wf, wl, cf, cl,
                written[k] ? "has the wrong sum" : "never written");
  }
  for (uint32_t i = 0; !rc && i < 2 * nctas; i++)
    if (cta_k[i] != UINT32_MAX && cta_k[i] != UINT32_MAX - 1)
      rc = fail(msg, len, "wpc %u: CTA %u's part slot %u (entry %u) written but never read", wpc, i / 2, i, cta_k[i]);
  free(cta_part), free(cta_k), free(rows), free(own), free(written), free(used);
  return rc;
}

} /* namespace */

/* 0 when the split of `groups` row groups of S slots in granules of G among at most `warps` warps,
 * walked in batches of D (2 or 4), keeps every promise of work.cuh; else -1 and what broke in msg. */
extern "C" int nwc_test_work_split(uint64_t groups, uint32_t S, uint32_t G, uint64_t warps, unsigned D,
                                   char *msg, size_t len) {
  Split sp;
  int rc = make_split(groups, S, G, warps, 0, &sp);
  if (rc < 0) return fail(msg, len, "make_split: %d", rc);
  if (sp.W > sp.Ng || sp.W > warps || sp.start(0) != 0 || sp.start(sp.W) != sp.Ng)
    return fail(msg, len, "W %u, Ng %u, start(W) %u", sp.W, sp.Ng, sp.start(sp.W));
  for (uint32_t j = 0; j < sp.Ng; j += 1 + sp.Ng / 4096)
    if (sp.group_of(j) != j / sp.Gr) return fail(msg, len, "group_of(%u) = %u, Gr %u", j, sp.group_of(j), sp.Gr);
  uint8_t *seen = static_cast<uint8_t *>(calloc(groups * S, 1));
  uint32_t *owner = static_cast<uint32_t *>(malloc(2 * (size_t)sp.W * sizeof *owner));
  if (!seen || !owner) {
    free(seen), free(owner);
    return fail(msg, len, "out of memory");
  }
  memset(owner, 0xff, 2 * (size_t)sp.W * sizeof *owner);
  rc = D == 2 ? walk<2>(sp, groups, seen, owner, msg, len) : walk<4>(sp, groups, seen, owner, msg, len);
  static const uint32_t wpcs[] = {8, 1, 3}; /* the kernels' CTAs of 8 warps; 1: a CTA per warp */
  for (size_t i = 0; !rc && i < sizeof wpcs / sizeof wpcs[0]; i++) rc = cta_sums(sp, groups, owner, wpcs[i], msg, len);
  free(seen), free(owner);
  return rc;
}
