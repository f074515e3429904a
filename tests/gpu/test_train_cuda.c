/* test_train_cuda.c — dw_train on the CUDA engine (the trainer's one code path with the device's
 * AdamW): (a) 50 BF16 steps of gpt2-tiny on the GPU follow the CPU engine's losses; (b) fp8_block,
 * mxfp8 (quantised operands; MXFP8 through the exact BF16-dequantisation GEMM on Hopper) and nvfp4
 * trained N steps against BF16 on the built-in data; (c) a GPU checkpoint resumes on the GPU and on
 * the CPU, a CPU checkpoint on the GPU, with the losses continuing; state.json names the policy
 * and every linear node's recipe; (d) BF16 training with cuDNN's attention (the default) learns
 * what it learns with the mma kernels; (e) --deterministic runs repeat bit for bit. (a) and (c)
 * pin the deterministic mma kernels. Needs a GPU.
 * Prints every number it checks.
 *
 * Tolerances.
 *   (a) per step |loss_gpu - loss_cpu| <= 3e-2 * loss_cpu: BF16 activations and GEMM operands
 *       (2^-9 relative per rounding, loss ~6e-5 relative after one step in test_engine_cuda) and
 *       the divergence of two trajectories that differ by rounding, through 50 AdamW steps at a
 *       peak learning rate where that divergence stays small (LR_FOLLOW).
 *   (b) mean loss of the last 20 of N steps within 2% of BF16's (the criterion) on
 *       average over 5 seeds, paired (each seed's relative difference; one seed's is a draw from a
 *       spread, see the test), and not identical to BF16's (the quantised path ran). nvfp4:
 *       reported, and only required to train (last-20 mean below 60% of the first step's loss).
 *   (c) GPU -> GPU: every resumed loss within 1e-5 relative of the straight run (the same kernels;
 *       the step right after resume runs eagerly, later ones replay a CUDA graph). GPU -> CPU and
 *       CPU -> GPU: within (a)'s 3e-2 of the straight run on the other device.
 *   (d) mean loss of the last 20 of N steps within 2% between the two attention paths, on
 *       average over (b)'s paired seeds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deepwell.h"
#include "kernels/cuda/attn_packed.h"
#include "runtime/profile.h"
#include "testutil.h"

#define MAXSTEPS 600

static dw_ctx *g_cpu, *g_gpu;
static uint64_t g_seed;

typedef struct {
    double loss[MAXSTEPS + 1]; /* loss[step], 1-based */
    int64_t last;
} trace;

static void on_step(const dw_train_progress *p, void *user) {
    trace *t = user;
    if (p->step <= MAXSTEPS) t->loss[p->step] = p->loss;
    t->last = p->step;
}

static int setup(void **state) {
    (void)state;
    g_seed = dw_test_seed() % 100000;
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

/* Peak learning rates. The per-step comparisons, (a) and (c), run at 1e-3: at 2e-3 the loss of
 * gpt2-tiny on the built-in data falls through a chaotic stretch after the warmup, where the CPU
 * engine against itself with the learning rate changed by 1e-4 (relative) differs by up to 5% in
 * one step (seed 1735, step 18) and 7% in a 5-step mean (seed 12011): no two roundings follow
 * each other there, whatever the engine. At 1e-3 the same perturbation moves single steps by at
 * most 3e-4 and GPU BF16 follows the CPU within 3e-3 per step (steps 1-25) and 2e-2 per 5-step
 * mean (26-50), 12 seeds (bench/RESULTS.md, session 10). The 500-step comparisons keep 2e-3. */
#define LR_FOLLOW 1e-3
#define LR_TRAIN 2e-3

static dw_train_opts opts(const char *out, int64_t steps, int64_t B, int64_t T, double lr, trace *t) {
    dw_train_opts o;
    dw_train_opts_init(&o, sizeof o);
    o.data = "builtin";
    o.out_dir = out;
    o.steps = steps;
    o.batch = o.global_batch = B;
    o.seq = T;
    o.lr = lr;
    o.min_lr = 2e-4;
    o.warmup = 10;
    o.eval_every = 0;
    o.keep = 0;
    o.seed = g_seed;
    o.progress = on_step;
    o.progress_user = t;
    memset(t, 0, sizeof *t);
    return o;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* gpt2-tiny (or the checkpoint o resumes) opened on ctx's device with policy (NULL: FP32 on the
 * CPU, BF16 on CUDA), weights from o's seed, then dw_train. */
static void run(dw_ctx *ctx, const dw_train_opts *o, const dw_policy *policy, const char *what) {
    double t0 = now_s();
    dw_model_opts mo;
    dw_model_opts_init(&mo, sizeof mo);
    mo.batch = o->batch, mo.seq = o->seq, mo.policy = policy, mo.seed = o->seed;
    mo.weights = o->resume ? DW_WEIGHTS_NONE : DW_WEIGHTS_RANDOM;
    dw_model *m = NULL;
    dw_status st = dw_model_open(ctx, o->resume ? o->resume : "gpt2-tiny", &mo, &m);
    if (st == DW_OK) st = dw_train(dw_model_engine(m), o);
    if (st != DW_OK) fail_msg("%s: %s", what, dw_errmsg(ctx));
    dw_model_free(m);
    fprintf(stderr, "  %-44s %6.2f s\n", what, now_s() - t0);
}

static char *sub(const char *dir, const char *name) { return dw_test_path(dir, name); }

/* max over steps lo..hi of |a - b| / b */
static double max_rel(const trace *a, const trace *b, int64_t lo, int64_t hi, int64_t *at) {
    double m = 0.0;
    for (int64_t s = lo; s <= hi; s++) {
        double d = fabs(a->loss[s] - b->loss[s]) / b->loss[s];
        if (!(d <= m)) m = d, *at = s; /* NaN propagates */
    }
    return m;
}

static double tail_mean(const trace *t, int64_t steps, int64_t n) {
    double s = 0.0;
    for (int64_t i = steps - n + 1; i <= steps; i++) s += t->loss[i];
    return s / (double)n;
}

/* (a) BF16 on the GPU against the CPU engine, 50 steps. */
static void test_bf16_follows_cpu(void **state) {
    (void)state;
    dw_cuda_attention_use("mma"); /* the deterministic two-term kernels: the engine against the CPU */
    char *dir = dw_test_tmpdir(), *oc = sub(dir, "cpu"), *og = sub(dir, "gpu");
    static trace tc, tg;
    dw_train_opts o = opts(oc, 50, 4, 64, LR_FOLLOW, &tc);
    run(g_cpu, &o, NULL, "(a) cpu fp32, 50 steps");
    o = opts(og, 50, 4, 64, LR_FOLLOW, &tg);
    run(g_gpu, &o, NULL, "(a) gpu bf16, 50 steps");
    /* BF16 rounding makes the two runs drift apart, and once the loss falls fast (lr at its
     * peak) single steps can differ by more than the drift (one seed: 11% at step 44, yet 3% at
     * step 50). So: every step of the first 25 within 3e-2; after that, means over windows of
     * 5 steps within 5e-2 — a BF16 path with wrong gradients misses both by far. */
    int64_t at = 0;
    double d = max_rel(&tg, &tc, 1, 25, &at);
    double dw = 0.0;
    int64_t wat = 0;
    for (int64_t w = 26; w + 4 <= 50; w += 5) {
        double a = 0.0, b = 0.0;
        for (int64_t i = w; i < w + 5; i++) a += tg.loss[i], b += tc.loss[i];
        double r = fabs(a - b) / b;
        if (!(r <= dw)) dw = r, wat = w; /* NaN propagates */
    }
    fprintf(stderr, "(a) loss cpu %.4f -> %.4f, gpu %.4f -> %.4f; steps 1-25 max relative difference "
            "%.3g (step %lld); 5-step means 26-50 max %.3g (from step %lld)\n",
            tc.loss[1], tc.loss[50], tg.loss[1], tg.loss[50], d, (long long)at, dw, (long long)wat);
    assert_true(tc.loss[50] < 0.7 * tc.loss[1]); /* it trained */
    assert_true(d <= 3e-2);
    assert_true(dw <= 5e-2);
    free(oc), free(og), free(dir);
}

/* (b) quantised recipes against BF16 on the GPU, paired runs on B_SEEDS seeds (weights and data
 * order): the loss after N steps of one seed is one draw from a spread — BF16 against itself with
 * the learning rate changed by 1e-4 (relative) ends up to 0.9% apart over 10 seeds, and mxfp8 on
 * one seed of 10 (19843) 4.5% behind BF16 while the others are within 1.2% (bench/RESULTS.md,
 * session 10) — so the criterion is on the mean over the seeds of each seed's relative
 * difference, and every seed's is printed. */
#define B_SEEDS 5
static void test_quantised_vs_bf16(void **state) {
    (void)state;
    dw_cuda_attention_use("auto"); /* the default path (cuDNN where it runs) for all four */
    const int64_t N = 500, B = 8, T = 64; /* 512 tokens: every GEMM of gpt2-tiny eligible for fp8_block */
    char *dir = dw_test_tmpdir();
    static trace tb[B_SEEDS], tq;
    double ref[B_SEEDS];
    for (int k = 0; k < B_SEEDS; k++) {
        char name[32], what[64];
        snprintf(name, sizeof name, "bf16-%d", k);
        snprintf(what, sizeof what, "(b) gpu bf16, seed %llu", (unsigned long long)(g_seed + k));
        char *ob = sub(dir, name);
        dw_train_opts o = opts(ob, N, B, T, LR_TRAIN, &tb[k]);
        o.seed = g_seed + k;
        run(g_gpu, &o, NULL, what);
        ref[k] = tail_mean(&tb[k], N, 20);
        fprintf(stderr, "(b) bf16 seed %llu: loss %.4f -> last-20 mean %.4f after %lld steps\n",
                (unsigned long long)o.seed, tb[k].loss[1], ref[k], (long long)N);
        free(ob);
    }
    const char *recipes[] = {"fp8_block", "mxfp8", "nvfp4"};
    for (int r = 0; r < 3; r++) {
        dw_policy *p = NULL;
        assert_int_equal(dw_policy_from_precision(g_gpu, recipes[r], false, &p), DW_OK);
        double mean = 0.0;
        for (int k = 0; k < B_SEEDS; k++) {
            char name[64], what[64];
            snprintf(name, sizeof name, "%s-%d", recipes[r], k);
            snprintf(what, sizeof what, "(b) gpu %s, seed %llu", recipes[r], (unsigned long long)(g_seed + k));
            char *oq = sub(dir, name);
            dw_train_opts o = opts(oq, N, B, T, LR_TRAIN, &tq);
            o.seed = g_seed + k;
            run(g_gpu, &o, p, what);
            const double q = tail_mean(&tq, N, 20), d = (q - ref[k]) / ref[k];
            mean += d / B_SEEDS;
            int differ = 0;
            for (int64_t s = 1; s <= N; s++) differ += tq.loss[s] != tb[k].loss[s];
            fprintf(stderr, "(b) %s seed %llu: loss %.4f -> last-20 mean %.4f, %+.2f%% vs bf16; %d of %lld step losses "
                    "differ from bf16\n", recipes[r], (unsigned long long)o.seed, tq.loss[1], q, 100.0 * d, differ,
                    (long long)N);
            assert_true(differ > N / 2); /* the quantised path ran */
            if (r == 2) assert_true(q < 0.6 * tq.loss[1]);
            free(oq);
        }
        fprintf(stderr, "(b) %s: mean over %d seeds %+.2f%% vs bf16\n", recipes[r], B_SEEDS, 100.0 * mean);
        if (r < 2) assert_true(fabs(mean) <= 0.02);
        dw_policy_free(p);
    }
    free(dir);
}

/* (d) the attention path does not change what BF16 training learns: cuDNN's fused attention
 * (P and dS in one BF16 term, as torch SDPA; the default) against the two-term mma kernels over N
 * steps, by (b)'s criterion: the mean loss of the last 20 steps within 2%, on average over
 * B_SEEDS paired seeds (one seed measured +1.9%, where BF16 against itself with the learning rate
 * changed by 1e-4 spreads by up to 0.9%). (Per-step trajectories of two roundings drift apart;
 * test (a) holds the engine itself to the CPU.) */
static void test_attention_paths(void **state) {
    (void)state;
    const int64_t N = 500, B = 8, T = 64;
    char *dir = dw_test_tmpdir();
    static trace tm, tc;
    const char *paths[2] = {"mma", "cudnn"};
    trace *tr[2] = {&tm, &tc};
    double mean = 0.0;
    for (int k = 0; k < B_SEEDS; k++) {
        for (int a = 0; a < 2; a++) {
            dw_cuda_attention_use(paths[a]);
            char name[32], what[64];
            snprintf(name, sizeof name, "%s-%d", paths[a], k);
            snprintf(what, sizeof what, "(d) gpu bf16, attention %s, seed %llu", paths[a], (unsigned long long)(g_seed + k));
            char *o_dir = sub(dir, name);
            dw_train_opts o = opts(o_dir, N, B, T, LR_TRAIN, tr[a]);
            o.seed = g_seed + k;
            run(g_gpu, &o, NULL, what);
            free(o_dir);
        }
        const double m = tail_mean(&tm, N, 20), c = tail_mean(&tc, N, 20);
        mean += (c - m) / m / B_SEEDS;
        int differ = 0;
        for (int64_t s = 1; s <= N; s++) differ += tc.loss[s] != tm.loss[s];
        fprintf(stderr, "(d) seed %llu: bf16 last-20 mean: mma %.4f, cudnn %.4f (%+.2f%%); %d of %lld step losses differ\n",
                (unsigned long long)(g_seed + k), m, c, 100.0 * (c - m) / m, differ, (long long)N);
        assert_true(tc.loss[N] < 0.6 * tc.loss[1]); /* it trained */
        assert_true(differ > N / 2);                /* cuDNN ran (else the two runs are identical) */
    }
    dw_cuda_attention_use(NULL);
    fprintf(stderr, "(d) cudnn vs mma: mean over %d seeds %+.2f%%\n", B_SEEDS, 100.0 * mean);
    assert_true(fabs(mean) <= 0.02);
    free(dir);
}

/* (e) --deterministic: two GPU runs of the same job give bit-identical losses (attention through
 * the mma kernels whatever DW_ATTN or the default says; cuDNN's backward is not reproducible). */
static void test_deterministic(void **state) {
    (void)state;
    dw_cuda_attention_use("cudnn"); /* what --deterministic must override */
    char *dir = dw_test_tmpdir();
    static trace t[2];
    for (int k = 0; k < 2; k++) {
        char *o_dir = sub(dir, k ? "b" : "a");
        dw_train_opts o = opts(o_dir, 30, 4, 64, LR_TRAIN, &t[k]);
        o.deterministic = true;
        run(g_gpu, &o, NULL, k ? "(e) gpu bf16 deterministic, again" : "(e) gpu bf16 deterministic");
        free(o_dir);
    }
    dw_cuda_attention_use(NULL);
    int differ = 0;
    for (int64_t s = 1; s <= 30; s++) differ += t[0].loss[s] != t[1].loss[s];
    fprintf(stderr, "(e) deterministic: %d of 30 step losses differ between two runs (want 0)\n", differ);
    assert_int_equal(differ, 0);
    free(dir);
}

static bool file_has(const char *path, const char *text) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

/* (c) checkpoints across devices. */
/* profile.json of a finished GPU run: 3 timed steps; each table sums to the step; the linear and
 * attention ops appear forward and backward with positive times. */
static void check_profile(const char *run_dir) {
    char *path = dw_test_path(run_dir, "profile.json");
    dw_prof_summary s;
    if (dw_prof_read_json(g_gpu, path, &s) != DW_OK) fail_msg("%s", dw_errmsg(g_gpu));
    double so = 0, sr = 0;
    for (int i = 0; i < s.n_ops; i++) so += s.ops[i].ms;
    for (int i = 0; i < s.n_roles; i++) sr += s.roles[i].ms;
    const char *need[] = {"linear fwd", "linear bwd", "attention fwd", "attention bwd"};
    int found = 0;
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < s.n_ops; i++)
            if (!strcmp(s.ops[i].key, need[k]) && s.ops[i].ms > 0) found++;
    fprintf(stderr, "  profile: %d ops, %d roles, step %.3f ms (ops sum %.3f, roles sum %.3f), largest %s %.3f ms\n",
            s.n_ops, s.n_roles, s.total_ms, so, sr, s.n_ops ? s.ops[0].key : "-", s.n_ops ? s.ops[0].ms : 0.0);
    assert_int_equal(s.steps, 3);
    assert_true(s.total_ms > 0);
    assert_true(fabs(so - s.total_ms) <= 1e-6 * s.total_ms && fabs(sr - s.total_ms) <= 1e-6 * s.total_ms);
    assert_int_equal(found, 4);
    for (int i = 1; i < s.n_ops; i++) assert_true(s.ops[i].ms <= s.ops[i - 1].ms);
    dw_prof_free(&s);
    free(path);
}

static void test_resume_across_devices(void **state) {
    (void)state;
    dw_cuda_attention_use("mma"); /* GPU -> GPU within 1e-5 needs a deterministic backward */
    const int64_t S = 30, H = 15, B = 4, T = 64;
    char *dir = dw_test_tmpdir(), *og = sub(dir, "g"), *oc = sub(dir, "c"), *r1 = sub(dir, "gg"), *r2 = sub(dir, "gc"),
         *r3 = sub(dir, "cg");
    static trace tg, tc, t1, t2, t3;
    dw_policy *p = NULL;
    assert_int_equal(dw_policy_from_precision(g_gpu, "bf16", false, &p), DW_OK);
    dw_train_opts o = opts(og, S, B, T, LR_FOLLOW, &tg);
    o.ckpt_every = H;
    run(g_gpu, &o, p, "(c) gpu straight, checkpoint at 15");
    o = opts(oc, S, B, T, LR_FOLLOW, &tc);
    o.ckpt_every = H;
    run(g_cpu, &o, NULL, "(c) cpu straight, checkpoint at 15");
    char *ck = sub(og, "ckpt-15"), *ckc = sub(oc, "ckpt-15"), *st = sub(ck, "state.json");
    assert_true(file_has(st, "\"recipes\""));
    assert_true(file_has(st, "transformer.h.0.mlp.c_fc"));
    assert_true(file_has(st, "\"precision\": \"bf16\""));
    assert_true(file_has(st, "\"policy\": {"));
    /* GPU -> GPU */
    o = opts(r1, S, B, T, LR_FOLLOW, &t1);
    o.ckpt_every = H; /* the recorded cadence (a resumed run keeps it) */
    o.resume = ck;
    o.profile = true; /* after the last step: does not change the trace */
    run(g_gpu, &o, p, "(c) gpu ckpt -> gpu, --profile");
    check_profile(r1);
    int64_t at = 0;
    double d1 = max_rel(&t1, &tg, H + 1, S, &at);
    /* GPU -> CPU */
    o = opts(r2, S, B, T, LR_FOLLOW, &t2);
    o.ckpt_every = H; /* the recorded cadence (a resumed run keeps it) */
    o.resume = ck;
    run(g_cpu, &o, NULL, "(c) gpu ckpt -> cpu");
    int64_t at2 = 0;
    double d2 = max_rel(&t2, &tc, H + 1, S, &at2);
    /* CPU -> GPU */
    o = opts(r3, S, B, T, LR_FOLLOW, &t3);
    o.ckpt_every = H; /* the recorded cadence (a resumed run keeps it) */
    o.resume = ckc;
    run(g_gpu, &o, p, "(c) cpu ckpt -> gpu");
    int64_t at3 = 0;
    double d3 = max_rel(&t3, &tg, H + 1, S, &at3);
    fprintf(stderr, "(c) resumed steps 16..30: gpu->gpu max rel %.3g (step %lld), gpu->cpu vs cpu %.3g (step %lld), "
            "cpu->gpu vs gpu %.3g (step %lld); losses at 30: gpu %.4f cpu %.4f gg %.4f gc %.4f cg %.4f\n",
            d1, (long long)at, d2, (long long)at2, d3, (long long)at3, tg.loss[S], tc.loss[S], t1.loss[S],
            t2.loss[S], t3.loss[S]);
    assert_int_equal(t1.last, S);
    assert_int_equal(t2.last, S);
    assert_int_equal(t3.last, S);
    assert_true(d1 <= 1e-5);
    assert_true(d2 <= 3e-2);
    assert_true(d3 <= 3e-2);
    dw_policy_free(p);
    free(st), free(ck), free(ckc), free(og), free(oc), free(r1), free(r2), free(r3), free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_follows_cpu),
        cmocka_unit_test(test_quantised_vs_bf16),
        cmocka_unit_test(test_resume_across_devices),
        cmocka_unit_test(test_attention_paths),
        cmocka_unit_test(test_deterministic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
