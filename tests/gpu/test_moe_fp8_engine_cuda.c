/* test_moe_fp8_engine_cuda.c — MoE experts in fp8_block on the GPU (sm_90, by default): one
 * program (a Mixtral of hidden 128 and experts of 256, compiled for this GPU under fp8_block, its
 * experts' wgrad BF16 by default, and again under a rule's "bf16_passes": [] with the wgrad in
 * fp8_block too) on the CUDA engine and on the CPU engine (its oracle: the same fp8 passes through
 * the CPU reference of the kernel's arithmetic) with the same weights. Checked: the program binds
 * the sm_90 fp8_block kernel for fprop and dgrad, and for wgrad under the rule (else the BF16
 * grouped kernel); every expert node's weight cache (W and W^T codes and scales, from
 * the same FP32 masters) equal on both, bit for bit; the loss of a forward and backward, every
 * parameter gradient (normwise, the quantised tolerances of test_engine_cuda.c: loss 5e-2
 * relative, gradients 0.2; the routers' weights 0.5, which a token routed otherwise near a tie
 * moves by up to ~0.3), and three AdamW steps' losses; the routers' weights spread wide so the
 * two backends route alike; the routing counters of the first training forward agree (every
 * assignment counted, none dropped, per-expert loads within a few near-ties). And AdamW refreshing
 * the caches in its own pass (quant_adamw.cu) against the separate refresh on two CUDA engines, bit
 * for bit, with standing pools and with the caches' codes in the activation arena (wcache_arena);
 * and the up layers' fprop reusing the gate's quantised x and the down layers' reading the rows the
 * SwiGLU quantised (kernels/cuda/swiglu_fp8.cu, itself against the SwiGLU and the rows quantiser it
 * replaces, byte for byte), against quantising at every use.
 * Needs a GPU (sm_90); elsewhere it skips. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/program.h"
#include "core/ctx.h"
#include "formats/formats.h"
#include "gemm/grouped_fp8.h"
#include "gpu_upload.h"
#include "kernels/cuda/ops_cuda.h"
#include "precision/quant_counts.h"
#include "runtime/cuda/cuda.h"
#include "runtime/engine.h"
#include "testutil.h"

static dw_ctx *g_cpu, *g_gpu;
static dw_test_rng g_rng;

static int setup(void **state) {
    (void)state;
    dw_test_rng_init(&g_rng, dw_test_seed() ^ 0xF8E5ull);
    return dw_test_cpu_gpu_setup(&g_cpu, &g_gpu);
}
static int teardown(void **state) {
    (void)state;
    dw_test_cpu_gpu_teardown(g_cpu, g_gpu);
    return 0;
}

static int64_t pnumel(dw_engine *e, int i) {
    int64_t s[4], n = 1;
    const int nd = dw_engine_param_shape(e, i, s);
    for (int d = 0; d < nd; d++) n *= s[d];
    return n;
}

/* ||a - b||_2 / max(||b||_2, floor) */
static double normwise(const float *a, const float *b, int64_t n, double floor) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d) / fmax(sqrt(r), floor);
}

/* The routing counters of one training forward (dw_engine_moe_counts: per layer assigned, dropped,
 * the load of each expert), equal on both engines: every layer assigned N x top-k rows, none
 * dropped (dropless), loads summing to the assignments and within a few near-ties of each other. The
 * CUDA dispatch once counted before it had written the offsets it reads: dropped was garbage. */
static int check_counts(dw_engine *cpu, dw_engine *gpu, int64_t N) {
    int64_t L = 0, E = 0, L2 = 0, E2 = 0;
    assert_int_equal(dw_engine_moe_counts(cpu, &L, &E, NULL), DW_OK);
    assert_int_equal(dw_engine_moe_counts(gpu, &L2, &E2, NULL), DW_OK);
    assert_true(L == 2 && E == 4 && L2 == L && E2 == E); /* mixtral-tiny: 2 MoE layers of 4 experts */
    int64_t *a = calloc((size_t)(L * (2 + E)), 8), *b = calloc((size_t)(L * (2 + E)), 8);
    assert_int_equal(dw_engine_moe_counts(cpu, NULL, NULL, a), DW_OK);
    assert_int_equal(dw_engine_moe_counts(gpu, NULL, NULL, b), DW_OK);
    int bad = 0;
    for (int64_t l = 0; l < L; l++) {
        const int64_t *x = a + l * (2 + E), *y = b + l * (2 + E);
        int64_t sum = 0, moved = 0; /* moved: assignments the backends place on other experts (x 2) */
        for (int64_t e = 0; e < E; e++) sum += y[2 + e], moved += llabs(x[2 + e] - y[2 + e]);
        /* a near-tied token may pick another expert (1 of 212 seen: the fp8 layers before the router
         * differ in their last bits); garbage counters or a lost assignment move far more */
        if (y[0] != N * 2 || x[0] != y[0] || y[1] != 0 || x[1] != 0 || sum != y[0] || moved > 2 * (2 + N * 2 / 50)) bad++;
        printf("layer %lld counts gpu: assigned %lld dropped %lld loads sum %lld (cpu %lld %lld)\n", (long long)l,
               (long long)y[0], (long long)y[1], (long long)sum, (long long)x[0], (long long)x[1]);
    }
    if (bad) printf("MISMATCH routing counters\n");
    free(a), free(b);
    return bad;
}

/* The tests' model at B x T (a Mixtral of hidden 128, experts of 256: whole 128x128 blocks); on
 * a GPU other than sm_90 the test skips. */
static dw_graph *sm90_mixtral(int64_t B, int64_t T) {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess || major * 10 + minor != 90)
        skip();
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(g_gpu, "mixtral-tiny", &mc), DW_OK);
    mc.d_model = 128, mc.head_dim = 32, mc.d_ff = 256, mc.d_ff_expert = 256;
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(g_gpu, &mc, B, T, &g), DW_OK);
    return g;
}

static void check_fp8_experts(const char *policy, bool fp8_wgrad) {
    const int64_t B = 2, T = 48 + (int64_t)(dw_test_next(&g_rng) % 17), N = B * T;
    dw_graph *g = sm90_mixtral(B, T);
    dw_policy *pol = NULL;
    assert_int_equal(dw_test_policy(g_gpu, policy, false, &pol), DW_OK);
    printf("%s\n", fp8_wgrad ? "the experts' wgrad in fp8_block (\"bf16_passes\": [])" : "the experts' wgrad BF16 (the default)");
    unsetenv("DW_MOE_FP8"); /* the default: fp8_block experts on sm_90 */
    dw_compiled *c = NULL;
    if (dw_compile(g_gpu, g, NULL, pol, NULL, &c) != DW_OK) fail_msg("compile: %s", dw_errmsg(g_gpu));
    int experts = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == DW_OP_MOE_LINEAR) {
            experts++;
            assert_string_equal(c->node[i].bind.kernel[DW_QPASS_FPROP], "grouped_fp8block_sm90");
            assert_string_equal(c->node[i].bind.kernel[DW_QPASS_DGRAD], "grouped_fp8block_sm90");
            assert_int_equal(c->node[i].bind.quantised[DW_QPASS_WGRAD], fp8_wgrad);
            assert_string_equal(c->node[i].bind.kernel[DW_QPASS_WGRAD], fp8_wgrad ? "grouped_fp8block_sm90" : "grouped_wgmma_sm90");
        }
    assert_int_equal(experts, 6);
    dw_engine *cpu = NULL, *gpu = NULL;
    assert_int_equal(dw_engine_create(g_cpu, c, NULL, &cpu), DW_OK);
    if (dw_engine_create(g_gpu, c, NULL, &gpu) != DW_OK) fail_msg("cuda engine: %s", dw_errmsg(g_gpu));
    for (int i = 0; i < dw_engine_param_count(cpu); i++) { /* routers spread wide: the same routing */
        const int64_t n = pnumel(cpu, i);
        const float sd = strstr(dw_engine_param_name(cpu, i), "gate.weight") && !strstr(dw_engine_param_name(cpu, i), "experts")
                             ? 2.0f
                             : 0.1f;
        float *v = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++) v[k] = sd * dw_test_normal(&g_rng);
        assert_int_equal(dw_engine_param_write(cpu, i, v), DW_OK);
        assert_int_equal(dw_engine_param_write(gpu, i, v), DW_OK);
        free(v);
    }
    assert_int_equal(dw_engine_refresh(cpu), DW_OK);
    assert_int_equal(dw_engine_refresh(gpu), DW_OK);
    int bad = 0;
    for (int i = 0; i < g->n_nodes; i++) { /* the weight caches, bit for bit */
        if (g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        for (int q = 0; q < 2; q++) {
            const dw_qslot_layout *l = &c->node[i].wq[q];
            const int64_t n = l->tscale; /* codes and scales with their padding */
            unsigned char *h = malloc((size_t)n);
            assert_int_equal(cudaMemcpy(h, gpu->x->work + l->off, (size_t)n, cudaMemcpyDeviceToHost), cudaSuccess);
            if (memcmp(h, cpu->x->work + l->off, (size_t)n)) bad++, printf("MISMATCH %s weight cache %d\n", g->nodes[i].name, q);
            free(h);
        }
    }
    int32_t *x = malloc((size_t)N * 4), *y = malloc((size_t)N * 4);
    dw_test_random_tokens(x, N, dw_graph_vocab(g), &g_rng);
    dw_test_random_tokens(y, N, dw_graph_vocab(g), &g_rng);
    double lc = 0, lg = 0;
    assert_int_equal(dw_engine_zero_grad(cpu), DW_OK);
    assert_int_equal(dw_engine_zero_grad(gpu), DW_OK);
    assert_int_equal(dw_engine_forward_backward(cpu, x, y, B, T, 1.0, &lc), DW_OK);
    if (dw_engine_forward_backward(gpu, x, y, B, T, 1.0, &lg) != DW_OK) fail_msg("cuda step: %s", dw_errmsg(g_gpu));
    printf("loss gpu %.8f cpu %.8f\n", lg, lc);
    if (!(fabs(lg - lc) / lc <= 5e-2)) bad++, printf("MISMATCH loss\n");
    bad += check_counts(cpu, gpu, N);
    for (int i = 0; i < dw_engine_param_count(cpu); i++) {
        const int64_t n = pnumel(cpu, i);
        float *gc = malloc((size_t)n * 4), *gg = malloc((size_t)n * 4);
        assert_int_equal(dw_engine_grad_read(cpu, i, gc), DW_OK);
        assert_int_equal(dw_engine_grad_read(gpu, i, gg), DW_OK);
        /* a router's weight: a token near a tie routed otherwise on one backend moves its layer's
         * router gradient by up to ~0.3 (seen: 0.241, 0.325 in ~1 of 5 runs); a wrong one is off by ~1 */
        const char *name = dw_engine_param_name(cpu, i);
        const double err = normwise(gg, gc, n, 1e-6), tol = strstr(name, "mlp.gate.weight") ? 0.5 : 0.2;
        if (!(err <= tol)) bad++, printf("MISMATCH gradient %s: %.3g (bound %.1f)\n", name, err, tol);
        free(gc), free(gg);
    }
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    ao.lr = 3e-3;
    for (int step = 1; step <= 3; step++) {
        double nc = 0, ng = 0;
        assert_int_equal(dw_engine_zero_grad(cpu), DW_OK);
        assert_int_equal(dw_engine_zero_grad(gpu), DW_OK);
        assert_int_equal(dw_engine_forward_backward(cpu, x, y, B, T, 1.0, &lc), DW_OK);
        assert_int_equal(dw_engine_forward_backward(gpu, x, y, B, T, 1.0, &lg), DW_OK);
        assert_int_equal(dw_engine_step(cpu, &ao, step, &nc), DW_OK);
        assert_int_equal(dw_engine_step(gpu, &ao, step, &ng), DW_OK);
        printf("step %d: loss gpu %.8f cpu %.8f\n", step, lg, lc);
        if (!(fabs(lg - lc) / lc <= 5e-2)) bad++, printf("MISMATCH step %d loss\n", step);
    }
    dw_engine_free(cpu);
    dw_engine_free(gpu);
    dw_compiled_free(c);
    dw_policy_free(pol);
    dw_graph_free(g);
    free(x), free(y);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
}

static void test_fp8_experts(void **state) {
    (void)state;
    check_fp8_experts("fp8_block", false);
    check_fp8_experts(DW_TEST_FP8_WGRAD, true);
}

/* Expert node i's cache t (W, W^T) of engine e (program c): its codes (in the workspace, or in
 * the activation arena under wcache_arena) and its 128x128 scales, copied to the host (n bytes). */
static unsigned char *cache_bytes(const dw_graph *g, const dw_compiled *c, dw_engine *e, int i, int t, size_t *n) {
    const dw_qslot_layout *l = &c->node[i].wq[t];
    const int64_t *sh = g->tensors[g->nodes[i].in[1]].shape; /* [E, M, K] */
    const size_t codes = (size_t)(sh[0] * sh[1] * sh[2]), scales = (size_t)(sh[0] * (sh[1] / 128) * (sh[2] / 128)) * 4;
    unsigned char *h = malloc(codes + scales);
    const char *src = l->codes_act >= 0 ? e->x->act + l->codes_act : e->x->work + l->off;
    assert_int_equal(cudaMemcpy(h, src, codes, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_int_equal(cudaMemcpy(h + codes, e->x->work + l->off + l->scales, scales, cudaMemcpyDeviceToHost), cudaSuccess);
    *n = codes + scales;
    return h;
}

/* Every expert node's weight cache (W and W^T: codes and scales) of two engines (programs ca, cb),
 * or of one against bytes read before; the count of differing caches. */
static int caches_differ(const dw_graph *g, const dw_compiled *ca, dw_engine *a, const dw_compiled *cb, dw_engine *b,
                         unsigned char **saved) {
    int bad = 0, k = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        for (int q = 0; q < 2; q++, k++) {
            size_t n, nb;
            unsigned char *ha = cache_bytes(g, ca, a, i, q, &n), *hb = b ? cache_bytes(g, cb, b, i, q, &nb) : NULL;
            if (memcmp(ha, b ? hb : saved[k], n)) bad++, printf("MISMATCH %s weight cache %d\n", g->nodes[i].name, q);
            if (saved && b) saved[k] = ha, ha = NULL;
            free(ha), free(hb);
        }
    }
    return bad;
}

/* AdamW refreshing the experts' fp8_block caches in its own pass (kernels/cuda/quant_adamw.cu)
 * against the separate refresh (DW_FUSED_CAST=0), the same weights on two CUDA engines, three
 * steps eager then recorded: the same losses and norms, every parameter and every cache bit for
 * bit; and the fused engine's caches are what a refresh alone makes again from its masters. Twice:
 * both programs with standing pools (the fused engine's AdamW takes all 6 expert nodes), then the
 * fused one with the gradients, BF16 copies and the caches' codes in the activation arena
 * (grad_arena, bf16_arena, wcache_arena; its norm, from the experts' wgrad partials, within 1e-12
 * of the other's): its AdamW takes the nodes whose codes lie on gradients of
 * elements below theirs alone (dw_compile_wcache_below; the others refreshed after it), and a
 * forward after a backward without a step reads caches made again (the pool engine's loss). */
static void fused_cache(bool arena) {
    const int64_t B = 2, T = 64, N = B * T;
    dw_graph *g = sm90_mixtral(B, T);
    dw_policy *pol = NULL;
    assert_int_equal(dw_test_policy(g_gpu, "fp8_block", false, &pol), DW_OK);
    unsetenv("DW_MOE_FP8");
    dw_compiled *c[2] = {NULL, NULL};
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.grad_arena = o.bf16_arena = o.wcache_arena = arena;
    if (dw_compile(g_gpu, g, NULL, pol, &o, &c[0]) != DW_OK) fail_msg("compile: %s", dw_errmsg(g_gpu));
    if (dw_compile(g_gpu, g, NULL, pol, NULL, &c[1]) != DW_OK) fail_msg("compile: %s", dw_errmsg(g_gpu));
    int moe = 0, in_arena = 0, below = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != DW_OP_MOE_LINEAR) continue;
        moe++, in_arena += c[0]->node[i].wq[0].codes_act >= 0 && c[0]->node[i].wq[1].codes_act >= 0;
        below += in_arena && dw_compile_wcache_below(c[0], i);
        assert_true(c[1]->node[i].wq[0].codes_act < 0 && c[1]->node[i].wq[1].codes_act < 0);
    }
    assert_int_equal(in_arena, arena ? moe : 0);
    const int want_fused = arena ? below : moe;
    printf("%s: %d expert nodes, codes of %d in the arena, %d of those on lower gradients alone\n",
           arena ? "arenas" : "standing pools", moe, in_arena, below);
    dw_engine *e[2] = {NULL, NULL};
    if (dw_engine_create(g_gpu, c[0], NULL, &e[0]) != DW_OK) fail_msg("cuda engine: %s", dw_errmsg(g_gpu));
    setenv("DW_FUSED_CAST", "0", 1); /* read when the executor is made */
    const dw_status st = dw_engine_create(g_gpu, c[1], NULL, &e[1]);
    unsetenv("DW_FUSED_CAST");
    if (st != DW_OK) fail_msg("cuda engine: %s", dw_errmsg(g_gpu));
    for (int i = 0; i < dw_engine_param_count(e[0]); i++) {
        const int64_t n = pnumel(e[0], i);
        float *v = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++) v[k] = 0.1f * dw_test_normal(&g_rng);
        for (int k = 0; k < 2; k++) assert_int_equal(dw_engine_param_write(e[k], i, v), DW_OK);
        free(v);
    }
    for (int k = 0; k < 2; k++) assert_int_equal(dw_engine_refresh(e[k]), DW_OK);
    int32_t *x = malloc((size_t)N * 4), *y = malloc((size_t)N * 4);
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    ao.lr = 3e-3;
    int bad = 0;
    for (int step = 1; step <= 3; step++) {
        dw_test_random_tokens(x, N, dw_graph_vocab(g), &g_rng);
        dw_test_random_tokens(y, N, dw_graph_vocab(g), &g_rng);
        double l[2] = {0, 0}, gn[2] = {0, 0};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(dw_engine_zero_grad(e[k]), DW_OK);
            if (dw_engine_forward_backward(e[k], x, y, B, T, 1.0, &l[k]) != DW_OK) fail_msg("%s", dw_errmsg(g_gpu));
            assert_int_equal(dw_engine_step(e[k], &ao, step, &gn[k]), DW_OK);
        }
        printf("step %d: loss %.9g vs %.9g, norm %.9g vs %.9g; AdamW refreshed %d caches (separately: %d)\n", step,
               l[0], l[1], gn[0], gn[1], e[0]->x->n_wq, e[1]->x->n_wq);
        /* the arena engine's norm adds the experts' wgrad partials (compile/wgrad_sumsq.h): another order */
        const double nerr = fabs(gn[0] - gn[1]) / gn[1];
        if (l[0] != l[1] || (arena ? !(nerr <= 1e-12) : gn[0] != gn[1]))
            bad++, printf("MISMATCH step %d (norms %.3g apart)\n", step, nerr);
        if (e[0]->x->n_wq != want_fused || e[1]->x->n_wq != 0) bad++, printf("MISMATCH caches refreshed by AdamW\n");
        for (int i = 0; i < dw_engine_param_count(e[0]); i++) { /* where the masters first part, if they do */
            const int64_t n = pnumel(e[0], i);
            float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
            assert_int_equal(dw_engine_param_read(e[0], i, a), DW_OK);
            assert_int_equal(dw_engine_param_read(e[1], i, b), DW_OK);
            int64_t first = -1, count = 0;
            for (int64_t k = 0; k < n; k++)
                if (memcmp(&a[k], &b[k], 4)) count++, first = first < 0 ? k : first;
            if (count)
                printf("step %d: %s: %lld of %lld differ, first %lld: %.9g vs %.9g\n", step, dw_engine_param_name(e[0], i),
                       (long long)count, (long long)n, (long long)first, a[first], b[first]);
            bad += count > 0;
            free(a), free(b);
        }
    }
    unsigned char *saved[16] = {NULL};
    bad += caches_differ(g, c[0], e[0], c[1], e[1], saved);
    assert_int_equal(dw_engine_refresh(e[0]), DW_OK); /* a refresh alone: the separate quantiser */
    bad += caches_differ(g, c[0], e[0], NULL, NULL, saved);
    double l[2], gn;
    for (int k = 0; k < 2; k++) { /* a backward without a step takes the arena's caches; the forward remakes them */
        assert_int_equal(dw_engine_zero_grad(e[k]), DW_OK);
        assert_int_equal(dw_engine_forward_backward(e[k], x, y, B, T, 1.0, &l[k]), DW_OK);
        assert_int_equal(dw_engine_forward(e[k], x, y, B, T, NULL, &l[k]), DW_OK);
    }
    if (l[0] != l[1]) bad++, printf("MISMATCH forward after a backward: %.9g vs %.9g\n", l[0], l[1]);
    for (int k = 0; k < 2; k++) { /* and trains on */
        assert_int_equal(dw_engine_zero_grad(e[k]), DW_OK);
        assert_int_equal(dw_engine_forward_backward(e[k], x, y, B, T, 1.0, &l[k]), DW_OK);
        assert_int_equal(dw_engine_step(e[k], &ao, 4, &gn), DW_OK);
    }
    if (l[0] != l[1]) bad++, printf("MISMATCH step 4: %.9g vs %.9g\n", l[0], l[1]);
    printf("fused vs separate: parameters and 12 caches compared; the fused caches against a refresh alone; a "
           "forward after a backward, loss %.9g\n", l[0]);
    for (int k = 0; k < 16; k++) free(saved[k]);
    for (int k = 0; k < 2; k++) dw_engine_free(e[k]), dw_compiled_free(c[k]);
    dw_policy_free(pol);
    dw_graph_free(g);
    free(x), free(y);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
}

static void test_fused_cache(void **state) {
    (void)state;
    fused_cache(false);
    fused_cache(true);
}

/* Uniform in [0, n). */
static int64_t pick(int64_t n) { return (int64_t)(dw_test_next(&g_rng) % (uint64_t)n); }
/* A random BF16 value: normal(0, sd) rounded to BF16 bits. */
static uint16_t rnd_bf16(float sd) { return dw_encode_bf16(dw_test_normal(&g_rng) * sd); }

/* dw_cuda_swiglu_fwd_fp8 (kernels/cuda/swiglu_fp8.cu) against what it replaces — the SwiGLU
 * (ops_act.cu) and the fp8_block rows quantiser of its BF16 output — byte for byte: the BF16
 * output, the E4M3 codes and the FP32 scales. Fresh random rows at scales from 1e-30 to 1e4, with a
 * block of zeros, one holding a NaN and one an infinity, at row counts that leave the last warp half
 * used (R F / 8 not a multiple of 32); with out NULL the output's memory is left as it was. And its
 * counts (precision/quant_counts.cuh): the overflows, underflows and elements the counting pass
 * (dw_qcounts_add_cuda) finds in the rows quantiser's codes of the BF16 output, added to counters
 * that start at random values, with planted elements 1e-8 of their block's spread (flushed). */
static void test_swiglu_fp8_kernel(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    const int64_t shapes[][2] = {{1, 128}, {3, 384}, {37, 256}, {255, 1024}, {2048, 5632}};
    int bad = 0;
    uint64_t flushed = 0;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int64_t R = shapes[t][0], F = shapes[t][1], n = R * F, nb = n / 128;
        uint16_t *gate = malloc((size_t)n * 2), *up = malloc((size_t)n * 2);
        for (int64_t b = 0; b < nb; b++) { /* each 1x128 block at its own scale */
            const float sd = powf(10.0f, dw_test_uniform(&g_rng, -30.0f, 4.0f));
            for (int64_t i = 128 * b; i < 128 * (b + 1); i++) gate[i] = rnd_bf16(4.0f), up[i] = rnd_bf16(sd);
            if (pick(4) == 0) up[128 * b + pick(128)] = rnd_bf16(sd * 1e-8f); /* flushed to zero */
        }
        const int64_t zb = pick(nb), nanb = pick(nb), infb = pick(nb);
        for (int64_t i = 128 * zb; i < 128 * (zb + 1); i++) up[i] = 0;
        up[128 * nanb + pick(128)] = 0x7FC0;  /* NaN: the block's codes 0x7F, scale NaN */
        gate[128 * infb + pick(128)] = 0x7F80; /* +inf: silu(inf) up = +-inf (or NaN at up 0) */
        uint16_t *dg, *du, *h_ref, *h_fused, *h_none;
        uint8_t *c_ref, *c_fused, *c_none;
        float *s_ref, *s_fused, *s_none;
        assert_int_equal(cudaMalloc((void **)&dg, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&du, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&h_ref, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&h_fused, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&h_none, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&c_ref, (size_t)n), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&c_fused, (size_t)n), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&c_none, (size_t)n), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&s_ref, (size_t)nb * 4), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&s_fused, (size_t)nb * 4), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&s_none, (size_t)nb * 4), cudaSuccess);
        assert_int_equal(cudaMemcpy(dg, gate, (size_t)n * 2, cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(cudaMemcpy(du, up, (size_t)n * 2, cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(cudaMemset(h_fused, 0xA5, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMemset(h_none, 0x5A, (size_t)n * 2), cudaSuccess);
        assert_int_equal(cudaMemset(c_fused, 0xA5, (size_t)n), cudaSuccess);
        assert_int_equal(cudaMemset(c_none, 0xA5, (size_t)n), cudaSuccess);
        uint64_t cnt0[2][DW_QC_WORDS], cnt1[2][DW_QC_WORDS], *dcnt; /* [0]: the counting pass, [1]: the kernel */
        for (int k = 0; k < 2; k++)
            for (int w = 0; w < DW_QC_WORDS; w++) cnt0[k][w] = dw_test_next(&g_rng) >> 8;
        assert_int_equal(cudaMalloc((void **)&dcnt, sizeof cnt0), cudaSuccess);
        assert_int_equal(cudaMemcpy(dcnt, cnt0, sizeof cnt0, cudaMemcpyHostToDevice), cudaSuccess);
        assert_int_equal(dw_cuda_swiglu_fwd(g_gpu, DW_ACT_BF16, h_ref, dg, du, n, stream), DW_OK);
        assert_int_equal(dw_grouped_fp8_quantize_rows_cuda(g_gpu, h_ref, true, R, F, c_ref, s_ref), DW_OK);
        assert_int_equal(dw_qcounts_add_cuda(g_gpu, DW_RECIPE_FP8_BLOCK, 1, h_ref, R, F, false, c_ref, s_ref, NULL, dcnt,
                                             stream), DW_OK);
        assert_int_equal(dw_cuda_swiglu_fwd_fp8(g_gpu, h_fused, dg, du, R, F, c_fused, s_fused, dcnt + DW_QC_WORDS,
                                                stream), DW_OK);
        assert_int_equal(dw_cuda_swiglu_fwd_fp8(g_gpu, NULL, dg, du, R, F, c_none, s_none, NULL, stream), DW_OK);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        assert_int_equal(cudaMemcpy(cnt1, dcnt, sizeof cnt1, cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(dcnt);
        uint64_t got[2][DW_QC_WORDS];
        for (int k = 0; k < 2; k++)
            for (int w = 0; w < DW_QC_WORDS; w++) got[k][w] = cnt1[k][w] - cnt0[k][w];
        printf("swiglu_fp8 R=%lld F=%lld counts (overflow/underflow/elements): kernel %llu/%llu/%llu, counting pass "
               "%llu/%llu/%llu\n", (long long)R, (long long)F, (unsigned long long)got[1][0], (unsigned long long)got[1][1],
               (unsigned long long)got[1][2], (unsigned long long)got[0][0], (unsigned long long)got[0][1],
               (unsigned long long)got[0][2]);
        if (memcmp(got[0], got[1], sizeof got[0]) || got[1][DW_QC_N] != (uint64_t)n)
            bad++, printf("MISMATCH swiglu_fp8 counts R=%lld F=%lld\n", (long long)R, (long long)F);
        flushed += got[1][DW_QC_UNDER];
        uint16_t *h[3];
        uint8_t *cc[3];
        float *sc[3];
        uint16_t *hd[3] = {h_ref, h_fused, h_none};
        uint8_t *cd[3] = {c_ref, c_fused, c_none};
        float *sd[3] = {s_ref, s_fused, s_none};
        for (int k = 0; k < 3; k++) {
            h[k] = malloc((size_t)n * 2), cc[k] = malloc((size_t)n), sc[k] = malloc((size_t)nb * 4);
            assert_int_equal(cudaMemcpy(h[k], hd[k], (size_t)n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
            assert_int_equal(cudaMemcpy(cc[k], cd[k], (size_t)n, cudaMemcpyDeviceToHost), cudaSuccess);
            assert_int_equal(cudaMemcpy(sc[k], sd[k], (size_t)nb * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        }
        int64_t dh = 0, dc = 0, ds = 0, kept = 0, nan_scales = 0;
        for (int64_t i = 0; i < n; i++) {
            dh += h[0][i] != h[1][i];
            dc += (cc[0][i] != cc[1][i]) + (cc[0][i] != cc[2][i]);
            kept += h[2][i] == 0x5A5A;
        }
        for (int64_t b = 0; b < nb; b++) {
            ds += (memcmp(&sc[0][b], &sc[1][b], 4) != 0) + (memcmp(&sc[0][b], &sc[2][b], 4) != 0);
            nan_scales += isnan(sc[0][b]);
        }
        printf("swiglu_fp8 R=%lld F=%lld: %lld BF16 outputs, %lld codes, %lld scales differ (want 0); output left "
               "alone without out: %lld of %lld; %lld NaN scales (want >= 1)\n", (long long)R, (long long)F,
               (long long)dh, (long long)dc, (long long)ds, (long long)kept, (long long)n, (long long)nan_scales);
        if (dh || dc || ds || kept != n || nan_scales < 1) bad++, printf("MISMATCH swiglu_fp8 R=%lld F=%lld\n",
                                                                         (long long)R, (long long)F);
        for (int k = 0; k < 3; k++) free(h[k]), free(cc[k]), free(sc[k]);
        void *dev[] = {dg, du, h_ref, h_fused, h_none, c_ref, c_fused, c_none, s_ref, s_fused, s_none};
        for (size_t k = 0; k < sizeof dev / sizeof dev[0]; k++) cudaFree(dev[k]);
        free(gate), free(up);
    }
    /* refused: a width off the 128-block */
    assert_int_equal(dw_cuda_swiglu_fwd_fp8(g_gpu, NULL, (void *)16, (void *)16, 4, 96, (uint8_t *)16, (float *)16,
                                            NULL, stream), DW_ERR_INVALID);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
    if (flushed == 0) fail_msg("no planted element counted as flushed");
}

/* dw_cuda_moe_combine_bwd_rows_fp8 (ops_moe_dispatch.cu) against what it replaces — the combine's
 * backward over a dropless dispatch (dw_cuda_moe_combine_bwd, covered) and the rows quantiser on
 * its dys — byte for byte: dys, the weights' gradient, the codes and the scales. Fresh random
 * tokens, each at its own scale (1e-20 to 1e3), a random permutation of the N K rows, K from 1 to
 * 8, widths 128 to 2048 (the column loop's last warp partly past C at 384 and 640). */
static void test_combine_rows_kernel(void **state) {
    (void)state;
    void *stream = NULL;
    assert_int_equal(dw_ctx_stream(g_gpu, &stream), DW_OK);
    const int64_t shapes[][3] = {{1, 128, 1}, {7, 384, 2}, {64, 640, 8}, {300 + pick(50), 2048, 2}};
    int bad = 0;
    for (size_t t = 0; t < sizeof shapes / sizeof shapes[0]; t++) {
        const int64_t N = shapes[t][0], C = shapes[t][1], K = shapes[t][2], R = N * K, nb = R * C / 128;
        uint16_t *dout = malloc((size_t)(N * C) * 2), *ys = malloc((size_t)(R * C) * 2), *wt = malloc((size_t)R * 2);
        int32_t *pos = malloc((size_t)R * 4);
        for (int64_t n = 0; n < N; n++) {
            const float sd = powf(10.0f, dw_test_uniform(&g_rng, -20.0f, 3.0f));
            for (int64_t c = 0; c < C; c++) dout[n * C + c] = rnd_bf16(sd);
        }
        for (int64_t i = 0; i < R * C; i++) ys[i] = rnd_bf16(1.0f);
        for (int64_t i = 0; i < R; i++) wt[i] = rnd_bf16(0.5f), pos[i] = (int32_t)i;
        for (int64_t i = R - 1; i > 0; i--) { /* a random permutation: every row one assignment's */
            const int64_t j = pick(i + 1);
            const int32_t tmp = pos[i];
            pos[i] = pos[j], pos[j] = tmp;
        }
        dout[pick(N * C)] = 0x7FC0; /* NaN */
        void *d_dout, *d_ys, *d_wt, *d_pos, *dys[2], *dwt[2], *codes[2], *scales[2];
        const size_t bytes[] = {(size_t)(N * C) * 2, (size_t)(R * C) * 2, (size_t)R * 2, (size_t)R * 4};
        void **ins[] = {&d_dout, &d_ys, &d_wt, &d_pos};
        const void *hs[] = {dout, ys, wt, pos};
        for (int k = 0; k < 4; k++) *ins[k] = dw_test_to_dev(hs[k], bytes[k]);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(cudaMalloc(&dys[k], (size_t)(R * C) * 2), cudaSuccess);
            assert_int_equal(cudaMalloc(&dwt[k], (size_t)R * 2), cudaSuccess);
            assert_int_equal(cudaMalloc(&codes[k], (size_t)(R * C)), cudaSuccess);
            assert_int_equal(cudaMalloc(&scales[k], (size_t)nb * 4), cudaSuccess);
        }
        assert_int_equal(dw_cuda_moe_combine_bwd(g_gpu, DW_ACT_BF16, dys[0], dwt[0], d_dout, d_ys, d_wt, d_pos, N, C, K, R,
                                                 true, stream), DW_OK);
        assert_int_equal(dw_grouped_fp8_quantize_rows_cuda(g_gpu, dys[0], true, R, C, codes[0], scales[0]), DW_OK);
        assert_int_equal(dw_cuda_moe_combine_bwd_rows_fp8(g_gpu, dys[1], dwt[1], d_dout, d_ys, d_wt, d_pos, N, C, K,
                                                          codes[1], scales[1], stream), DW_OK);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        const size_t sz[4] = {(size_t)(R * C) * 2, (size_t)R * 2, (size_t)(R * C), (size_t)nb * 4};
        void **bufs[4] = {dys, dwt, codes, scales};
        int64_t diff[4];
        for (int b = 0; b < 4; b++) {
            unsigned char *h0 = malloc(sz[b]), *h1 = malloc(sz[b]);
            dw_test_from_dev(h0, bufs[b][0], sz[b]);
            dw_test_from_dev(h1, bufs[b][1], sz[b]);
            diff[b] = 0;
            for (size_t i = 0; i < sz[b]; i++) diff[b] += h0[i] != h1[i];
            free(h0), free(h1);
        }
        printf("combine rows N=%lld C=%lld K=%lld: dys %lld, dw %lld, codes %lld, scales %lld bytes differ (want 0)\n",
               (long long)N, (long long)C, (long long)K, (long long)diff[0], (long long)diff[1], (long long)diff[2],
               (long long)diff[3]);
        if (diff[0] || diff[1] || diff[2] || diff[3]) bad++, printf("MISMATCH combine rows N=%lld C=%lld\n", (long long)N,
                                                                    (long long)C);
        cudaFree(d_dout), cudaFree(d_ys), cudaFree(d_wt), cudaFree(d_pos);
        for (int k = 0; k < 2; k++) cudaFree(dys[k]), cudaFree(dwt[k]), cudaFree(codes[k]), cudaFree(scales[k]);
        free(dout), free(ys), free(wt), free(pos);
    }
    void *p = (void *)256;
    assert_int_equal(dw_cuda_moe_combine_bwd_rows_fp8(g_gpu, p, p, p, p, p, p, 4, 96, 2, p, p, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_moe_combine_bwd_rows_fp8(g_gpu, p, p, p, p, p, p, 4, 128, 17, p, p, stream), DW_ERR_INVALID);
    assert_int_equal(dw_cuda_moe_combine_bwd_rows_fp8(g_gpu, p, p, p, p, p, p, 4, 128, 2, (uint8_t *)p + 4, p, stream),
                     DW_ERR_INVALID);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
}

/* The gate and up layers read one dispatch's rows: with dw_engine_opts.quant_reuse the up layer's
 * fprop takes the rows the gate's quantised (ops_cuda_moe.c), and the down layer's the rows its
 * SwiGLU quantised as it wrote them (kernels/cuda/swiglu_fp8.cu) — two reuses and one such SwiGLU per MoE
 * layer and training forward; in the backward the SwiGLU writes the gate and up layers' dy rows for
 * their dgrad (kernels/cuda/swiglu_bwd_rows_fp8.cu), and the combine's backward the down layer's
 * (ops_moe_dispatch.cu), one of each per MoE layer — and the step is the bits
 * of one that quantises x and dy at every use: the
 * loss, every gradient and the norm, over two steps (eager, then recorded). With moe_remat (the
 * default) the SwiGLU's BF16 output is not even stored in the forward (the backward computes it
 * again); without, it is, and kept. */
static void moe_quant_reuse(bool moe_remat) {
    const int64_t B = 2, T = 64, N = B * T;
    dw_graph *g = sm90_mixtral(B, T);
    dw_policy *pol = NULL;
    assert_int_equal(dw_test_policy(g_gpu, "fp8_block", false, &pol), DW_OK);
    unsetenv("DW_MOE_FP8");
    unsetenv("DW_SWIGLU_QUANT");
    unsetenv("DW_SWIGLU_QUANT_BWD");
    dw_compile_opts co;
    dw_compile_opts_init(&co, sizeof co);
    co.moe_remat = moe_remat;
    dw_compiled *c = NULL;
    if (dw_compile(g_gpu, g, NULL, pol, &co, &c) != DW_OK) fail_msg("compile: %s", dw_errmsg(g_gpu));
    int layers = 0;
    for (int i = 0; i < g->n_nodes; i++) layers += g->nodes[i].op == DW_OP_MOE_ROUTER;
    dw_engine *e[2];
    const uint64_t seed = dw_test_next(&g_rng);
    for (int k = 0; k < 2; k++) {
        dw_engine_opts o;
        dw_engine_opts_init(&o, sizeof o);
        o.quant_reuse = k == 0;
        if (dw_engine_create(g_gpu, c, &o, &e[k]) != DW_OK) fail_msg("cuda engine: %s", dw_errmsg(g_gpu));
        assert_int_equal(dw_engine_init_weights(e[k], seed), DW_OK);
    }
    int32_t *x = malloc((size_t)N * 4), *y = malloc((size_t)N * 4);
    dw_adamw_opts ao;
    dw_adamw_opts_init(&ao, sizeof ao);
    int bad = 0;
    for (int step = 1; step <= 2; step++) {
        dw_test_random_tokens(x, N, dw_graph_vocab(g), &g_rng);
        dw_test_random_tokens(y, N, dw_graph_vocab(g), &g_rng);
        double loss[2], gn[2];
        int64_t before[2], fused_before = DW_CUDA_ST(e[0]->be)->swiglu_quant[1], gdiff = 0,
                           bwd_before = DW_CUDA_ST(e[0]->be)->swiglu_quant_bwd[1],
                           comb_before = DW_CUDA_ST(e[0]->be)->combine_quant_bwd;
        for (int k = 0; k < 2; k++) {
            before[k] = DW_CUDA_ST(e[k]->be)->moe_rows_reused;
            assert_int_equal(dw_engine_zero_grad(e[k]), DW_OK);
            if (dw_engine_forward_backward(e[k], x, y, B, T, 1.0, &loss[k]) != DW_OK) fail_msg("%s", dw_errmsg(g_gpu));
        }
        const int64_t reused = DW_CUDA_ST(e[0]->be)->moe_rows_reused - before[0],
                      fused = DW_CUDA_ST(e[0]->be)->swiglu_quant[1] - fused_before,
                      fused_bwd = DW_CUDA_ST(e[0]->be)->swiglu_quant_bwd[1] - bwd_before,
                      comb = DW_CUDA_ST(e[0]->be)->combine_quant_bwd - comb_before;
        for (int i = 0; i < dw_engine_param_count(e[0]); i++) {
            const int64_t n = pnumel(e[0], i);
            float *a = malloc((size_t)n * 4), *b = malloc((size_t)n * 4);
            assert_int_equal(dw_engine_grad_read(e[0], i, a), DW_OK);
            assert_int_equal(dw_engine_grad_read(e[1], i, b), DW_OK);
            for (int64_t j = 0; j < n; j++) gdiff += memcmp(&a[j], &b[j], 4) != 0;
            free(a), free(b);
        }
        for (int k = 0; k < 2; k++) assert_int_equal(dw_engine_step(e[k], &ao, step, &gn[k]), DW_OK);
        printf("moe quant reuse (moe_remat %d) step %d: loss %.9g vs %.9g (every use), %lld gradient values differ "
               "(want 0), %lld reuses, %lld quantising SwiGLUs, %lld SwiGLU and %lld combine backwards writing dy rows "
               "for %d layers (every use: %lld, %lld)\n", moe_remat, step, loss[0], loss[1], (long long)gdiff,
               (long long)reused, (long long)fused, (long long)fused_bwd, (long long)comb, layers,
               (long long)(DW_CUDA_ST(e[1]->be)->moe_rows_reused - before[1]),
               (long long)DW_CUDA_ST(e[1]->be)->swiglu_quant[1]);
        if (loss[0] != loss[1] || gdiff || gn[0] != gn[1]) bad++, printf("MISMATCH step %d\n", step);
        if (step == 1 && (reused != 2 * layers || fused != layers || fused_bwd != layers || comb != layers))
            /* step 2 records: counted at record time */
            bad++, printf("MISMATCH reuses\n");
        if (DW_CUDA_ST(e[1]->be)->moe_rows_reused || DW_CUDA_ST(e[1]->be)->swiglu_quant[1] ||
            DW_CUDA_ST(e[1]->be)->swiglu_quant_bwd[1] || DW_CUDA_ST(e[1]->be)->combine_quant_bwd)
            bad++, printf("MISMATCH reuse without quant_reuse\n");
    }
    free(x), free(y);
    for (int k = 0; k < 2; k++) dw_engine_free(e[k]);
    dw_compiled_free(c);
    dw_policy_free(pol);
    dw_graph_free(g);
    if (bad) fail_msg("%d mismatches (lines above)", bad);
}

static void test_moe_quant_reuse(void **state) {
    (void)state;
    moe_quant_reuse(true);
    moe_quant_reuse(false);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_fp8_experts), cmocka_unit_test(test_fused_cache),
                                       cmocka_unit_test(test_swiglu_fp8_kernel), cmocka_unit_test(test_combine_rows_kernel),
                                       cmocka_unit_test(test_moe_quant_reuse)};
    return cmocka_run_group_tests(tests, setup, teardown);
}
