/*
 * nwc_bench.c - the nwc-bench command: dispatches to the benchmark subcommands, each of which
 * prints one JSON object per line (one per measured item, then a summary).
 */
#include "bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
  fputs("usage: nwc-bench SUBCOMMAND [ARGS]\n"
        "  codec FILE.safetensors [--layout N] [--elem bf16|fp8] [--seconds S]\n"
        "        encode, decode and matvec every tensor on one core; JSON line per tensor + summary\n"
        "  import FILE.safetensors [...]\n"
        "        import into a temporary store on 1..N threads; JSON line per thread count\n"
        "  daemon FILE.safetensors [...]\n"
        "        nwcd round trips against in-process calls, throughput, load\n"
        "  load STORE_DIR|FILE.safetensors [--copies N] [--repeat R] [--depth D] [--mode M]\n"
        "        nwcd's loader against cat, read(2) and O_DIRECT of the same files, cold and warm\n"
        "  soak FILE.safetensors [--clients N] [--seconds T] [--budget SIZE]\n"
        "        N clients of mixed requests for T s: nwcd's RSS, descriptors, ls latency\n"
        "  map FILE.safetensors [...]\n"
        "        calls on a mapped tensor against the socket, memory of N mapping processes\n"
        "  gpu-daemon [--tensors T] [--rows M] [--cols K] [--embed E] [--rounds R] [--iters N]\n"
        "        [--places P,Q[,..]: a warm load onto several places at once vs one]\n"
        "        (CUDA builds)\n"
        "        nwcd --backend cuda: GPU loads vs O_DIRECT and BF16 read + cudaMemcpy, matvec\n"
        "        through the socket vs the bare kernel, 8 clients at once vs in a row\n"
        "Output is JSON lines on stdout; progress and errors go to stderr.\n",
        f);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0); /* JSON lines come out as they are made, also into a pipe */
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "daemon")) return nwc_bench_daemon(argc - 1, argv + 1);
  if (!strcmp(argv[1], "codec")) return nwc_bench_codec(argc - 1, argv + 1);
  if (!strcmp(argv[1], "import")) return nwc_bench_import(argc - 1, argv + 1);
  if (!strcmp(argv[1], "load")) return nwc_bench_load(argc - 1, argv + 1);
  if (!strcmp(argv[1], "map")) return nwc_bench_map(argc - 1, argv + 1);
  if (!strcmp(argv[1], "soak")) return nwc_bench_soak(argc - 1, argv + 1);
#ifdef NWC_BENCH_CUDA
  if (!strcmp(argv[1], "gpu-daemon")) return nwc_bench_gpu_daemon(argc - 1, argv + 1);
#endif
  fprintf(stderr, "nwc-bench: unknown subcommand '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
