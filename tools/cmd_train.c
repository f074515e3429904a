/* cmd_train.c — `deepwell train`: flags -> a model opened for the device and precision
 * (dw_model_open: capture, compile, engine) and dw_train_opts; a live progress line on stderr,
 * samples on stdout, stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1; first: finish the step,
 * checkpoint, exit 128 + signal; second: abort). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "run_record.h"
#include "train_resume.h"

static const char *CMD = "train"; /* "train (rank R/N)" in a job of several ranks */

/* This process's place in a job of several (mpirun, torchrun, srun, `deepwell launch`). */
static dw_dist_env dist = {.world_size = 1, .local_world_size = 1, .launcher = "none"};
enum { O_ZERO = O_LAST + 1 }; /* not in the resume record: any stage resumes any checkpoint */
/* --init, --init-from: not in the resume record either (a resumed run's weights are its checkpoint's) */
enum { O_INIT = O_ZERO + 1, O_INIT_FROM };
/* --moe-drop: not in the resume record either (the checkpoint's config.json keeps the policy) */
enum { O_MOE_DROP = O_INIT_FROM + 1 };
/* guardrails: may change on resume (not in the record) */
enum { O_MAX_SKIPS = O_LAST + 80, O_QCHECK, O_QFALLBACK, O_QCHECK_ELEMS };
/* the counters' fallback rule: not in the record either; a value clear of the enums here */
enum { O_QOVER_MAX = O_LAST + 160, O_QUNDER_MAX, O_QCOUNTS_AFTER };
/* loss-spike rollback, delayed FP8 scaling: not in the record either (a checkpoint written with an
 * amax history refuses a resume with another length itself) */
enum { O_SPIKE_Z = O_LAST + 84, O_SPIKE_W, O_MAX_ROLLBACKS, O_AMAX_HIST };
/* --ep: not in the resume record (a checkpoint holds every expert, any --ep resumes it); a value
 * clear of the enums above */
enum { O_EP = O_LAST + 64 };
/* --no-overlap: not in the record either (the same collectives either way) */
enum { O_NO_OVERLAP = O_LAST + 130 };
/* --recompute: not in the resume record (it trades memory for compute; the values are the same) */
enum { O_RECOMPUTE = O_LAST + 96 };
/* --no-fused-head: not in the record either (the same values; the logits are only held in chunks) */
enum { O_NO_FUSED_HEAD = O_LAST + 140 };
static bool fused_head = true;
/* --no-grad-arena: not in the record either (the same values; only where the gradients live) */
enum { O_NO_GRAD_ARENA = O_LAST + 170 };
static bool grad_arena = true;
/* --moe-bias-update: not in the resume record (the checkpoint's state.json keeps the bias and its γ) */
enum { O_MOE_BIAS = O_LAST + 120 };
/* --tokenizer: not in the record either (the run directory keeps its tokenizer.json) */
enum { O_TOKENIZER = O_LAST + 150 };
static const char *tokenizer; /* --tokenizer, else the model directory's tokenizer.json (if any) */
static int recompute = DW_RECOMPUTE_NONE, recompute_blocks = 0;

/* Where a new run's weights come from: MODEL's own when it has them (else the seed), the seed
 * (--init random), or another source (--init-from). */
typedef struct {
    bool random;
    const char *from;
    dw_moe_drop moe_drop; /* --moe-drop; DW_MOE_DROP_CONFIG when not given */
} train_init;

static void help(void) {
    printf(
        "Usage: deepwell train --model MODEL --data PATTERN|builtin --out DIR [options]\n"
        "       deepwell train --resume RUN [--steps N] [options that may change]\n\n"
        "Trains a model with AdamW and writes DIR/metrics.jsonl (one JSON object per step) and\n"
        "checkpoints DIR/ckpt-<step>/ (config.json, model.safetensors, optimizer.safetensors or,\n"
        "with several ranks, one optimizer shard per rank and its index, state.json) with\n"
        "DIR/latest naming the newest.\n\n"
        "  --model MODEL          preset (gpt2-tiny, llama-tiny, ...) or Hugging Face model directory;\n"
        "                         training starts from the directory's weights when it has them\n"
        "                         (model.safetensors or a sharded model.safetensors.index.json;\n"
        "                         F32, F16 or BF16), else from a random initialisation\n"
        "  --init auto|random     auto: as above (default); random: initialise from --seed even\n"
        "                         when MODEL has weights\n"
        "  --init-from SRC        start from the weights of SRC instead: a model directory, a\n"
        "                         checkpoint or run directory (its newest checkpoint) or a\n"
        "                         .safetensors file; each tensor must have MODEL's shape\n");
    printf( /* (split: C99 compilers need only support 4095 characters in one string) */
        "  --data PATTERN         llm.c token shards (*.bin, glob), text files (read as bytes), or\n"
        "                         builtin (addition facts \"3+4=7\", a, b in 0..4; no file needed)\n"
        "  --val PATTERN          validation data (default for builtin: its validation stream;\n"
        "                         else none)\n"
        "  --out DIR              run directory (created)\n"
        "  --resume RUN           continue a run (its directory or a checkpoint) with everything it\n"
        "                         recorded: model, data, val, batch, seq, schedule, optimizer,\n"
        "                         precision, eval and checkpoint cadence, keep, seed, device, and\n"
        "                         --out RUN; it prints them. A flag contradicting the record is\n"
        "                         refused; --steps, --keep, --device, --out, sampling and logging\n"
        "                         may change\n"
        "  --steps N              total optimizer steps (100); a resumed run continues up to N (its\n"
        "                         recorded total); beyond it the schedule keeps its end step and\n"
        "                         the extra steps run at --min-lr\n"
        "  --batch B              micro-batch, sequences per forward/backward (8)\n"
        "  --seq T                sequence length (64)\n"
        "  --global-batch G       sequences per optimizer step, a multiple of B (default B):\n"
        "                         gradients are accumulated over G/B micro-batches\n"
        "  --lr LR                peak learning rate (1e-3)\n"
        "  --min-lr LR            learning rate at the last step (1e-4; above --lr is refused)\n"
        "  --warmup N             linear warmup steps (10)\n"
        "  --schedule S           cosine, linear or constant after warmup (cosine)\n"
        "  --weight-decay W       AdamW decay on matrices only (0.1)\n"
        "  --clip C               global gradient-norm clipping, 0 = off (1.0)\n"
        "  --beta1 B1, --beta2 B2 AdamW betas (0.9, 0.95)\n"
        "  --eval-every K         validation loss every K steps and at the end, 0 = never (50)\n"
        "  --eval-batches N       micro-batches per validation (8)\n"
        "  --sample-every K       print a sample every K steps and at the end, 0 = never (0)\n"
        "  --sample-tokens N      tokens per sample (64)\n"
        "  --sample-temp T        sampling temperature, 0 = greedy (0.8)\n"
        "  --sample-prompt TEXT   prompt (text for byte-level data or token ids with the run's\n"
        "                         tokenizer.json, which also decodes the samples; ids otherwise;\n"
        "                         default: the first min(16, T/4) tokens of the step's first sequence)\n"
        "  --ckpt-every K         checkpoint every K steps, 0 = only at the end (0)\n"
        "  --ckpt-minutes M       also checkpoint every M minutes of wall time (fractions allowed),\n"
        "                         so a crash loses at most that much work; 0 = by steps only (30)\n"
        "  --keep K               keep the newest K checkpoints, 0 = all (3)\n"
        "  --device D             cpu, cuda or auto (auto: cuda when a GPU is usable, else cpu).\n"
        "                         cpu: the exact reference backend; cuda: the GPU. Both run the\n"
        "                         same compiled program and write the same checkpoint format: a\n"
        "                         run resumes on either device\n"
        "  --precision R          default recipe of the linear layers: bf16, fp8_block, mxfp8,\n"
        "                         nvfp4, ... (as `deepwell compile`); default bf16 on CUDA and\n"
        "                         FP32 (no policy: FP32 activations) on the CPU, which runs every\n"
        "                         recipe exactly (FORMATS.md quantisation, the reference GEMM)\n"
        "  --policy FILE          a precision policy JSON instead of --precision; a rule's\n"
        "                         \"bf16_passes\" names the GEMMs it keeps BF16 (by default, under\n"
        "                         either: the fp8_block MoE experts' wgrad; docs/precision.md)\n"
        "  --fallback safe|head|none  with --precision: what stays BF16 — head (default): the LM\n"
        "                         head; safe: also embeddings and the first and last block; none:\n"
        "                         nothing. The policy and every linear node's recipe are recorded\n"
        "                         in the checkpoint's state.json\n");
    printf( /* (two strings: C99 compilers need only support 4095 characters in one) */
        "  --seed S               weights, data order and sampling (1337; a resumed run keeps its own)\n"
        "  --log-every K          progress line every K steps when stderr is not a terminal (1)\n"
        "  --deterministic        CUDA: bit-reproducible steps (attention through Deepwell's\n"
        "                         tensor-core kernels instead of cuDNN, whose backward is not\n"
        "                         reproducible; about 2x slower attention). The CPU always is\n"
        "  --zero S               several ranks: ZeRO stage 0 (gradients all-reduced), 1 (optimizer\n"
        "                         state sharded: each rank holds its shard's moments, reduces its\n"
        "                         shard, runs AdamW on it, all-gathers the weights), 2 (gradients\n"
        "                         sharded too, staged through buckets reduced as backward finishes\n"
        "                         them: DW_DP_BUCKET_FLOATS) or 3 (FSDP: weights sharded, each\n"
        "                         gathered before its use; not quantised programs) (0). Each rank\n"
        "                         allocates only its shards from the start. Started by\n"
        "                         mpirun, torchrun, srun or `deepwell launch -n N\n"
        "                         -- train ...`, each rank trains --batch sequences per micro-batch\n"
        "                         and --global-batch counts all ranks' (default: B x ranks); rank 0\n"
        "                         prints and writes (docs/multi-gpu.md)\n"
        "  --max-skips N          a step whose loss or gradients are not finite is skipped (weights\n"
        "                         and optimizer state untouched, logged, \"skipped\" in metrics.jsonl);\n"
        "                         N in a row stop the run with a checkpoint of the last good state\n"
        "                         (10; 0: stop at the first)\n"
        "  --quant-check-every K  every K steps, each quantised GEMM input's relative error,\n"
        "                         overflow and underflow into DIR/quant_stats.jsonl (100; 0: off)\n"
        "  --quant-check-elements N  a tensor of more elements is checked on a sample of whole\n"
        "                         quantisation block rows (evenly spread, its amax's included)\n"
        "                         (65536; 0: whole tensors)\n"
        "  --quant-fallback-after M  a layer over its threshold (policy \"max_rel_error\", default\n"
        "                         0.1 FP8, 0.25 FP4) in M checks in a row runs in BF16 for the rest\n"
        "                         of the run, kept on resume (DIR/precision_decisions.jsonl) (3; 0:\n"
        "                         statistics only; docs/precision.md, Guardrails)\n"
        "  --quant-overflow-max F  a layer whose overflow (saturated) fraction of x, w or dy, counted\n"
        "                         by the quantisers every step, is over F in N steps in a row runs in\n"
        "                         BF16 for the rest of the run, recorded and kept as above (0.001 =\n"
        "                         0.1%%; off: no rule)\n"
        "  --quant-underflow-max F  the same for the underflow (flushed to zero) fraction (off)\n"
        "  --quant-counts-after N  the steps in a row of those two rules (3; 0: off)\n"
        );
    printf( /* (split: C99 compilers need only support 4095 characters in one string) */
        "  --spike-zscore Z       loss-spike rollback (off): once the window of the last W steps'\n"
        "                         losses is full, a step whose loss is more than Z standard\n"
        "                         deviations above its mean restores the newest checkpoint of this\n"
        "                         run and skips that batch (logged; \"rollback\" in metrics.jsonl)\n"
        "  --spike-window W       the window of losses, >= 2 (50)\n"
        "  --max-rollbacks N      the spike after N rollbacks stops the run with an error (3)\n"
        "  --fp8-amax-history N   fp8_tensor layers: delayed scaling, each operand's scale from the\n"
        "                         largest of its last N steps' amaxes, kept in checkpoints (0: off,\n"
        "                         each tensor's own amax; the block recipes always scale per block)\n"
        "  --ep K                 several ranks: expert parallelism, groups of K consecutive ranks,\n"
        "                         each running E/K of every MoE layer's experts; rows go to their\n"
        "                         experts' ranks and back by all-to-all (1: off; K divides the\n"
        "                         ranks and the experts; docs/multi-gpu.md)\n"
        "  --no-overlap           several ranks: reduce the gradients after backward instead of each\n"
        "                         bucket as soon as backward has finished it (the same results)\n"
        "  --recompute R          none, selective, full or N: full (or N) — every block (or the\n"
        "                         first N) keeps only its input and runs its forward again before\n"
        "                         its backward (their activations share one block's memory, for up\n"
        "                         to a third more compute); selective — the norms that feed linear\n"
        "                         layers and the MLP activations run again instead of being kept\n"
        "                         (no GEMM or attention twice); the same values bit for bit (none)\n"
        "  --no-fused-head        keep the LM head and the loss apart: by default they run as one op\n"
        "                         over chunks of rows, so the B x T x vocabulary logits never exist\n"
        "                         (the same values on the CPU; docs/perf.md). --sample-every needs\n"
        "                         the logits and turns it off\n"
        "  --no-grad-arena        keep the FP32 gradients and the BF16 weight copies in standing\n"
        "                         pools: by default a run of one micro-batch per step (no\n"
        "                         accumulation) under ZeRO 0 or 1 keeps them in the activation\n"
        "                         arena, each live only while needed, for less memory and the\n"
        "                         same values bit for bit (docs/performance.md); DW_GRAD_ARENA=0\n"
        "                         or DW_BF16_ARENA=0 turns one off\n"
        "  --profile              after the last step, time 3 eager steps of the last micro-batch\n"
        "                         step by step (CUDA events on a GPU, the host clock on the CPU);\n"
        "                         print the largest rows per op kind and per node role (forward\n"
        "                         and backward apart) and write them all to DIR/profile.json\n"
        "  --moe-drop POLICY      a mixture of experts with a capacity (config.json\n"
        "                         capacity_factor): an expert over it drops its last assignments\n"
        "                         in token order (position) or its lightest by router weight\n"
        "                         (probs); default the config's moe_token_drop_policy, else\n"
        "                         position. The checkpoint's config.json records it\n");
    printf( /* a second literal: ISO C promises 4095 characters in one */
        "  --moe-bias-update G    a mixture of experts: auxiliary-loss-free load balancing\n"
        "                         (DeepSeek-V3) — each router chooses its top k by score + a\n"
        "                         per-expert bias b (the weights stay the scores), and after every\n"
        "                         step b += G x sign(mean load - expert's load) over the global\n"
        "                         batch; b is in the checkpoints (state.json moe_bias) and its\n"
        "                         largest |b| in metrics.jsonl (moe_bias_max). G in [0, 1]; 0\n"
        "                         (default): a resumed run's G, else config.json's\n"
        "                         moe_bias_update_speed (0.001 under topk_method \"noaux_tc\"),\n"
        "                         else off (docs/moe.md)\n"
        "  --tokenizer T          the tokenizer.json (or a directory holding one) the data was\n"
        "                         tokenised with; default the model directory's. It is copied into\n"
        "                         DIR and every checkpoint, so that `deepwell sample DIR` decodes\n"
        "                         with it; a run keeps one (another on --resume is refused)\n"
        "  -h, --help             this help\n\n"
        "Ctrl-C (SIGINT), SIGTERM, SIGHUP and SIGUSR1 (Slurm's pre-emption warning) finish the\n"
        "current step, write a checkpoint and exit with status 128 + the signal (130, 143, 129,\n"
        "138); a second signal aborts at once (the last complete checkpoint stays valid).\n");
}

/* The signal that asked training to stop (0: none). SIGINT (Ctrl-C), SIGTERM (Slurm, Kubernetes,
 * systemd, docker stop), SIGHUP (the terminal went away) and SIGUSR1 (Slurm's pre-emption
 * warning) all finish the step, checkpoint and exit 128 + the signal; a second one aborts. */
static volatile sig_atomic_t interrupted;
static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};

static void say(const char *msg, size_t n) { /* async-signal-safe */
    ssize_t w = write(STDERR_FILENO, msg, n);
    (void)w;
}

static void on_stop_signal(int sig) {
    if (interrupted) { /* a second signal: die now; checkpoints are written atomically */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    interrupted = sig;
    dw_train_request_stop();
    static const char head[] = "\ndeepwell train: ", tail[] = ": interrupted: finishing this step and writing a "
                                                             "checkpoint (a second signal aborts)\n";
    const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "SIGUSR1";
    say(head, sizeof head - 1);
    say(name, strlen(name));
    say(tail, sizeof tail - 1);
}

typedef struct {
    bool tty;
    int64_t log_every;
    bool open_line; /* a \r progress line is on the terminal */
    const run_record *rec; /* a resumed run's record, summarised before its first step, then NULL */
    const bool *given;
    const dw_train_opts *opts;
    const char *device;
    bool sampling_kept; /* OUT/sampling.json written (at the first step, the run lock held) */
} printer;

/* What a resumed run continues with, once dw_train accepted it (before its first step). */
static void resume_summary(printer *pr) {
    if (!pr->rec) return;
    train_resume_print(CMD, pr->rec, pr->given, pr->opts, pr->device);
    pr->rec = NULL;
}

static void fmt_time(char *b, size_t n, double s) {
    if (!isfinite(s) || s < 0) snprintf(b, n, "?");
    else if (s < 60) snprintf(b, n, "%.0fs", s);
    else if (s < 3600) snprintf(b, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(b, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

/* The sampling options into OUT/sampling.json, for --resume (state.json has no place for them);
 * a failure is a warning: the run goes on, and a resume would take sampling from its command line. */
static void keep_sampling(printer *pr) {
    if (pr->sampling_kept) return;
    pr->sampling_kept = true;
    const dw_train_opts *o = pr->opts;
    char err[4200];
    if (!run_record_write_sampling(o->out_dir, o->sample_every, o->sample_tokens, o->sample_temperature,
                                   o->sample_prompt, err, sizeof err))
        fprintf(stderr, "deepwell %s: warning: %s (a resume will take the sampling flags from its command line)\n",
                CMD, err);
}

static void on_progress(const dw_train_progress *p, void *user) {
    printer *pr = user;
    resume_summary(pr);
    keep_sampling(pr);
    char eta[32], val[48] = "", moe[128] = "";
    fmt_time(eta, sizeof eta, p->eta_s);
    if (!isnan(p->val_loss)) snprintf(val, sizeof val, " | val %.4f", p->val_loss);
    if (!isnan(p->expert_load)) { /* a mixture of experts with router losses */
        int k = 0;
        if (!isnan(p->moe_aux_loss)) k += snprintf(moe + k, sizeof moe - (size_t)k, " | aux %.4f", p->moe_aux_loss);
        if (!isnan(p->moe_z_loss)) k += snprintf(moe + k, sizeof moe - (size_t)k, " | z %.4f", p->moe_z_loss);
        snprintf(moe + k, sizeof moe - (size_t)k, " | load %.2f", p->expert_load);
    }
    if (p->moe_dropped > 0) /* assignments past the experts' capacity, this step */
        snprintf(moe + strlen(moe), sizeof moe - strlen(moe), " | dropped %.0f (%.1f%%)", p->moe_dropped,
                 100 * p->moe_dropped_frac);
    bool event = !isnan(p->val_loss) || p->sample || p->checkpoint || p->step == p->total || p->skipped ||
                 p->precision_change;
    if (p->skipped) snprintf(val, sizeof val, " | SKIPPED: %s", p->skipped);
    if (pr->tty || event || p->step % pr->log_every == 0 || p->step == 1) {
        fprintf(stderr, "%sstep %lld/%lld | loss %.4f%s%s | lr %.2e | gnorm %.3f | %.0f tok/s | ETA %s%s",
                pr->tty ? "\r\033[K" : "", (long long)p->step, (long long)p->total, p->loss, val, moe, p->lr,
                p->grad_norm, p->tokens_per_s, eta, pr->tty && !event ? "" : "\n");
        pr->open_line = pr->tty && !event;
    }
    if (p->precision_change) fprintf(stderr, "precision: to bf16 after step %lld: %s\n", (long long)p->step, p->precision_change);
    if (p->checkpoint) fprintf(stderr, "checkpoint: %s\n", p->checkpoint);
    if (p->sample) {
        fflush(stderr);
        printf("--- sample after step %lld ---\n%s\n---\n", (long long)p->step, p->sample);
        fflush(stdout);
    }
}

/* --profile: the table the trainer wrote to DIR/profile.json, largest rows first. */
static int print_profile(dw_ctx *ctx, const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/profile.json", dir); /* where the trainer wrote it */
    dw_profile *p = NULL;
    dw_status st = dw_profile_load(ctx, path, &p);
    if (st != DW_OK) return cli_fail(CMD, ctx, st);
    char *text = dw_profile_text(p, 15);
    if (text) printf("%s(all rows: %s)\n", text, path);
    dw_free_string(text);
    dw_profile_free(p);
    return text ? DW_EXIT_OK : DW_EXIT_FAIL;
}

static int train_run(dw_train_opts *po, const run_record *rec, const bool *given, const char *model,
                     const train_init *init, const char *device, const char *precision, const char *policy_path,
                     const char *fallback, long log_every);

static int unreadable_record(const char *run, const char *err);

int cmd_train(int argc, char **argv) {
    static const struct option longopts[] = {
        {"model", required_argument, 0, O_MODEL}, {"data", required_argument, 0, O_DATA},
        {"moe-bias-update", required_argument, 0, O_MOE_BIAS},
        {"val", required_argument, 0, O_VAL}, {"out", required_argument, 0, O_OUT},
        {"resume", required_argument, 0, O_RESUME}, {"steps", required_argument, 0, O_STEPS},
        {"batch", required_argument, 0, O_BATCH}, {"seq", required_argument, 0, O_SEQ},
        {"global-batch", required_argument, 0, O_GB}, {"lr", required_argument, 0, O_LR},
        {"min-lr", required_argument, 0, O_MINLR}, {"warmup", required_argument, 0, O_WARMUP},
        {"schedule", required_argument, 0, O_SCHED}, {"weight-decay", required_argument, 0, O_WD},
        {"clip", required_argument, 0, O_CLIP}, {"beta1", required_argument, 0, O_B1},
        {"beta2", required_argument, 0, O_B2}, {"eval-every", required_argument, 0, O_EVAL},
        {"eval-batches", required_argument, 0, O_EVALB}, {"sample-every", required_argument, 0, O_SAMPLE},
        {"sample-tokens", required_argument, 0, O_SAMPLEN}, {"sample-temp", required_argument, 0, O_SAMPLET},
        {"sample-prompt", required_argument, 0, O_PROMPT}, {"ckpt-every", required_argument, 0, O_CKPT},
        {"keep", required_argument, 0, O_KEEP}, {"device", required_argument, 0, O_DEVICE},
        {"seed", required_argument, 0, O_SEED}, {"log-every", required_argument, 0, O_LOGEVERY},
        {"precision", required_argument, 0, O_PRECISION}, {"policy", required_argument, 0, O_POLICY},
        {"fallback", required_argument, 0, O_FALLBACK}, {"profile", no_argument, 0, O_PROFILE},
        {"deterministic", no_argument, 0, O_DETERMINISTIC}, {"ckpt-minutes", required_argument, 0, O_CKPTMIN},
        {"zero", required_argument, 0, O_ZERO}, {"init", required_argument, 0, O_INIT},
        {"init-from", required_argument, 0, O_INIT_FROM}, {"max-skips", required_argument, 0, O_MAX_SKIPS},
        {"quant-check-every", required_argument, 0, O_QCHECK},
        {"quant-check-elements", required_argument, 0, O_QCHECK_ELEMS},
        {"quant-fallback-after", required_argument, 0, O_QFALLBACK}, {"ep", required_argument, 0, O_EP},
        {"quant-overflow-max", required_argument, 0, O_QOVER_MAX},
        {"quant-underflow-max", required_argument, 0, O_QUNDER_MAX},
        {"quant-counts-after", required_argument, 0, O_QCOUNTS_AFTER},
        {"no-overlap", no_argument, 0, O_NO_OVERLAP},
        {"recompute", required_argument, 0, O_RECOMPUTE}, {"help", no_argument, 0, 'h'},
        {"spike-zscore", required_argument, 0, O_SPIKE_Z}, {"spike-window", required_argument, 0, O_SPIKE_W},
        {"max-rollbacks", required_argument, 0, O_MAX_ROLLBACKS}, {"fp8-amax-history", required_argument, 0, O_AMAX_HIST},
        {"no-fused-head", no_argument, 0, O_NO_FUSED_HEAD}, {"tokenizer", required_argument, 0, O_TOKENIZER},
        {"no-grad-arena", no_argument, 0, O_NO_GRAD_ARENA},
        {"moe-drop", required_argument, 0, O_MOE_DROP}, {0, 0, 0, 0}};
    static char rank_cmd[48];
    if (dw_dist_env_get(&dist) != DW_OK) {
        cli_error(CMD, "%s", dw_errmsg(NULL));
        return DW_EXIT_USAGE;
    }
    if (dist.world_size > 1) { /* every message of this rank names it */
        snprintf(rank_cmd, sizeof rank_cmd, "train (rank %d/%d)", dist.rank, dist.world_size);
        CMD = rank_cmd;
    }
    dw_train_opts o;
    dw_train_opts_init(&o, sizeof o);
    const char *device = "auto", *precision = NULL, *policy_path = NULL, *fallback = NULL, *model = NULL;
    train_init init = {.random = false, .from = NULL};
    long v = 0, log_every = 1;
    int spike_flags = 0; /* 1: --spike-zscore, 2: its other flags */
    bool given[O_LAST - O_FIRST] = {false};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        bool ok = true;
        if (c >= O_FIRST && c < O_LAST) given[c - O_FIRST] = true;
        switch (c) {
        case 'h': help(); return DW_EXIT_OK;
        case O_MODEL: model = optarg; break;
        case O_DATA: o.data = optarg; break;
        case O_VAL: o.val = optarg; break;
        case O_OUT: o.out_dir = optarg; break;
        case O_RESUME: o.resume = optarg; break;
        case O_DEVICE: device = optarg; break;
        case O_PRECISION: precision = optarg; break;
        case O_PROFILE: o.profile = true; break;
        case O_DETERMINISTIC: o.deterministic = true; break;
        case O_POLICY: policy_path = optarg; break;
        case O_FALLBACK: fallback = optarg; break;
        case O_INIT:
            ok = !strcmp(optarg, "auto") || !strcmp(optarg, "random");
            if (!ok) cli_error(CMD, "--init must be auto or random, got '%s'", optarg);
            init.random = ok && !strcmp(optarg, "random");
            break;
        case O_INIT_FROM: init.from = optarg; break;
        case O_MOE_DROP:
            ok = !strcmp(optarg, "probs") || !strcmp(optarg, "position");
            if (!ok) cli_error(CMD, "--moe-drop must be probs or position, got '%s'", optarg);
            init.moe_drop = !strcmp(optarg, "probs") ? DW_MOE_DROP_PROBS : DW_MOE_DROP_POSITION;
            break;
        case O_RECOMPUTE: ok = cli_parse_recompute(CMD, optarg, &recompute, &recompute_blocks); break;
        case O_NO_FUSED_HEAD: fused_head = false; break;
        case O_NO_GRAD_ARENA: grad_arena = false; break;
        case O_TOKENIZER: tokenizer = optarg; break;
        case O_PROMPT: o.sample_prompt = optarg; break;
        case O_SCHED: {
            static const char *names[] = {"cosine", "linear", "constant"};
            ok = false;
            for (int i = 0; i < 3; i++)
                if (!strcmp(optarg, names[i])) o.schedule = (dw_lr_schedule)i, ok = true;
            if (!ok) cli_error(CMD, "--schedule must be cosine, linear or constant, got '%s'", optarg);
            break;
        }
        case O_STEPS: ok = cli_parse_int(CMD, "--steps", optarg, 1, 1L << 40, &v); o.steps = v; break;
        case O_BATCH: ok = cli_parse_int(CMD, "--batch", optarg, 1, 1 << 20, &v); o.batch = v; break;
        case O_SEQ: ok = cli_parse_int(CMD, "--seq", optarg, 1, 1 << 24, &v); o.seq = v; break;
        case O_GB: ok = cli_parse_int(CMD, "--global-batch", optarg, 1, 1 << 24, &v); o.global_batch = v; break;
        case O_WARMUP: ok = cli_parse_int(CMD, "--warmup", optarg, 0, 1L << 40, &v); o.warmup = v; break;
        case O_EVAL: ok = cli_parse_int(CMD, "--eval-every", optarg, 0, 1L << 40, &v); o.eval_every = v; break;
        case O_EVALB: ok = cli_parse_int(CMD, "--eval-batches", optarg, 1, 1 << 20, &v); o.eval_batches = v; break;
        case O_SAMPLE: ok = cli_parse_int(CMD, "--sample-every", optarg, 0, 1L << 40, &v); o.sample_every = v; break;
        case O_SAMPLEN: ok = cli_parse_int(CMD, "--sample-tokens", optarg, 0, 1 << 20, &v); o.sample_tokens = v; break;
        case O_CKPT: ok = cli_parse_int(CMD, "--ckpt-every", optarg, 0, 1L << 40, &v); o.ckpt_every = v; break;
        case O_CKPTMIN:
            ok = cli_parse_double(CMD, "--ckpt-minutes", optarg, &o.ckpt_minutes);
            if (ok && !(o.ckpt_minutes >= 0 && o.ckpt_minutes <= 1e7)) {
                cli_error(CMD, "--ckpt-minutes must be in [0, 1e7] (0: by steps only), got %s", optarg);
                ok = false;
            }
            break;
        case O_KEEP: ok = cli_parse_int(CMD, "--keep", optarg, 0, 1 << 20, &v); o.keep = (int)v; break;
        case O_ZERO: ok = cli_parse_int(CMD, "--zero", optarg, 0, 3, &v); o.zero = (int)v; break;
        case O_EP: ok = cli_parse_int(CMD, "--ep", optarg, 1, 1 << 20, &v); o.ep = (int)v; break;
        case O_NO_OVERLAP: o.no_overlap = true; break;
        case O_MAX_SKIPS: ok = cli_parse_int(CMD, "--max-skips", optarg, 0, 1L << 40, &v); o.max_skips = v; break;
        case O_QCHECK:
            ok = cli_parse_int(CMD, "--quant-check-every", optarg, 0, 1L << 40, &v);
            o.quant_check_every = v;
            break;
        case O_QCHECK_ELEMS:
            ok = cli_parse_int(CMD, "--quant-check-elements", optarg, 0, 1L << 50, &v);
            o.quant_check_elements = v;
            break;
        case O_QFALLBACK:
            ok = cli_parse_int(CMD, "--quant-fallback-after", optarg, 0, 1L << 40, &v);
            o.quant_fallback_after = v;
            break;
        case O_QOVER_MAX:
        case O_QUNDER_MAX: { /* a fraction, or "off" */
            const char *flag = c == O_QOVER_MAX ? "--quant-overflow-max" : "--quant-underflow-max";
            double *f = c == O_QOVER_MAX ? &o.quant_overflow_max : &o.quant_underflow_max;
            if (!strcmp(optarg, "off")) {
                *f = -1;
            } else if ((ok = cli_parse_double(CMD, flag, optarg, f)) && !(*f >= 0 && *f <= 1)) {
                cli_error(CMD, "%s must be a fraction in [0, 1] (0.001 = 0.1%%) or \"off\", got %s", flag, optarg);
                ok = false;
            }
            break;
        }
        case O_QCOUNTS_AFTER:
            ok = cli_parse_int(CMD, "--quant-counts-after", optarg, 0, 1L << 40, &v);
            o.quant_counts_after = v;
            break;
        case O_SPIKE_Z:
            ok = cli_parse_double(CMD, "--spike-zscore", optarg, &o.spike_zscore);
            if (ok && !(o.spike_zscore > 0 && o.spike_zscore < 1e300)) {
                cli_error(CMD, "--spike-zscore must be a number > 0 (standard deviations above the window's mean), "
                          "got %s", optarg);
                ok = false;
            }
            spike_flags |= 1;
            break;
        case O_SPIKE_W:
            ok = cli_parse_int(CMD, "--spike-window", optarg, 2, 1L << 30, &v);
            o.spike_window = v;
            spike_flags |= 2;
            break;
        case O_MAX_ROLLBACKS:
            ok = cli_parse_int(CMD, "--max-rollbacks", optarg, 0, 1L << 40, &v);
            o.max_rollbacks = v;
            spike_flags |= 2;
            break;
        case O_AMAX_HIST:
            ok = cli_parse_int(CMD, "--fp8-amax-history", optarg, 0, 1 << 20, &v);
            o.fp8_amax_history = v;
            break;
        case O_LOGEVERY: ok = cli_parse_int(CMD, "--log-every", optarg, 1, 1L << 40, &log_every); break;
        case O_SEED: ok = cli_parse_int(CMD, "--seed", optarg, 0, 0x7fffffffffffffffL, &v); o.seed = (uint64_t)v; break;
        case O_LR: ok = cli_parse_double(CMD, "--lr", optarg, &o.lr); break;
        case O_MOE_BIAS:
            ok = cli_parse_double(CMD, "--moe-bias-update", optarg, &o.moe_bias_update);
            if (ok && !(isfinite(o.moe_bias_update) && o.moe_bias_update >= 0 && o.moe_bias_update <= 1)) {
                cli_error(CMD, "--moe-bias-update must be a finite number in [0, 1] (the bias update speed; 0: the "
                          "model's), got %s", optarg);
                ok = false;
            }
            break;
        case O_MINLR: ok = cli_parse_double(CMD, "--min-lr", optarg, &o.min_lr); break;
        case O_WD: ok = cli_parse_double(CMD, "--weight-decay", optarg, &o.weight_decay); break;
        case O_CLIP: ok = cli_parse_double(CMD, "--clip", optarg, &o.clip); break;
        case O_B1: ok = cli_parse_double(CMD, "--beta1", optarg, &o.beta1); break;
        case O_B2: ok = cli_parse_double(CMD, "--beta2", optarg, &o.beta2); break;
        case O_SAMPLET:
            ok = cli_parse_double(CMD, "--sample-temp", optarg, &o.sample_temperature);
            if (ok && o.sample_temperature < 0) {
                cli_error(CMD, "--sample-temp must be >= 0 (0 = greedy), got %s", optarg);
                ok = false;
            }
            break;
        default: return cli_usage_error(CMD);
        }
        if (!ok) return cli_usage_error(CMD);
    }
    if (spike_flags == 2) {
        cli_error(CMD, "--spike-window and --max-rollbacks need --spike-zscore Z (the rollback is off without it)");
        return cli_usage_error(CMD);
    }
    if (optind < argc) {
        cli_error(CMD, "unexpected argument '%s'", argv[optind]);
        return cli_usage_error(CMD);
    }
    run_record rec = {0};
    char err[2048];
    if (o.resume && !run_record_read(o.resume, &rec, err, sizeof err)) return unreadable_record(o.resume, err);
    int rc = train_run(&o, &rec, given, model, &init, device, precision, policy_path, fallback, log_every);
    run_record_free(&rec);
    return rc;
}

/* After the flags (and the record of a resumed run) are read: checks, the model, training. */
/* The record of --resume RUN could not be read: the library's diagnosis when it has one (it names
 * the newest good checkpoint of a run whose `latest` is damaged), else the reader's. */
static int unreadable_record(const char *run, const char *err) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.weights = DW_WEIGHTS_NONE;
    dw_model *m = NULL;
    dw_status st = dw_ctx_create(&co, &ctx);
    if (st == DW_OK) st = dw_model_open(ctx, run, &mo, &m);
    int rc = st != DW_OK && ctx ? cli_fail(CMD, ctx, st) : (cli_error(CMD, "%s", err), DW_EXIT_USAGE);
    dw_model_free(m);
    dw_ctx_free(ctx);
    return rc;
}

/* What the run starts from, said once before the first step (rank 0 of several). */
static void print_weights(const dw_model *m, const train_init *init, uint64_t seed) {
    if (dist.rank != 0) return;
    if (dw_model_weights_source(m))
        fprintf(stderr, "deepwell %s: weights from %s%s\n", CMD, dw_model_weights_source(m),
                init->from ? " (--init-from)" : "");
    else
        fprintf(stderr, "deepwell %s: weights initialised from seed %llu%s\n", CMD, (unsigned long long)seed,
                init->random ? " (--init random)" : "");
}

/* The run's tokenizer into DIR (rank 0): --tokenizer, checked to read and to fit the model's
 * vocabulary (one of a kind the library cannot decode is recorded with a warning: Python's
 * `tokenizers` can), else the model directory's or checkpoint's own tokenizer.json as it is. An
 * exit code. */
static int record_tokenizer(dw_ctx *ctx, const dw_model *m, const char *out_dir) {
    const char *own = dw_model_tokenizer(m), *t = tokenizer;
    if (dist.rank != 0 || (!t && (!strcmp(own, "bytes") || !strcmp(own, "ids")))) return DW_EXIT_OK;
    if (t) {
        dw_hf_tokenizer *hf = NULL;
        dw_status st = dw_hf_tokenizer_open(ctx, t, &hf);
        const int64_t v = hf ? dw_hf_tokenizer_vocab(hf) : 0, mv = dw_graph_vocab(dw_model_graph(m));
        dw_hf_tokenizer_free(hf);
        if (st == DW_ERR_UNSUPPORTED)
            fprintf(stderr, "deepwell %s: warning: %s; recorded all the same (python -m deepwell.sample decodes it)\n",
                    CMD, dw_errmsg(ctx));
        else if (st != DW_OK)
            return cli_fail(CMD, ctx, st);
        if (v > mv) {
            cli_error(CMD, "--tokenizer %s: its ids reach %lld, beyond the model's vocabulary of %lld", t, (long long)v,
                      (long long)mv);
            return DW_EXIT_USAGE;
        }
    }
    dw_status st = dw_run_set_tokenizer(ctx, out_dir, t ? t : own);
    return st == DW_OK ? DW_EXIT_OK : cli_fail(CMD, ctx, st);
}

static int train_run(dw_train_opts *po, const run_record *rec, const bool *given, const char *model,
                     const train_init *init, const char *device, const char *precision, const char *policy_path,
                     const char *fallback, long log_every) {
    dw_train_opts o = *po;
    if (o.resume && (init->random || init->from)) {
        cli_error(CMD, "--init and --init-from start a new run; a resumed run takes its weights from its "
                  "checkpoint (%s)", o.resume);
        return cli_usage_error(CMD);
    }
    if (init->random && init->from) {
        cli_error(CMD, "--init random and --init-from %s contradict each other; give one", init->from);
        return cli_usage_error(CMD);
    }
    if (o.resume && !train_resume_merge(CMD, rec, given, &o, &device)) return DW_EXIT_USAGE;
    if (!o.resume && !given[O_GB - O_FIRST]) o.global_batch = o.batch * dist.world_size;
    if ((!model && !o.resume) || !o.data || !o.out_dir) {
        cli_error(CMD, "--model, --data and --out are required (or --resume RUN alone)");
        return cli_usage_error(CMD);
    }
    if (policy_path && (precision || fallback)) {
        cli_error(CMD, "--policy FILE replaces --precision and --fallback; give one or the other");
        return cli_usage_error(CMD);
    }
    if (fallback && strcmp(fallback, "safe") && strcmp(fallback, "head") && strcmp(fallback, "none")) {
        cli_error(CMD, "--fallback must be 'safe', 'head' or 'none', not '%s'", fallback);
        return cli_usage_error(CMD);
    }
    if (given[O_MINLR - O_FIRST] && o.min_lr > o.lr) {
        cli_error(CMD, "--min-lr %g is above --lr %g: the schedule would rise; give --min-lr at most --lr", o.min_lr,
                  o.lr);
        return cli_usage_error(CMD);
    }
    if (!o.resume && o.min_lr > o.lr) o.min_lr = o.lr; /* a small --lr alone lowers the floor with it */
    dw_ctx *ctx = NULL;
    dw_status st = cli_ctx_create(CMD, device, &ctx);
    if (st != DW_OK) return cli_exit_for(st);
    dw_policy *pol = NULL;
    if (policy_path || precision || fallback) {
        st = policy_path ? dw_policy_load(ctx, policy_path, &pol)
                         : dw_policy_from_precision(ctx, precision ? precision : "bf16",
                                                    fallback && !strcmp(fallback, "safe"), &pol);
        if (st == DW_OK && fallback && !policy_path) st = dw_policy_set_fallback(ctx, pol, fallback);
        if (st != DW_OK) {
            int rc = cli_fail(CMD, ctx, st);
            dw_ctx_free(ctx);
            return rc;
        }
    }
    char flags[4200];
    snprintf(flags, sizeof flags, "%s%s%s%s%s%s", policy_path ? "--policy " : "", policy_path ? policy_path : "",
             precision ? "--precision " : "", precision ? precision : "", fallback ? " --fallback " : "",
             fallback ? fallback : "");
    if (o.resume && !train_resume_policy(CMD, ctx, rec, given, flags, &pol)) {
        dw_policy_free(pol);
        dw_ctx_free(ctx);
        return DW_EXIT_USAGE;
    }
    /* the model from the checkpoint being resumed (its weights loaded by dw_train), else MODEL
     * with its own weights, those of --init-from, or weights from the seed */
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = o.batch, mo.seq = o.seq, mo.policy = pol, mo.seed = o.seed;
    mo.weights = o.resume ? DW_WEIGHTS_NONE : init->random ? DW_WEIGHTS_RANDOM : DW_WEIGHTS_AUTO;
    mo.weights_from = o.resume ? NULL : init->from;
    mo.moe_drop = init->moe_drop;
    mo.recompute = recompute, mo.recompute_blocks = recompute_blocks;
    mo.fused_head = fused_head && o.sample_every == 0; /* samples read the logits */
    mo.zero = o.zero; /* the engine allocates the rank's ZeRO shards from the start */
    /* the arenas: one micro-batch a step on each rank (accumulation adds into standing gradients) */
    mo.grad_arena = grad_arena && o.global_batch == o.batch * dist.world_size;
    dw_model *m = NULL;
    st = dw_model_open(ctx, o.resume ? o.resume : model, &mo, &m);
    if (st != DW_OK) {
        int rc = cli_fail(CMD, ctx, st);
        dw_policy_free(pol);
        dw_ctx_free(ctx);
        return rc;
    }
    if (!o.resume) print_weights(m, init, o.seed);
    int trc = record_tokenizer(ctx, m, o.out_dir);
    if (trc != DW_EXIT_OK) {
        int rc = trc;
        dw_model_free(m);
        dw_policy_free(pol);
        dw_ctx_free(ctx);
        return rc;
    }
    printer pr = {.tty = isatty(STDERR_FILENO) == 1, .log_every = log_every, .rec = o.resume ? rec : NULL,
                  .given = given, .opts = &o, .device = dw_ctx_device(ctx) == DW_DEVICE_CUDA ? "cuda" : "cpu"};
    o.progress = on_progress;
    o.progress_user = &pr;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t k = 0; k < sizeof stop_signals / sizeof stop_signals[0]; k++) sigaction(stop_signals[k], &sa, NULL);
    st = dw_train(dw_model_engine(m), &o);
    dw_dist_shutdown(st == DW_OK); /* a failed rank leaves at once: the launcher stops the others */
    for (size_t k = 0; k < sizeof stop_signals / sizeof stop_signals[0]; k++) signal(stop_signals[k], SIG_DFL);
    if (st == DW_OK) resume_summary(&pr); /* no step ran: it was there already */
    if (pr.open_line) fputc('\n', stderr);
    int rc = st == DW_OK ? DW_EXIT_OK : cli_fail(CMD, ctx, st);
    if (rc == DW_EXIT_OK && o.profile && !interrupted) rc = print_profile(ctx, o.out_dir);
    dw_model_free(m);
    dw_policy_free(pol);
    dw_ctx_free(ctx);
    if (rc == DW_EXIT_OK && interrupted) return 128 + interrupted;
    return rc;
}
