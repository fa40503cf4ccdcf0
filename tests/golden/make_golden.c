/*
 * make_golden.c - writes the golden files that freeze the format, layouts 0, 1 and 2, valid and
 * invalid (tests/golden/README.md).
 *
 * For each case of the table below it writes, into the directory given as argv[1]:
 *   NAME.in    the input: BF16 (uint16 little-endian) or fp8 bytes, row-major, rows x cols
 *   NAME.nwct  the tensor record nwc_record_write() gives for it (fp8q: after nwc_quantize_fp8,
 *              with the per-row scales)
 *   NAME.out   what nwc_dequant must return: rows x K16 BF16 little-endian, derived from the input
 *              and not from the decoder (BF16: the input, padding columns psym[0] << 8; fp8: the
 *              exact fp8 values computed with ldexp)
 * and golden.txt, one line "NAME TYPE ROWS COLS" per case (TYPE bf16, fp8 or fp8q), followed by
 * the block layout when it is not 0 (layouts 1 and 2, docs/format-layouts.md; their padding
 * columns hold psym[0] << 8 | psym[8] for layout 2).
 *
 * Then the invalid cases (bad_cases below) and invalid.txt, one line per case:
 *   NAME STAGE ERROR TYPE ROWS COLS LAYOUT WHY...
 * STAGE encode: NAME.in (as above) must fail to encode (fp8q: to quantize) with ERROR; STAGE
 * read: NAME.nwct must fail nwc_record_read with ERROR; STAGE decode: NAME.nwct reads, and
 * nwc_dequant and nwc_matvec fail with ERROR.  TYPE .. LAYOUT name the valid tensor a record was
 * made from; WHY says what is wrong.  Records are made by patching a valid record and sealing it
 * again with a correct checksum (all but bad_checksum), so each has one fault.
 *
 * Inputs come from a fixed seed and integer arithmetic only (no libm), so they are the same on
 * every machine.  Run it only to change the format on purpose; test_codec_golden checks the files.
 */
#include "codec_util.h"

#include <errno.h>
#include <xxhash.h>

typedef struct golden_case {
  const char *name, *type;
  uint64_t rows, cols;
  int gen; /* how the input is made, see make_input() */
  unsigned layout;
} golden_case;

enum { G_TYPICAL, G_ESCAPES, G_EQUAL, G_FP8_ALL, G_FP8_TYPICAL, G_EXC255, G_EXC256, G_FP8_ONE,
       G_FP8_NAN, G_BF16_INF };

static const golden_case cases[] = {
    {"bf16_1x1", "bf16", 1, 1, G_TYPICAL, 0},
    {"bf16_9x513", "bf16", 9, 513, G_TYPICAL, 0},
    {"bf16_16x1040", "bf16", 16, 1040, G_TYPICAL, 0},
    {"bf16_escapes_24x100", "bf16", 24, 100, G_ESCAPES, 0},
    {"bf16_equal_5x37", "bf16", 5, 37, G_EQUAL, 0},
    {"bf16_k5_11x5", "bf16", 11, 5, G_TYPICAL, 0},
    {"fp8_all_3x300", "fp8", 3, 300, G_FP8_ALL, 0},
    {"fp8_9x513", "fp8", 9, 513, G_FP8_TYPICAL, 0},
    {"fp8_k13_7x13", "fp8", 7, 13, G_FP8_TYPICAL, 0},
    {"fp8q_10x40", "fp8q", 10, 40, G_TYPICAL, 0},
    /* layouts 1 and 2 (issue 3): appended, so the inputs above stay as they are */
    {"l1_bf16_1x1", "bf16", 1, 1, G_TYPICAL, 1},
    {"l1_bf16_17x1040", "bf16", 17, 1040, G_TYPICAL, 1},
    {"l1_bf16_escapes_24x100", "bf16", 24, 100, G_ESCAPES, 1},
    {"l1_fp8_all_3x300", "fp8", 3, 300, G_FP8_ALL, 1},
    {"l1_fp8_9x513", "fp8", 9, 513, G_FP8_TYPICAL, 1},
    {"l1_fp8q_10x40", "fp8q", 10, 40, G_TYPICAL, 1},
    {"l2_bf16_1x1", "bf16", 1, 1, G_TYPICAL, 2},
    {"l2_bf16_17x1040", "bf16", 17, 1040, G_TYPICAL, 2},
    {"l2_bf16_escapes_24x100", "bf16", 24, 100, G_ESCAPES, 2},
    {"l2_bf16_equal_5x37", "bf16", 5, 37, G_EQUAL, 2},
    {"l2_fp8_all_3x300", "fp8", 3, 300, G_FP8_ALL, 2},
    {"l2_fp8_9x513", "fp8", 9, 513, G_FP8_TYPICAL, 2},
    {"l2_fp8q_10x40", "fp8q", 10, 40, G_TYPICAL, 2},
    /* issue 19: appended likewise; layout 1 all-equal and K < 16, a lane of 255 exceptions */
    {"l1_bf16_equal_5x37", "bf16", 5, 37, G_EQUAL, 1},
    {"l1_bf16_k5_11x5", "bf16", 11, 5, G_TYPICAL, 1},
    {"l1_fp8_k13_7x13", "fp8", 7, 13, G_FP8_TYPICAL, 1},
    {"l2_bf16_k5_11x5", "bf16", 11, 5, G_TYPICAL, 2},
    {"l2_bf16_exc255_16x512", "bf16", 16, 512, G_EXC255, 2},
};

/* Leading zeros of a random 32-bit number: 0 with probability 1/2, 1 with 1/4, ... */
static unsigned geometric(void) {
  uint32_t v = (uint32_t)test_rand();
  unsigned z = 0;
  while (z < 31 && !(v & (UINT32_C(1) << (31 - z)))) z++;
  return z;
}

/* A weight-like BF16: random sign and mantissa, exponent 122 minus a geometric count. */
static uint16_t typical_bf16(void) {
  unsigned e = 122 - geometric();
  return (uint16_t)((test_below(2) << 15) | (e << 7) | test_below(128));
}

static void make_input(const golden_case *c, void *in) {
  uint64_t n = c->rows * c->cols;
  uint16_t *w = in;
  uint8_t *q = in;
  unsigned g;
  for (uint64_t i = 0; i < n; i++) {
    switch (c->gen) {
    case G_TYPICAL: w[i] = typical_bf16(); break;
    case G_ESCAPES: /* 60 exponents (45 escaped), with zeros, subnormals, infinities and NaNs */
      w[i] = (uint16_t)((test_below(2) << 15) | ((60 + test_below(60)) << 7) | test_below(128));
      if (i % 17 == 3) w[i] = (uint16_t)(test_rand() & 0x807f);
      if (i % 29 == 5) w[i] = (uint16_t)(0x7f80 | (test_below(2) << 15) | (i % 3 ? test_below(128) : 0));
      break;
    case G_EQUAL: w[i] = 0xbe40; break;
    case G_FP8_ALL: /* every non-NaN byte once, then random ones */
      q[i] = (uint8_t)(i < 254 ? i + (i >= 127) : test_rand());
      if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1;
      break;
    case G_EXC255: /* 16 x 512: seven symbols, and eight rare ones at lane 0's positions */
    case G_EXC256: { /* lane 0 (rows 0 and 8, columns 32s + 0..7; G_EXC255: all but (0, 0)) */
      uint64_t r = i / c->cols, col = i % c->cols;
      int lane0 = (r == 0 || r == 8) && col % 32 < 8 && (c->gen == G_EXC256 || i > 0);
      unsigned sym = lane0 ? 40 + (unsigned)(col / 32 % 8) : 56 + (unsigned)(i % 7);
      w[i] = (uint16_t)((test_below(2) << 15) | (sym << 8) | test_below(256));
      break;
    }
    case G_FP8_ONE: q[i] = 0x38; break; /* 1.0 */
    case G_FP8_NAN: q[i] = i == 5 ? 0x7f : i == 9 ? 0xff : 0x38; break;
    case G_BF16_INF: w[i] = i == 3 ? 0x7f80 : 0x3f80; break;
    default: /* sign, 4-bit exponent 7 - geometric (clamped at 0), 3-bit mantissa */
      g = geometric();
      q[i] = (uint8_t)((test_below(2) << 7) | ((g < 7 ? 7 - g : 0) << 3) | test_below(8));
      if ((q[i] & 0x7f) == 0x7f) q[i] ^= 1;
    }
  }
}

static int write_file(const char *dir, const char *name, const char *ext, const void *p, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s%s", dir, name, ext);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, n, f) != n || fclose(f)) {
    fprintf(stderr, "make_golden: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

static int make_case(const char *dir, const golden_case *c, FILE *manifest) {
  uint64_t M = c->rows, K = c->cols, n = M * K, K16 = cu_k16(K);
  int fp8_in = !strcmp(c->type, "fp8"), quant = !strcmp(c->type, "fp8q");
  void *in = cu_malloc(n * 2);
  make_input(c, in);
  uint8_t *q = fp8_in ? in : cu_malloc(n);
  float *scale = quant ? cu_malloc(M * sizeof *scale) : NULL;
  int rc = quant ? nwc_quantize_fp8(in, M, K, q, scale) : 0;
  unsigned type = fp8_in || quant ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  nwc_tensor t;
  if (rc == 0) rc = nwc_tensor_encode(type == NWC_ELEM_FP8 ? (void *)q : in, M, K,
                                      NWC_ELEM(type, c->layout), scale, &t);
  uint8_t *rec = NULL;
  size_t len = 0;
  if (rc == 0) rc = nwc_record_write(&t, &rec, &len);
  if (rc < 0) {
    fprintf(stderr, "make_golden: %s: %s (%s)\n", c->name, nwc_strerror(rc), nwc_error_detail());
    return -1;
  }
  uint16_t *out = cu_expected(type == NWC_ELEM_FP8 ? (void *)q : in, M, K, type, t.psym[0]);
  for (uint64_t i = 0; c->layout == 2 && i < M * K16; i++) /* layout 2's filler: psym[8] too */
    if (i % K16 >= K) out[i] |= t.psym[8];
  rc = write_file(dir, c->name, ".in", in, fp8_in ? n : n * 2);
  if (rc == 0) rc = write_file(dir, c->name, ".nwct", rec, len);
  if (rc == 0) rc = write_file(dir, c->name, ".out", out, M * K16 * 2);
  if (c->layout)
    fprintf(manifest, "%s %s %llu %llu %u\n", c->name, c->type, (unsigned long long)M,
            (unsigned long long)K, c->layout);
  else
    fprintf(manifest, "%s %s %llu %llu\n", c->name, c->type, (unsigned long long)M,
            (unsigned long long)K);
  printf("%-22s %-4s %3llu x %-5llu record %zu bytes\n", c->name, c->type, (unsigned long long)M,
         (unsigned long long)K, len);
  free(out);
  free(rec);
  nwc_tensor_release(&t);
  if (!fp8_in) free(q);
  free(scale);
  free(in);
  return rc;
}

/* ---- invalid cases (invalid.txt) ------------------------------------------------------------ */

enum {
  F_NONE, /* stage encode: the input itself */
  F_MAGIC, F_VERSION, F_FLAGS, F_LENGTH, F_CHECKSUM, F_TYPE, F_LAYOUT, F_COLS0, F_PSYM_REPEAT,
  F_PSYM15, F_FP8_PSYM, F_HDR_INACTIVE, F_HDR_SHORT, F_BASES0, F_BASES_CHAIN, F_DATA_BYTES, F_SCALE,
  F_L1_HDR, F_L2_LUT7, F_L2_LUT_REPEAT, F_L2_LUT_EXP, F_L2_EXC_ORDER, F_L2_EXC_OUTSIDE,
  F_L2_EXC_NSC, F_L2_EXC_RANK, F_L2_EXC_NAN,
  F_LANE0 /* lane 0 of block 0 (a one-block tensor) gets the stream prefix + fillers + suffix */
};

typedef struct bad_case {
  const char *name, *stage, *err; /* err: errno name (cu_errno_value) */
  golden_case base;               /* stage encode: the input; else the valid tensor patched */
  int fault;
  const char *prefix;             /* F_LANE0: lane 0's codes as '0'/'1' characters: prefix, */
  unsigned fillers;               /* this many fillers "10", */
  const char *suffix;             /* then suffix */
  const char *why;
} bad_case;

#define BF16_1x1 {"", "bf16", 1, 1, G_TYPICAL, 0}
#define BF16_1x16 {"", "bf16", 1, 16, G_EQUAL, 0}
#define FP8_1x16 {"", "fp8", 1, 16, G_FP8_ONE, 0}

static const bad_case bad_cases[] = {
    /* the record (format.md section 10): nwc_record_read */
    {"bad_magic", "read", "EBADMSG", BF16_1x1, F_MAGIC, 0, 0, 0, "magic NWCX, not NWCT"},
    {"bad_version", "read", "EBADMSG", BF16_1x1, F_VERSION, 0, 0, 0, "format version 10, not 11"},
    {"bad_flags", "read", "EBADMSG", BF16_1x1, F_FLAGS, 0, 0, 0, "flags bit 1 set"},
    {"bad_length", "read", "EBADMSG", BF16_1x1, F_LENGTH, 0, 0, 0,
     "one byte shorter than the header describes"},
    {"bad_checksum", "read", "EBADMSG", BF16_1x1, F_CHECKSUM, 0, 0, 0,
     "last byte flipped, checksum not updated"},
    /* validation (format.md section 11), through the reader */
    {"bad_type", "read", "EBADMSG", BF16_1x1, F_TYPE, 0, 0, 0, "element type 2"},
    {"bad_layout", "read", "ENOTSUP", BF16_1x1, F_LAYOUT, 0, 0, 0, "layout 3"},
    {"bad_cols0", "read", "EBADMSG", BF16_1x1, F_COLS0, 0, 0, 0, "K = 0"},
    {"bad_psym_repeat", "read", "EBADMSG", BF16_1x1, F_PSYM_REPEAT, 0, 0, 0,
     "bf16 psym[1] = psym[0]"},
    {"bad_psym15", "read", "EBADMSG", BF16_1x1, F_PSYM15, 0, 0, 0, "bf16 psym[15] = 1, not 0"},
    {"bad_fp8_psym", "read", "EBADMSG", {"", "fp8", 9, 513, G_FP8_TYPICAL, 0}, F_FP8_PSYM, 0, 0, 0,
     "fp8 psym[0] = 68, no symbol byte"},
    {"bad_hdr_inactive", "read", "EBADMSG", {"", "bf16", 11, 5, G_TYPICAL, 0}, F_HDR_INACTIVE, 0,
     0, 0, "K = 5: lane 1 is inactive but hdr gives it 2 units"},
    {"bad_hdr_short", "read", "EBADMSG", BF16_1x1, F_HDR_SHORT, 0, 0, 0,
     "lane 0 of a 1-row block: 1 unit, at least 2"},
    {"bad_bases0", "read", "EBADMSG", BF16_1x1, F_BASES0, 0, 0, 0, "bases[0] = 8"},
    {"bad_bases_chain", "read", "EBADMSG", {"", "bf16", 9, 513, G_TYPICAL, 0}, F_BASES_CHAIN, 0, 0,
     0, "bases[1] 8 bytes past the end of block 0's streams"},
    {"bad_data_bytes", "read", "EBADMSG", BF16_1x1, F_DATA_BYTES, 0, 0, 0,
     "data_bytes = bases[NB] + 24 (8 more zero bytes), not + 16"},
    {"bad_scale", "read", "EBADMSG", {"", "fp8q", 10, 40, G_TYPICAL, 0}, F_SCALE, 0, 0, 0,
     "scale[0] = 0"},
    {"bad_l1_hdr", "read", "EBADMSG", {"", "bf16", 1, 1, G_TYPICAL, 1}, F_L1_HDR, 0, 0, 0,
     "layout 1: lane 0 has 0 words, at least nsc = 1 (lane 1 one more)"},
    {"bad_l2_lut7", "read", "EBADMSG", {"", "bf16", 1, 1, G_TYPICAL, 2}, F_L2_LUT7, 0, 0, 0,
     "layout 2: psym[7] = 1"},
    {"bad_l2_fp8_lut_repeat", "read", "EBADMSG", {"", "fp8", 9, 513, G_FP8_TYPICAL, 2},
     F_L2_LUT_REPEAT, 0, 0, 0, "layout 2: rank 1 has rank 0's full symbol E"},
    {"bad_l2_fp8_lut_exp", "read", "EBADMSG", {"", "fp8", 9, 513, G_FP8_TYPICAL, 2}, F_L2_LUT_EXP,
     0, 0, 0, "layout 2: rank 6 has E = 116, no fp8 exponent"},
    {"bad_l2_exc_order", "read", "EBADMSG", {"", "bf16", 24, 100, G_ESCAPES, 2}, F_L2_EXC_ORDER, 0,
     0, 0, "layout 2: a lane's first two exception entries swapped"},
    {"bad_l2_exc_outside", "read", "EBADMSG", {"", "bf16", 24, 100, G_ESCAPES, 2},
     F_L2_EXC_OUTSIDE, 0, 0, 0, "layout 2: an exception index at a column >= K"},
    {"bad_l2_exc_nsc", "read", "EBADMSG", {"", "bf16", 24, 100, G_ESCAPES, 2}, F_L2_EXC_NSC, 0, 0,
     0, "layout 2: an exception index in super-chunk 4 of a block that codes 4"},
    {"bad_l2_exc_rank", "read", "EBADMSG", {"", "bf16", 24, 100, G_ESCAPES, 2}, F_L2_EXC_RANK, 0,
     0, 0, "layout 2: an exception entry whose nibble is 0, not rank 7"},
    {"bad_l2_fp8_exc_nan", "read", "EBADMSG", {"", "fp8", 3, 300, G_FP8_ALL, 2}, F_L2_EXC_NAN, 0,
     0, 0, "layout 2: an fp8 exception entry holds 0x7f (NaN)"},
    /* the codes (format.md section 8): the record reads, dequant and matvec fail */
    {"bad_fp8_rank10", "decode", "EBADMSG", FP8_1x16, F_LANE0, "000000000010", 15, "",
     "fp8: lane 0 starts with the rank-10 code (table: slow entry, byte 0 = 12, psym[10] = 0)"},
    {"bad_fp8_rank10_second", "decode", "EBADMSG", FP8_1x16, F_LANE0, "10000000000010", 14, "",
     "fp8: lane 0's second code is rank 10"},
    {"bad_fp8_escape", "decode", "EBADMSG", FP8_1x16, F_LANE0, "000000000000000100111111", 15, "",
     "fp8: lane 0 starts with a BF16 escape (15 zeros): fp8 has none"},
    {"bad_bf16_zeros16", "decode", "EBADMSG", BF16_1x16, F_LANE0, "000000000000000010", 15, "",
     "bf16: lane 0 starts with 16 zeros"},
    {"bad_bf16_overrun", "decode", "EBADMSG", BF16_1x16, F_LANE0, "010", 14, "1",
     "bf16: lane 0's 16 codes need 33 bits, hdr = 2 units (32 bits)"},
    {"bad_l1_fp8_rank10", "decode", "EBADMSG", {"", "fp8", 1, 1, G_FP8_ONE, 1}, F_LANE0,
     "000000000010", 15, "", "layout 1, fp8: lane 0 starts with the rank-10 code"},
    {"bad_l1_bf16_zeros16", "decode", "EBADMSG", {"", "bf16", 1, 1, G_EQUAL, 1}, F_LANE0,
     "000000000000000010", 15, "", "layout 1, bf16: lane 0 starts with 16 zeros"},
    {"bad_l1_bf16_overrun", "decode", "EBADMSG", {"", "bf16", 1, 1, G_EQUAL, 1}, F_LANE0, "010", 14,
     "1", "layout 1, bf16: lane 0's 16 codes need 33 bits, hdr = 1 word"},
    /* inputs the encoder rejects */
    {"bad_l2_exc256", "encode", "ERANGE", {"", "bf16", 16, 512, G_EXC256, 2}, F_NONE, 0, 0, 0,
     "layout 2: lane 0 of block 0 has 256 exceptions, at most 255 fit"},
    {"bad_fp8_nan", "encode", "EINVAL", {"", "fp8", 1, 16, G_FP8_NAN, 0}, F_NONE, 0, 0, 0,
     "fp8 input with NaN bytes 0x7f and 0xff"},
    {"bad_l2_fp8_nan", "encode", "EINVAL", {"", "fp8", 1, 16, G_FP8_NAN, 2}, F_NONE, 0, 0, 0,
     "layout 2: fp8 input with NaN bytes 0x7f and 0xff"},
    {"bad_fp8q_inf", "encode", "EINVAL", {"", "fp8q", 1, 16, G_BF16_INF, 0}, F_NONE, 0, 0, 0,
     "fp8 quantization of a row holding +Inf"},
};

static uint64_t get64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* The checksum of format.md section 10, written again after a patch. */
static void reseal(uint8_t *rec, size_t len) {
  put64(rec + 64, XXH3_64bits_withSeed(rec + 72, len - 72, XXH3_64bits(rec, 64)));
}

static unsigned stream_bit(const uint8_t *d, uint64_t k) {
  uint32_t w;
  memcpy(&w, d + 4 * (k / 32), 4);
  return w >> (31 - k % 32) & 1u;
}

static void set_stream_bit(uint8_t *d, uint64_t k) {
  uint32_t w;
  memcpy(&w, d + 4 * (k / 32), 4);
  w |= UINT32_C(1) << (31 - k % 32);
  memcpy(d + 4 * (k / 32), &w, 4);
}

/* F_LANE0: the record of a one-block tensor with lane 0's stream replaced by bits (units of
 * unit_bits bits: 16 in layout 0, 32 in layout 1), the other lanes' streams moved behind it. */
static uint8_t *replace_lane0(uint8_t *rec, size_t *len, const char *bits, unsigned unit_bits) {
  const size_t hdr_off = 72 + 16, data_off = hdr_off + 32;
  uint64_t old_bytes = get64(rec + 48), nbits = strlen(bits);
  uint8_t *hdr = rec + hdr_off, *old = rec + data_off;
  uint64_t units = (nbits + unit_bits - 1) / unit_bits;
  for (unsigned L = 1; L < 32; L++) units += hdr[L];
  uint64_t block = (4 * ((units * unit_bits + 31) / 32) + 7) / 8 * 8, new_bytes = block + 16;
  uint8_t *data = calloc(1, new_bytes);
  for (uint64_t k = 0; k < nbits; k++)
    if (bits[k] == '1') set_stream_bit(data, k);
  uint64_t from = (uint64_t)hdr[0] * unit_bits, to = (nbits + unit_bits - 1) / unit_bits * unit_bits;
  for (unsigned L = 1; L < 32; L++)
    for (unsigned k = 0; k < hdr[L] * unit_bits; k++, from++, to++)
      if (stream_bit(old, from)) set_stream_bit(data, to);
  hdr[0] = (uint8_t)((nbits + unit_bits - 1) / unit_bits);
  put64(rec + 72 + 8, block);
  put64(rec + 48, new_bytes);
  size_t tail = *len - data_off - old_bytes, n = data_off + new_bytes + tail;
  uint8_t *out = cu_malloc(n);
  memcpy(out, rec, data_off);
  memcpy(out + data_off, data, new_bytes);
  memcpy(out + data_off + new_bytes, rec + data_off + old_bytes, tail);
  free(data);
  free(rec);
  *len = n;
  return out;
}

/* Layout 2: the first lane of block 0 with at least `min` entries (and, if q1, L & 3 >= 1);
 * its first entry's offset in rec.  Block 0's entries start at data. */
static size_t l2_lane(const uint8_t *rec, unsigned eb, unsigned min, int q1, unsigned *lane) {
  uint64_t nb = get64(rec + 40);
  size_t hdr_off = 72 + 8 * (nb + 1), off = hdr_off + 32 * nb;
  for (unsigned L = 0; L < 32; off += rec[hdr_off + L] * eb, L++)
    if (rec[hdr_off + L] >= min && (!q1 || (L & 3))) {
      *lane = L;
      return off;
    }
  fprintf(stderr, "make_golden: no lane with %u exceptions\n", min);
  exit(1);
}

/* Applies fault f to the record (format.md section 10 for the offsets); may reallocate it. */
static uint8_t *patch(const bad_case *c, uint8_t *rec, size_t *len) {
  uint64_t nb = get64(rec + 40), data_bytes = get64(rec + 48), raw_bytes = get64(rec + 56);
  size_t hdr_off = 72 + 8 * (nb + 1), data_off = hdr_off + 32 * nb, raw_off = data_off + data_bytes;
  uint8_t *psym = rec + 24, *hdr = rec + hdr_off;
  unsigned lane = 0, eb = NWC_ELEM_TYPE(rec[6]) == NWC_ELEM_BF16 ? 3 : 2;
  size_t e, last;
  switch (c->fault) {
  case F_MAGIC: rec[3] = 'X'; break;
  case F_VERSION: rec[4] = 10, rec[5] = 0; break;
  case F_FLAGS: rec[7] |= 2; break;
  case F_LENGTH: *len -= 1; break;
  case F_CHECKSUM: rec[*len - 1] ^= 1; return rec; /* not resealed */
  case F_TYPE: rec[6] = (uint8_t)((rec[6] & 0xf0) | 2); break;
  case F_LAYOUT: rec[6] = (uint8_t)((rec[6] & 0x0f) | 0x30); break;
  case F_COLS0: put64(rec + 16, 0); break;
  case F_PSYM_REPEAT: psym[1] = psym[0]; break;
  case F_PSYM15: psym[15] = 1; break;
  case F_FP8_PSYM: psym[0] = 68; break;
  case F_HDR_INACTIVE: hdr[1] = 2; break;
  case F_HDR_SHORT: hdr[0] = 1; break; /* 2 -> 1 unit: bases[1] = 8 either way */
  case F_BASES0: put64(rec + 72, 8); break;
  case F_BASES_CHAIN: put64(rec + 80, get64(rec + 80) + 8); break;
  case F_DATA_BYTES: { /* 8 more zero bytes behind the slack */
    uint8_t *r = cu_malloc(*len + 8);
    memcpy(r, rec, raw_off);
    memset(r + raw_off, 0, 8);
    memcpy(r + raw_off + 8, rec + raw_off, *len - raw_off);
    free(rec);
    rec = r;
    *len += 8;
    put64(rec + 48, data_bytes + 8);
    break;
  }
  case F_SCALE: memset(rec + raw_off + raw_bytes, 0, 4); break;
  case F_L1_HDR: hdr[0] = 0, hdr[1]++; break; /* same sum: bases unchanged */
  case F_L2_LUT7: psym[7] = 1; break;
  case F_L2_LUT_REPEAT: psym[1] = psym[0], psym[9] = psym[8]; break;
  case F_L2_LUT_EXP: psym[6] = 58, psym[14] = 0; break; /* E = 116 */
  case F_L2_EXC_ORDER: {
    uint8_t tmp[3];
    e = l2_lane(rec, eb, 2, 0, &lane);
    memcpy(tmp, rec + e, eb);
    memcpy(rec + e, rec + e + eb, eb);
    memcpy(rec + e + eb, tmp, eb);
    break;
  }
  case F_L2_EXC_OUTSIDE: /* index 63: super-chunk 3, j = 15, column 96 + 8q + 7 >= 104 > K */
  case F_L2_EXC_NSC:     /* index 79: super-chunk 4 */
    e = l2_lane(rec, eb, 1, 1, &lane);
    last = e + (hdr[lane] - 1u) * eb;
    if (rec[last] >= 63) {
      fprintf(stderr, "make_golden: %s: the last index is already %u\n", c->name, rec[last]);
      exit(1);
    }
    rec[last] = c->fault == F_L2_EXC_OUTSIDE ? 63 : 79;
    break;
  case F_L2_EXC_RANK: { /* block 0 is row group 0, column block 0: slot = super-chunk */
    e = l2_lane(rec, eb, 1, 0, &lane);
    unsigned idx = rec[e], j = idx & 15;
    rec[raw_off + ((idx >> 4) * 32 + lane) * 8 + (j >> 1)] &= (uint8_t)(j & 1 ? 0x0f : 0xf0);
    break;
  }
  case F_L2_EXC_NAN:
    e = l2_lane(rec, eb, 1, 0, &lane);
    rec[e + 1] = 0x7f;
    break;
  case F_LANE0: {
    size_t n = strlen(c->prefix) + 2 * c->fillers + strlen(c->suffix);
    char *bits = cu_malloc(n + 1);
    strcpy(bits, c->prefix);
    for (unsigned k = 0; k < c->fillers; k++) strcat(bits, "10");
    strcat(bits, c->suffix);
    rec = replace_lane0(rec, len, bits, NWC_ELEM_LAYOUT(rec[6]) ? 32 : 16);
    free(bits);
    break;
  }
  }
  reseal(rec, *len);
  return rec;
}

/* Makes one invalid case and checks that the library fails it as invalid.txt will say. */
static int make_bad_case(const char *dir, const bad_case *c, FILE *manifest) {
  const golden_case *b = &c->base;
  uint64_t M = b->rows, K = b->cols, n = M * K;
  int fp8_in = !strcmp(b->type, "fp8"), quant = !strcmp(b->type, "fp8q");
  int encode = !strcmp(c->stage, "encode"), want = cu_errno_value(c->err), rc = 0, got = 0;
  void *in = cu_malloc(n * 2);
  make_input(b, in);
  uint8_t *q = fp8_in ? in : cu_malloc(n), *rec = NULL;
  float *scale = quant ? cu_malloc(M * sizeof *scale) : NULL;
  size_t len = 0;
  unsigned type = fp8_in || quant ? NWC_ELEM_FP8 : NWC_ELEM_BF16;
  nwc_tensor t;
  got = quant ? nwc_quantize_fp8(in, M, K, q, scale) : 0;
  if (got == 0)
    got = nwc_tensor_encode(type == NWC_ELEM_FP8 ? (void *)q : in, M, K, NWC_ELEM(type, b->layout),
                            scale, &t);
  if (got == 0) {
    rc = nwc_record_write(&t, &rec, &len);
    nwc_tensor_release(&t);
  }
  if (rc == 0 && !encode && got == 0) {
    rec = patch(c, rec, &len);
    got = nwc_record_read(rec, len, &t);
    if (got == 0 && !strcmp(c->stage, "decode")) {
      uint16_t *out = cu_malloc(M * cu_k16(K) * 2);
      float *x = calloc(cu_k16(K), sizeof *x), *y = cu_malloc(M * sizeof *y);
      got = nwc_dequant(&t, out);
      int mv = nwc_matvec(&t, x, NULL, y, NULL);
      if (mv != got) got = 1; /* reported below */
      free(out), free(x), free(y);
      nwc_tensor_release(&t);
    }
  }
  if (rc < 0 || got != -want) {
    fprintf(stderr, "make_golden: %s: expected %s at %s, got %d (%s)\n", c->name, c->err, c->stage,
            got, nwc_error_detail());
    rc = -1;
  }
  if (rc == 0) rc = encode ? write_file(dir, c->name, ".in", in, fp8_in ? n : n * 2)
                           : write_file(dir, c->name, ".nwct", rec, len);
  fprintf(manifest, "%s %s %s %s %llu %llu %u %s\n", c->name, c->stage, c->err, b->type,
          (unsigned long long)M, (unsigned long long)K, b->layout, c->why);
  printf("%-22s %-6s %-7s %s\n", c->name, c->stage, c->err, nwc_error_detail());
  free(rec);
  if (!fp8_in) free(q);
  free(scale);
  free(in);
  return rc;
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  setenv("NWC_SEED", "20261201", 1); /* fixed on purpose: golden data must not change */
  test_seed("make_golden");
  char path[4096];
  snprintf(path, sizeof path, "%s/golden.txt", dir);
  FILE *manifest = fopen(path, "w");
  if (!manifest) {
    fprintf(stderr, "make_golden: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(manifest, "# name type rows cols (written by make_golden; see README.md)\n");
  int rc = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0] && rc == 0; i++)
    rc = make_case(dir, &cases[i], manifest);
  if (fclose(manifest)) rc = -1;
  /* after the valid cases, so that their inputs do not move */
  snprintf(path, sizeof path, "%s/invalid.txt", dir);
  manifest = rc == 0 ? fopen(path, "w") : NULL;
  if (!manifest) {
    fprintf(stderr, "make_golden: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  fprintf(manifest, "# name stage error type rows cols layout why (written by make_golden; see "
                    "README.md)\n");
  for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0] && rc == 0; i++)
    rc = make_bad_case(dir, &bad_cases[i], manifest);
  if (fclose(manifest)) rc = -1;
  return rc ? 1 : test_exit("make_golden");
}
