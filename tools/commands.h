/* commands.h — the list of `deepwell` subcommands: X(name, function, one-line summary).
 * main.c expands it into the dispatch table and the help text; each command lives in
 * tools/cmd_<name>.c. Add a command by adding one line here. */
DW_COMMAND(probe, cmd_probe, "show this machine's GPUs, features and links, or a datasheet preset")
DW_COMMAND(quantize, cmd_quantize, "quantise a safetensors checkpoint with one recipe (FORMATS.md layout)")
DW_COMMAND(quant-report, cmd_quant_report, "per-tensor error of each recipe on a safetensors checkpoint, or a run's quantised layers over time")
DW_COMMAND(capture, cmd_capture, "show a model's graph (HF config.json or preset): nodes, params, FLOPs/token")
DW_COMMAND(eval, cmd_eval, "loss of a model on one batch of tokens (CPU reference engine)")
DW_COMMAND(plan, cmd_plan, "search parallel plans (DP/TP/PP/CP/EP, micro-batch, recompute, ZeRO) for a model")
DW_COMMAND(dryrun, cmd_dryrun, "check a plan: constraints, memory per GPU, comm overlap, bubbles (PASS/FAIL)")
DW_COMMAND(bench, cmd_bench, "GPU micro-benchmarks: bench quant, bench gemm (see deepwell bench --help)")
DW_COMMAND(compile, cmd_compile, "compile a model for the CUDA engine: per-node recipe and kernel, memory plan per pool")
DW_COMMAND(train, cmd_train, "train a model (AdamW, schedules, checkpoints, resume) on token shards, text or builtin data")
DW_COMMAND(launch, cmd_launch, "run a command as N ranks of one job on this node (deepwell launch -n 2 -- train ...)")
DW_COMMAND(sample, cmd_sample, "generate text from a checkpoint, model directory or preset")
DW_COMMAND(export, cmd_export, "write a run, checkpoint or model directory as a Hugging Face model (hf, hf-fp8)")
DW_COMMAND(report, cmd_report, "one self-contained HTML page of a training run: summary and plots of metrics.jsonl")
