/*
 * test_work_split.c - the split of layouts 1 and 2's work among warps (kernels/work.cuh), run on
 * the CPU (work_split_host.cu) for the nine benchmark shapes and the test shapes on a 132-SM
 * H200's resident warps (3168 for the one-column matvec, 2112 for more, 4224 for dequant), for
 * layout 1's whole blocks, and for random shapes and warp counts (seed printed; NWC_SEED replays):
 * every slot streamed once, batches within their block and piece, only a warp's first and last
 * piece a part, and each row group's parts exactly those of the warps Split::contributors names,
 * in the slots the last contributor reads; then finish_parts' sums a CTA at a time (CTAs of 8
 * warps as the kernels', of 1 and of 3) on numbers: every part added once, every row group's rows
 * written once with the sum of all its parts.  Needs no GPU.
 */
#include "test_util.h"

#include <stdint.h>
#include <stdio.h>

#define NAME "test_work_split"

int nwc_test_work_split(uint64_t groups, uint32_t S, uint32_t G, uint64_t warps, unsigned D, char *msg,
                        size_t len);

/* Slots of a row group of a matrix of K columns (docs/format-layouts.md §2). */
static uint32_t slots_of(uint64_t K) {
  uint64_t K16 = (K + 15) / 16 * 16, CB = (K + 511) / 512, nl = (K16 - 512 * (CB - 1)) / 16;
  return (uint32_t)(16 * (CB - 1) + (nl + 1) / 2);
}

static void check(uint64_t M, uint64_t K, uint32_t G, uint64_t warps, unsigned D) {
  char msg[256];
  uint64_t groups = (M + 15) / 16;
  uint32_t S = slots_of(K);
  int rc = nwc_test_work_split(groups, S, G, warps, D, msg, sizeof msg);
  CHECK(rc == 0, "%llux%llu (%llu row groups, %u slots), G %u, %llu warps, D %u: %s", (unsigned long long)M,
        (unsigned long long)K, (unsigned long long)groups, S, G, (unsigned long long)warps, D, msg);
}

int main(void) {
  test_seed(NAME);
  static const uint64_t shapes[][2] = {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}, {151936, 2560},
                                       {4096, 4096}, {11008, 4096}, {4096, 11008}, {28672, 4096}, {1, 1},
                                       {7, 13},      {17, 1040},   {9, 513},     {151936, 64}, {65536, 320},
                                       {300, 2560},  {16, 11008}};
  static const uint64_t warps[] = {3168, 2112, 4224, 1056};
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (size_t w = 0; w < sizeof warps / sizeof warps[0]; w++) {
      check(shapes[s][0], shapes[s][1], 1, warps[w], 4);
      check(shapes[s][0], shapes[s][1], 2, warps[w], 2); /* fp8: pairs of slots */
      check(shapes[s][0], shapes[s][1], 16, warps[w], 2); /* layout 1: whole blocks */
    }
  for (int i = 0; i < 300 && !test_failures; i++) {
    uint64_t M = 1 + test_below(test_below(2) ? 64 : 40000), K = 1 + test_below(test_below(2) ? 600 : 12000);
    static const uint32_t G[] = {1, 2, 16};
    check(M, K, G[test_below(3)], 1 + test_below(5000), test_below(2) ? 2 : 4);
  }
  return test_exit(NAME);
}
