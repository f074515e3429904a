/* cmd_bench.c — `deepwell bench <what>`: a small table of GPU micro-benchmarks, each in its own
 * tools/bench_<what>.c. Add one by adding one X line to DW_BENCHES. Not the benchmarks themselves. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* X(name, function, one-line summary) */
#define DW_BENCHES(X)                                                                           \
    X(quant, bench_quant, "quantise BF16 to mxfp8 / fp8_block (+ transposed copy) vs cudaMemcpy")  \
    X(gemm, bench_gemm, "dw_gemm per recipe (8192^3, GPT-2, Llama shapes) vs cuBLAS; --explain")      \
    X(grouped, bench_grouped, "MoE grouped expert GEMMs (fprop, dgrad, wgrad; balanced, Zipf) (anchor: bench/grouped_anchor.py)") \
    X(step, dw_bench_step, "CUDA engine training step: tokens/s, MFU, memory (anchor: bench/train_anchor.py); --profile")

#define X(name, fn, summary) int fn(int argc, char **argv);
DW_BENCHES(X)
#undef X

typedef struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *summary;
} bench_entry;

static const bench_entry benches[] = {
#define X(name, fn, summary) {#name, fn, summary},
    DW_BENCHES(X)
#undef X
};

static void help(FILE *out) {
    fprintf(out, "Usage: deepwell bench <what> [options]   (deepwell bench <what> --help for its options)\n\n"
                 "GPU micro-benchmarks, timed with CUDA events against an anchor measured in the same run\n"
                 "(a device-to-device copy, cuBLAS BF16). Without a GPU they say so and exit 1.\n\nBenchmarks:\n");
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        fprintf(out, "  %-10s %s\n", benches[i].name, benches[i].summary);
}

int cmd_bench(int argc, char **argv) {
    if (argc < 2) {
        cli_error("bench", "which benchmark? (see deepwell bench --help)");
        help(stderr);
        return DW_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        help(stdout);
        return DW_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof benches / sizeof benches[0]; i++)
        if (!strcmp(argv[1], benches[i].name)) return benches[i].fn(argc - 1, argv + 1);
    cli_error("bench", "unknown benchmark '%s'", argv[1]);
    help(stderr);
    return DW_EXIT_USAGE;
}
