/* cmd_bench_gemm.c — `deepwell bench-gemm`: the GEMM benchmark of bench_gemm.c as its own command
 * until a `deepwell bench <what>` dispatcher (tools/cmd_bench.c) exists; then it is `bench gemm`. */
#include "cli.h"

int dw_bench_gemm(int argc, char **argv);

int cmd_bench_gemm(int argc, char **argv) { return dw_bench_gemm(argc, argv); }
