/* commands.h — the list of `deepwell` subcommands: X(name, function, one-line summary).
 * main.c expands it into the dispatch table and the help text; each command lives in
 * tools/cmd_<name>.c. Add a command by adding one line here. */
DW_COMMAND(probe, cmd_probe, "show this machine's GPUs, features and links, or a datasheet preset")
DW_COMMAND(bench-gemm, cmd_bench_gemm, "time dw_gemm per recipe on the GPU (8192^3, GPT-2, Llama shapes); --explain selections")
