/* test_quant_counts_cuda.c — the quantisers' counters on the GPU (precision/quant_counts.cu)
 * against the CPU's (precision/quant_counts.c), exactly: fresh random tensors with planted
 * values (1e-12 of the spread: flushed; block maxima of mantissa 1.9: saturated under FLOOR MX
 * scales; exact zeros), ragged shapes (some over 262144 elements, so that the kernel's 1024 CTAs
 * loop), FP32 and BF16 inputs, row-wise and transposed, every recipe. (1) The CPU reference's codes and scales uploaded and counted by the kernel: the same
 * counts as dw_qcounts_add_cpu on them. (2) On a GPU (not the host emulator, which has no PTX
 * conversions), the operand quantised by dw_quantize_cuda and counted there: the same counts as
 * the CPU reference's quantisation counted on the CPU; and the quantiser counting as it quantises
 * (dw_quant_dev_out.counts, precision/quant_counts.cuh), both copies of a transposing call, under
 * the default tuning (the kernels built to count), the older kernels (kernel 1) and a bulk
 * tuning without a counting build (t_store 3: the pass after it): the same counts again, and the
 * elements. Counters start at random values (the kernels add) and guard words after them stay
 * untouched. (3) A CUDA engine's training: the counters against the checks' measurements
 * (test_training), and the reused x copies' counts folded at the read (reused_x_counts). Label
 * gpu. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/fileio.h"
#include "formats/formats.h"
#include "gpu_upload.h"
#include "kernels/cuda/quant.h"
#include "precision/quant_counts.h"
#include "runtime/cuda/cuda.h"
#include "runtime/engine.h"
#include "testutil.h"

static void ok(cudaError_t e, const char *what) {
    if (e != cudaSuccess) fail_msg("%s: %s", what, cudaGetErrorString(e));
}

/* x [rows, cols]: spread x normal, with planted tiny values, zeros and (1.9 x 2^k) maxima. */
static void planted(dw_test_rng *rng, float *x, int64_t n) {
    const float spread = ldexpf(1.0f, (int)dw_test_rnd(-20, 20));
    for (int64_t i = 0; i < n; i++) {
        const int64_t pick = dw_test_rnd(0, 40);
        x[i] = pick == 0 ? 0.0f : pick == 1 ? 1e-12f * spread : pick == 2 ? -15.2f * spread : spread * dw_test_normal(rng);
    }
}

#define GUARD 0xA5A5A5A5A5A5A5A5ull

/* A device counter (DW_QC_WORDS words) starting at base, with two guard words after it. */
static uint64_t *counter(const uint64_t base[DW_QC_WORDS]) {
    uint64_t h[DW_QC_WORDS + 2] = {base[0], base[1], base[2], GUARD, GUARD};
    return dw_test_to_dev(h, sizeof h);
}
/* What was added to counter dc since base (the guard words untouched), then dc freed. */
static void counted(uint64_t *dc, const uint64_t base[DW_QC_WORDS], uint64_t out[DW_QC_WORDS]) {
    uint64_t h[DW_QC_WORDS + 2];
    ok(cudaMemcpy(h, dc, sizeof h, cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (h[DW_QC_WORDS] != GUARD || h[DW_QC_WORDS + 1] != GUARD) fail_msg("counters: write past the counter");
    for (int k = 0; k < DW_QC_WORDS; k++) out[k] = h[k] - base[k];
    cudaFree(dc);
}

/* The kernel's counts of (codes, scales, s_t) against x (device), on counters starting at `base`. */
static void gpu_count(dw_ctx *g, dw_recipe r, bool bf16, const void *dx, int64_t rows, int64_t cols, bool trans,
                      const void *dcodes, const void *dscales, const float *dts, const uint64_t base[DW_QC_WORDS],
                      uint64_t out[DW_QC_WORDS]) {
    uint64_t *dc = counter(base);
    if (dw_qcounts_add_cuda(g, r, bf16, dx, rows, cols, trans, dcodes, dscales, dts, dc, NULL) != DW_OK)
        fail_msg("%s", dw_errmsg(g));
    counted(dc, base, out);
}

static bool same(const uint64_t a[DW_QC_WORDS], const uint64_t b[DW_QC_WORDS]) {
    return a[0] == b[0] && a[1] == b[1] && a[2] == b[2];
}

/* (2b) x [rows, cols] (device) quantised by dw_quantize_cuda with counting on, under tuning t
 * (NULL: the defaults): row-wise alone, or (trans) both copies into their own counters; each
 * copy's counts equal want_rows / want_t (the CPU's on the reference codes, with the elements). */
static void fused(dw_ctx *g, const dw_quant_opts *o, bool bf16, const void *dx, int64_t rows, int64_t cols, bool trans,
                  const uint64_t want_rows[DW_QC_WORDS], const uint64_t want_t[DW_QC_WORDS],
                  const dw_quant_tuning *t, const char *what) {
    const dw_recipe r = o->recipe;
    uint8_t *c[2] = {NULL, NULL};
    void *sc[2] = {NULL, NULL};
    float *ts[2] = {NULL, NULL};
    uint64_t *dc[2] = {NULL, NULL}, base[2][DW_QC_WORDS], got[2][DW_QC_WORDS];
    dw_quant_dev_out d[2];
    for (int k = 0; k < 2; k++) {
        const int64_t R = k ? cols : rows, C = k ? rows : cols;
        ok(cudaMalloc((void **)&c[k], dw_quant_codes_bytes(r, R, C) + 1), "cudaMalloc");
        ok(cudaMalloc(&sc[k], dw_quant_scales_bytes(r, R, C) + 4), "cudaMalloc");
        ok(cudaMalloc((void **)&ts[k], 4), "cudaMalloc");
        for (int w = 0; w < DW_QC_WORDS; w++) base[k][w] = dw_test_next(&dw_test_group_rng) >> 8;
        dc[k] = counter(base[k]);
        d[k] = (dw_quant_dev_out){.codes = c[k], .scales = sc[k], .tensor_scale = ts[k], .counts = dc[k]};
    }
    void *ws = NULL;
    const size_t wb = dw_quantize_cuda_workspace_bytes(r, rows, cols);
    if (wb) ok(cudaMalloc(&ws, wb), "cudaMalloc");
    if (dw_quantize_cuda_set_tuning(g, t) != DW_OK) fail_msg("%s", dw_errmsg(g));
    const dw_status st = dw_quantize_cuda(g, o, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, dx, rows, cols, &d[0],
                                          trans ? &d[1] : NULL, ws, NULL);
    dw_quantize_cuda_set_tuning(g, NULL);
    if (st != DW_OK) fail_msg("%s: %s", what, dw_errmsg(g));
    for (int k = 0; k < 2; k++) {
        counted(dc[k], base[k], got[k]);
        static const uint64_t zero[DW_QC_WORDS] = {0, 0, 0};
        const uint64_t *want = k ? (trans ? want_t : zero) : want_rows;
        if (!same(got[k], want))
            fail_msg("%s %s%s%s [%lld, %lld], %s copy counted as it quantised: %llu / %llu / %llu, CPU %llu / %llu / %llu",
                     what, dw_recipe_name(r), trans ? " +T" : "", bf16 ? " bf16" : "", (long long)rows, (long long)cols,
                     k ? "transposed" : "row-wise", (unsigned long long)got[k][0], (unsigned long long)got[k][1],
                     (unsigned long long)got[k][2], (unsigned long long)want[0], (unsigned long long)want[1],
                     (unsigned long long)want[2]);
        cudaFree(c[k]), cudaFree(sc[k]), cudaFree(ts[k]);
    }
    cudaFree(ws);
}

static void test_against_cpu(void **state) {
    (void)state;
#ifndef DW_CUDA_EMU
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) skip();
#endif
    dw_ctx *cpu = dw_test_ctx, *gpu = dw_test_ctx; /* (the CUDA calls use a context for their errors only) */
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
#ifdef DW_CUDA_EMU
    const bool real_gpu = false;
#else
    const bool real_gpu = true;
#endif
    for (int r = 0; r < DW_RECIPE_COUNT; r++) {
        if (r == DW_RECIPE_BF16) continue;
        for (int variant = 0; variant < 8; variant++) {
            const bool trans = variant & 1, bf16 = variant & 2, alt = variant & 4;
            const bool big = variant < 2; /* more elements than 1024 CTAs' threads: the kernel's grid-stride loop */
            const int64_t rows = big ? dw_test_rnd(500, 700) : dw_test_rnd(1, 200), cols = big ? dw_test_rnd(530, 700) : dw_test_rnd(1, 200),
                          n = rows * cols;
            float *x = malloc((size_t)n * sizeof *x);
            uint16_t *xb = malloc((size_t)n * sizeof *xb);
            planted(&rng, x, n);
            for (int64_t i = 0; i < n; i++) xb[i] = dw_encode_bf16(x[i]), x[i] = bf16 ? dw_decode_bf16(xb[i]) : x[i];
            const dw_quant_opts o = {.recipe = (dw_recipe)r, .rounding = alt ? DW_SCALE_FLOOR : DW_SCALE_RCEIL, .pow2 = alt};
            const int64_t R = trans ? cols : rows, C = trans ? rows : cols;
            const size_t cb = dw_quant_codes_bytes((dw_recipe)r, R, C), sb = dw_quant_scales_bytes((dw_recipe)r, R, C);
            dw_qtensor q = {.recipe = (dw_recipe)r, .rows = R, .cols = C, .codes = malloc(cb + 1), .scales = malloc(sb + 4)};
            float *y = malloc((size_t)n * sizeof *y);
            assert_int_equal(trans ? dw_quantize_transposed_cpu(cpu, &o, x, rows, cols, &q)
                                   : dw_quantize_cpu(cpu, &o, x, rows, cols, &q),
                             DW_OK);
            uint64_t want[DW_QC_WORDS] = {0}, got[DW_QC_WORDS];
            dw_qcounts_add_cpu(&q, x, trans, y, want);
            assert_true(want[DW_QC_N] == (uint64_t)n);
            const uint64_t base[DW_QC_WORDS] = {dw_test_next(&rng) >> 8, dw_test_next(&rng) >> 8, dw_test_next(&rng) >> 8};
            void *dx = dw_test_to_dev(bf16 ? (void *)xb : (void *)x, (size_t)n * (bf16 ? 2 : 4));
            void *dcodes = dw_test_to_dev(q.codes, cb), *dscales = dw_test_to_dev(q.scales, sb);
            float *dts = dw_test_to_dev(&q.tensor_scale, sizeof(float));
            gpu_count(gpu, (dw_recipe)r, bf16, dx, rows, cols, trans, dcodes, dscales, dts, base, got);
            if (!same(got, want))
                fail_msg("%s%s%s%s [%lld, %lld], CPU codes: GPU counted %llu / %llu, CPU %llu / %llu",
                         dw_recipe_name((dw_recipe)r), trans ? " transposed" : "", bf16 ? " bf16" : "", alt ? " floor/pow2" : "",
                         (long long)rows, (long long)cols, (unsigned long long)got[0], (unsigned long long)got[1],
                         (unsigned long long)want[0], (unsigned long long)want[1]);
            if (real_gpu) { /* the GPU's own quantisation, counted there */
                uint8_t *gc = NULL;
                void *gs = NULL;
                float *gts = NULL;
                ok(cudaMalloc((void **)&gc, cb + 1), "cudaMalloc");
                ok(cudaMalloc(&gs, sb + 4), "cudaMalloc");
                ok(cudaMalloc((void **)&gts, 4), "cudaMalloc");
                void *ws = NULL;
                const size_t wb = dw_quantize_cuda_workspace_bytes((dw_recipe)r, rows, cols);
                if (wb) ok(cudaMalloc(&ws, wb), "cudaMalloc");
                dw_quant_dev_out d = {.codes = gc, .scales = gs, .tensor_scale = gts}, full = d;
                uint8_t *rc = NULL; /* the row-wise copy a transposed call may need */
                void *rs = NULL;
                float *rts = NULL;
                if (trans) {
                    ok(cudaMalloc((void **)&rc, dw_quant_codes_bytes((dw_recipe)r, rows, cols) + 1), "cudaMalloc");
                    ok(cudaMalloc(&rs, dw_quant_scales_bytes((dw_recipe)r, rows, cols) + 4), "cudaMalloc");
                    ok(cudaMalloc((void **)&rts, 4), "cudaMalloc");
                    full = (dw_quant_dev_out){.codes = rc, .scales = rs, .tensor_scale = rts};
                }
                if (dw_quantize_cuda(gpu, &o, bf16 ? DW_QUANT_IN_BF16 : DW_QUANT_IN_F32, dx, rows, cols, trans ? &full : &d,
                                     trans ? &d : NULL, ws, NULL) != DW_OK)
                    fail_msg("%s", dw_errmsg(gpu));
                gpu_count(gpu, (dw_recipe)r, bf16, dx, rows, cols, trans, gc, gs, gts, base, got);
                if (!same(got, want))
                    fail_msg("%s%s%s [%lld, %lld], GPU quantiser: counted %llu / %llu, CPU %llu / %llu",
                             dw_recipe_name((dw_recipe)r), trans ? " transposed" : "", bf16 ? " bf16" : "", (long long)rows,
                             (long long)cols, (unsigned long long)got[0], (unsigned long long)got[1],
                             (unsigned long long)want[0], (unsigned long long)want[1]);
                cudaFree(gc), cudaFree(gs), cudaFree(gts), cudaFree(ws), cudaFree(rc), cudaFree(rs), cudaFree(rts);
                /* (2b) counted as quantised: both copies' counts from the CPU on the reference codes */
                uint64_t wr[DW_QC_WORDS] = {0}, wt[DW_QC_WORDS] = {0};
                dw_qtensor qr = {.recipe = (dw_recipe)r, .rows = rows, .cols = cols,
                                 .codes = malloc(dw_quant_codes_bytes((dw_recipe)r, rows, cols) + 1),
                                 .scales = malloc(dw_quant_scales_bytes((dw_recipe)r, rows, cols) + 4)};
                assert_int_equal(dw_quantize_cpu(cpu, &o, x, rows, cols, &qr), DW_OK);
                dw_qcounts_add_cpu(&qr, x, false, y, wr);
                if (trans) memcpy(wt, want, sizeof wt);
                const dw_quant_tuning older = {.kernel = 1}, uncounted_bulk = {.t_store = 3};
                fused(gpu, &o, bf16, dx, rows, cols, trans, wr, wt, NULL, "default kernels");
                fused(gpu, &o, bf16, dx, rows, cols, trans, wr, wt, &older, "kernel 1");
                fused(gpu, &o, bf16, dx, rows, cols, trans, wr, wt, &uncounted_bulk, "t_store 3");
                free(qr.codes), free(qr.scales);
            }
            cudaFree(dx), cudaFree(dcodes), cudaFree(dscales), cudaFree(dts);
            free(x), free(xb), free(y), free(q.codes), free(q.scales);
        }
    }
}

/* The reused x copies' counts, folded when the guard reads the counters (train/guard_counts.c):
 * in each step's counts lines of run `out` (engine e, `rows` tokens a step), every layer reading
 * the same x (q/k/v, gate/up: one quantisation of it) reports the same x overflows, underflows
 * and elements, and the elements are rows x K per quantised copy (fprop x, wgrad x^T), as when
 * each reusing layer added the copy's counts on the device. */
static void reused_x_counts(dw_engine *e, const char *out, int64_t steps, int64_t rows, const char *what) {
    char *qp = dw_test_path(out, "quant_stats.jsonl");
    json_t *lines = dw_test_json_lines(qp);
    assert_non_null(lines);
    int shared = 0;
    for (int64_t step = 1; step <= steps; step++) {
        enum { MAXT = 1024 };
        long long first[MAXT][3];
        int seen[MAXT] = {0};
        for (size_t i = 0; i < json_array_size(lines); i++) {
            const json_t *j = json_array_get(lines, i), *kind = json_object_get(j, "counts");
            if (json_integer_value(json_object_get(j, "step")) != step || !kind || strcmp(json_string_value(kind), "x")) continue;
            const char *name = json_string_value(json_object_get(j, "layer"));
            int node = -1;
            for (int k = 0; k < e->g->n_nodes && node < 0; k++)
                if (!strcmp(e->g->nodes[k].name, name)) node = k;
            assert_true(node >= 0);
            const int t = e->g->nodes[node].in[0];
            assert_true(t >= 0 && t < MAXT);
            const long long c[3] = {json_integer_value(json_object_get(j, "overflow")),
                                    json_integer_value(json_object_get(j, "underflow")),
                                    json_integer_value(json_object_get(j, "elements"))};
            const long long copy = (long long)rows * e->p->tensor[t].width;
            if (c[2] != copy && c[2] != 2 * copy)
                fail_msg("%s step %lld: %s counted %lld x elements, not 1 or 2 copies of %lld", what, (long long)step, name,
                         c[2], copy);
            if (seen[t] && memcmp(c, first[t], sizeof c))
                fail_msg("%s step %lld: %s counted x %lld / %lld / %lld, a layer reading the same x %lld / %lld / %lld", what,
                         (long long)step, name, c[0], c[1], c[2], first[t][0], first[t][1], first[t][2]);
            if (!seen[t]) memcpy(first[t], c, sizeof c);
            shared += seen[t]++ > 0;
        }
    }
    assert_true(shared > 0); /* llama's k, v and up share an x */
    json_decref(lines);
    free(qp);
}

/* One fp8_block training like test_training's (options o) but with the guard's check every other
 * step, so that the steps between run the SwiGLU's fusions (a check step measures BF16 dy, so its
 * backward leaves the gradients' quantisation to the layers): once with them (the forward writing
 * the down layer's rows, the backward the gate and up layers' dy and dy^T) and once with
 * DW_SWIGLU_QUANT=0; the norms writing their layers' x rows too (DW_NORM_QUANT=0 in the second).
 * The fusions ran in the first and none in the second (dw_cuda_state.swiglu_quant,
 * swiglu_quant_bwd, norm_quant), and quant_stats.jsonl — every layer's x, w and
 * dy counts summed over the steps, and the checks' measurements — is byte for byte the same. */
static void swiglu_counts_same(dw_ctx *gpu, const char *model, const dw_policy *pol, const dw_train_opts *o,
                               const char *dir, const char *what) {
    const uint64_t model_seed = dw_test_next(&dw_test_group_rng);
    char *t[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    int64_t fwd[2], bwd[2], nq[2];
    for (int apart = 0; apart < 2; apart++) {
        if (apart) setenv("DW_SWIGLU_QUANT", "0", 1), setenv("DW_NORM_QUANT", "0", 1);
        dw_model *m = dw_test_open_model(gpu, model, model_seed, pol, 4, 64);
        assert_non_null(m);
        char name[64];
        snprintf(name, sizeof name, "%s-every2-%d", strrchr(o->out_dir, '/') + 1, apart); /* beside the run's own */
        char *out = dw_test_path(dir, name);
        dw_train_opts a = *o;
        a.out_dir = out, a.quant_check_every = 2;
        const dw_status st = dw_train(dw_model_engine(m), &a);
        unsetenv("DW_SWIGLU_QUANT"), unsetenv("DW_NORM_QUANT");
        if (st != DW_OK) fail_msg("%s", dw_errmsg(gpu));
        const dw_cuda_state *cs = DW_CUDA_ST(dw_model_engine(m)->be);
        fwd[apart] = cs->swiglu_quant[0], bwd[apart] = cs->swiglu_quant_bwd[0], nq[apart] = cs->norm_quant;
        char *p = dw_test_path(out, "quant_stats.jsonl");
        if (dw_read_file(gpu, p, &t[apart], &n[apart]) != DW_OK) fail_msg("%s", dw_errmsg(gpu));
        free(p), free(out);
        dw_model_free(m);
    }
    printf("%s, a check every 2 steps: fused SwiGLU forwards %lld, backwards %lld, norms %lld (DW_SWIGLU_QUANT=0 "
           "DW_NORM_QUANT=0: %lld, %lld, %lld); quant_stats.jsonl %zu bytes, apart %zu\n", what, (long long)fwd[0],
           (long long)bwd[0], (long long)nq[0], (long long)fwd[1], (long long)bwd[1], (long long)nq[1], n[0], n[1]);
    if (fwd[0] < 2 || bwd[0] < 2 || nq[0] < 2) fail_msg("%s: the SwiGLU's or the norms' fusions did not run", what);
    if (fwd[1] || bwd[1] || nq[1]) fail_msg("%s: a fusion ran under DW_SWIGLU_QUANT=0 DW_NORM_QUANT=0", what);
    if (n[0] != n[1] || memcmp(t[0], t[1], n[0])) fail_msg("%s: quant_stats.jsonl differs with the fusions", what);
    free(t[0]), free(t[1]);
}

/* A CUDA engine's training (mxfp4, mxfp8, fp8_block; a check every step, no fallback), with the
 * check on the host (DW_QCHECK_DEVICE=0: x, W and dy read back) and on the device (=1,
 * guard_check_cuda.c): each layer's counted w and dy equal the check's measurements of the same
 * values — overflows, underflows and elements (the GPU quantisers are bit-identical to the
 * reference; only the copies a quantised GEMM reads are counted and measured: sm90 runs the
 * fp8_block dgrad of k/v_proj, M = 64, in BF16, so their W^T is neither) — and metrics.jsonl's
 * totals the layers' sums (testutil's dw_test_quant_counts_check): the counting in qlinear_cuda.c's
 * quantisers, the check steps' dy measurement and the recorded steps around them; and each step's
 * x counts alike in the layers that read one quantisation of x (reused_x_counts). Under fp8_block,
 * the SwiGLU's fusions count what they quantise as the layers would (swiglu_counts_same). */
static void test_training(void **state) {
    (void)state;
#ifdef DW_CUDA_EMU
    skip(); /* no engine on the emulator */
#else
    dw_ctx *cpu = NULL, *gpu = NULL;
    if (dw_test_cpu_gpu_setup(&cpu, &gpu) != 0) skip();
    char *dir = dw_test_tmpdir();
    char *model = dw_test_model_dir(dir, "{\"model_type\": \"llama\", \"vocab_size\": 256, \"hidden_size\": 128, "
                                         "\"num_hidden_layers\": 2, \"num_attention_heads\": 2, \"num_key_value_heads\": 1, "
                                         "\"intermediate_size\": 256, \"max_position_embeddings\": 64}");
    const char *recipes[3] = {"mxfp4", "mxfp8", "fp8_block"};
    const char *had = getenv("DW_QCHECK_DEVICE");
    char *kept = had ? strdup(had) : NULL;
    for (int run = 0; run < 6; run++) {
        const int r = run % 3, on_device = run / 3;
        setenv("DW_QCHECK_DEVICE", on_device ? "1" : "0", 1);
        char what[64];
        snprintf(what, sizeof what, "%s, DW_QCHECK_DEVICE=%d", recipes[r], on_device);
        printf("%s\n", what);
        dw_policy *pol = NULL;
        assert_int_equal(dw_policy_from_precision(gpu, recipes[r], false, &pol), DW_OK);
        dw_model *m = dw_test_open_model(gpu, model, dw_test_next(&dw_test_group_rng), pol, 4, 64);
        assert_non_null(m);
        char name[32];
        snprintf(name, sizeof name, "%s-%d", recipes[r], on_device);
        char *out = dw_test_path(dir, name);
        dw_train_opts o;
        dw_train_opts_init(&o, sizeof o);
        o.data = "builtin", o.out_dir = out, o.steps = 4, o.batch = 4, o.seq = 64, o.global_batch = 4;
        o.eval_every = 0, o.ckpt_minutes = 0, o.seed = dw_test_next(&dw_test_group_rng) >> 1;
        o.quant_check_every = 1, o.quant_fallback_after = 0;
        if (dw_train(dw_model_engine(m), &o) != DW_OK) fail_msg("%s", dw_errmsg(gpu));
        if (r == 2) swiglu_counts_same(gpu, model, pol, &o, dir, what);
        for (int64_t step = 2; step <= 4; step++) {
            int layers = 0;
            long long w_under = 0;
            if (dw_test_quant_counts_check(out, step, &layers, &w_under) != 0)
                fail_msg("%s: step %lld", what, (long long)step);
            assert_int_equal(layers, 14);
            if (r == 0) assert_true(w_under > 0); /* E2M1 flushes normal weights' small values */
        }
        reused_x_counts(dw_model_engine(m), out, 4, 4 * 64, what);
        dw_model_free(m);
        dw_policy_free(pol);
        free(out);
    }
    if (kept) setenv("DW_QCHECK_DEVICE", kept, 1);
    else unsetenv("DW_QCHECK_DEVICE");
    free(kept);
    dw_test_rmtree(dir);
    free(model), free(dir);
    dw_test_cpu_gpu_teardown(cpu, gpu);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_cpu),
        cmocka_unit_test(test_training),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
