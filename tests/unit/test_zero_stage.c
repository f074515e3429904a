/* test_zero_stage.c — ZeRO-2/3's gradient staging plan (src/compile/grad_stage.c), against what a
 * training step really does on the CPU engine. Random weights and tokens, dense and MoE presets,
 * with and without recompute and the fused LM head, a random bucket size: the buckets tile the
 * pool on parameter boundaries (every parameter in one bucket, none over the size unless it holds
 * one parameter), in starting order; each bucket's first write is no later than the first step
 * that changes any of its gradients and its ready step no earlier than the last; buckets sharing a
 * slot live apart (the later one first written after the earlier one is final); without reuse
 * every bucket has its own slot. The exact oracle: the backward run step by step with every
 * parameter's gradient written into its bucket's slot (the executor's grad_at), each slot handed
 * to the next bucket as train/dp_stage.c does (the old bucket's floats copied out where a rank
 * would add its reduced part, the slot zeroed), gives the whole gradient pool of an engine without
 * staging bit for bit, for each of two micro-batches. An engine made for ZeRO-1/2 on a rank of 4
 * (dw_engine_opts.zero, the launcher's environment) allocates its shards alone, loads its range of a
 * whole optimizer checkpoint, and refuses what needs the whole state by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture/capture.h"
#include "compile/grad_stage.h"
#include "compile/program.h"
#include "compile/shard.h"
#include "runtime/engine.h"
#include "testutil.h"

#define CTX dw_test_ctx

static int64_t numel(const dw_compiled *p, int k) { return dw_ir_numel(&p->g->tensors[p->param_tensor[k]]); }

/* first[k], last[k]: the first and last program step that changed a float of parameter k's
 * gradient in one training step of the whole engine (-1: none did). */
static void observe(dw_engine *e, const int32_t *x, const int32_t *y, int64_t B, int64_t T, int *first, int *last) {
    const dw_compiled *p = e->p;
    float *before = malloc((size_t)p->param_floats * sizeof *before);
    assert_non_null(before);
    assert_int_equal(dw_engine_zero_grad(e), DW_OK);
    assert_int_equal(dw_exec_set_batch(e->x, x, y, B, T), DW_OK);
    for (int k = 0; k < p->n_params; k++) first[k] = last[k] = -1;
    for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++) {
        dw_exec_begin_phase(e->x, (dw_phase)ph);
        for (int s = p->phase[ph][0]; s < p->phase[ph][1]; s++) {
            memcpy(before, e->x->grad, (size_t)p->param_floats * sizeof *before);
            assert_int_equal(dw_exec_step(e->x, s, true, 1.0), DW_OK);
            for (int k = 0; k < p->n_params; k++)
                if (memcmp(before + p->param_off[k], e->x->grad + p->param_off[k], (size_t)numel(p, k) * sizeof(float))) {
                    if (first[k] < 0) first[k] = s;
                    last[k] = s;
                }
        }
    }
    free(before);
}

/* One micro-batch through the staging: grads of each parameter into its bucket's slot; before a
 * step that first writes a bucket taking over a slot, the slot's bucket added into `acc` (the whole
 * pool's layout) and the slot zeroed; after backward every bucket added. */
static void staged_step(dw_engine *e, const dw_grad_stage *st, float *slots, float *acc, const int32_t *x,
                        const int32_t *y, int64_t B, int64_t T) {
    const dw_compiled *p = e->p;
    int *holder = malloc((size_t)st->n_slots * sizeof *holder); /* each slot's bucket, -1 */
    assert_non_null(holder);
    for (int k = 0; k < st->n_slots; k++) holder[k] = -1;
    memset(slots, 0, (size_t)(st->n_slots * st->slot_floats) * sizeof *slots);
    assert_int_equal(dw_exec_set_batch(e->x, x, y, B, T), DW_OK);
    for (int ph = DW_PHASE_FORWARD; ph <= DW_PHASE_BACKWARD; ph++) {
        dw_exec_begin_phase(e->x, (dw_phase)ph);
        for (int s = p->phase[ph][0]; s < p->phase[ph][1]; s++) {
            for (int i = 0; i < st->n; i++) {
                const dw_stage_bucket *b = &st->b[i];
                if (b->first != s) continue;
                const int j = holder[b->slot];
                float *slot = slots + (int64_t)b->slot * st->slot_floats;
                if (j >= 0) { /* the previous bucket is final: the rank's reduce would add it now */
                    assert_true(st->b[j].ready < s);
                    for (int64_t f = st->b[j].begin; f < st->b[j].end; f++) acc[f] += slot[f - st->b[j].begin];
                    memset(slot, 0, (size_t)st->slot_floats * sizeof *slot);
                }
                holder[b->slot] = i;
            }
            assert_int_equal(dw_exec_step(e->x, s, true, 1.0), DW_OK);
        }
    }
    for (int k = 0; k < st->n_slots; k++) {
        const int j = holder[k];
        if (j < 0) continue;
        const float *slot = slots + (int64_t)k * st->slot_floats;
        for (int64_t f = st->b[j].begin; f < st->b[j].end; f++) acc[f] += slot[f - st->b[j].begin];
    }
    free(holder);
}

static void check_preset(const char *preset, int recompute, bool fused_head) {
    const int64_t B = dw_test_rnd(1, 2), T = dw_test_rnd(4, 16);
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, preset, &mc), DW_OK);
    dw_graph *g = NULL, *g2 = NULL;
    assert_int_equal(dw_capture_config(CTX, &mc, B, T, &g), DW_OK);
    assert_int_equal(dw_capture_config(CTX, &mc, B, T, &g2), DW_OK);
    dw_compile_opts o;
    dw_compile_opts_init(&o, sizeof o);
    o.recompute = recompute, o.fused_head = fused_head;
    dw_test_model whole, staged;
    assert_int_equal(dw_test_model_build_opts(CTX, g, NULL, &o, &whole), DW_OK);
    assert_int_equal(dw_test_model_build_opts(CTX, g2, NULL, &o, &staged), DW_OK);
    const dw_compiled *p = whole.c;
    const int np = p->n_params;
    const int64_t F = p->param_floats, V = g->model.vocab;
    dw_test_random_params(whole.e, &dw_test_group_rng, 0.5f, NULL, 0);
    float *w = malloc((size_t)F * sizeof *w);
    assert_non_null(w);
    assert_int_equal(whole.e->be->i->download(whole.e->be, w, whole.e->x->w, (size_t)F * sizeof *w), DW_OK);
    assert_int_equal(staged.e->be->i->upload(staged.e->be, staged.e->x->w, w, (size_t)F * sizeof *w), DW_OK);
    assert_int_equal(dw_engine_refresh(staged.e), DW_OK);
    int32_t *x = malloc((size_t)(2 * B * T) * sizeof *x), *y = malloc((size_t)(2 * B * T) * sizeof *y);
    int *first = malloc((size_t)np * sizeof *first), *last = malloc((size_t)np * sizeof *last);
    assert_non_null(x), assert_non_null(y), assert_non_null(first), assert_non_null(last);
    dw_test_random_tokens(x, 2 * B * T, V, &dw_test_group_rng);
    dw_test_random_tokens(y, 2 * B * T, V, &dw_test_group_rng);
    observe(whole.e, x, y, B, T, first, last);

    const int64_t size = dw_test_rnd(64, F / 3 + 64);
    for (int reuse = 0; reuse < 2; reuse++) {
        dw_grad_stage st;
        assert_int_equal(dw_grad_stage_plan(CTX, p, size, reuse, &st), DW_OK);
        assert_true(st.n >= 1 && st.n_slots >= 1 && st.n_slots <= st.n && st.slot_floats % 64 == 0);
        if (!reuse) assert_int_equal(st.n_slots, st.n);
        assert_int_equal(dw_grad_stage_bytes(&st), (int64_t)st.n_slots * st.slot_floats * 4);
        char *covered = calloc((size_t)F, 1);
        assert_non_null(covered);
        for (int i = 0; i < st.n; i++) {
            const dw_stage_bucket *b = &st.b[i];
            assert_true(0 <= b->begin && b->begin < b->end && b->end <= F && b->end - b->begin <= st.slot_floats);
            assert_true(b->slot >= 0 && b->slot < st.n_slots);
            for (int64_t f = b->begin; f < b->end; f++) assert_int_equal(covered[f]++, 0);
            int params = 0, lo = -1, hi = -1; /* the parameters inside: whole, and their writers */
            for (int k = 0; k < np; k++) {
                const int64_t a = p->param_off[k], e = a + numel(p, k);
                if (a >= b->end || e <= b->begin) continue;
                assert_true(a >= b->begin && e <= b->end); /* cut on parameter boundaries */
                params++;
                if (first[k] >= 0 && (lo < 0 || first[k] < lo)) lo = first[k];
                if (last[k] > hi) hi = last[k];
            }
            assert_true(params >= 1);
            if (params > 1) assert_true(b->end - b->begin <= size); /* a lone parameter may exceed it */
            if (lo >= 0) assert_true(b->first <= lo);
            assert_true(b->ready >= hi);
            if (i > 0) assert_true(st.b[i - 1].ready < b->ready || (st.b[i - 1].ready == b->ready && st.b[i - 1].begin > b->begin));
            for (int j = 0; j < i; j++) /* a shared slot: one lifetime after the other */
                if (st.b[j].slot == b->slot)
                    assert_true(st.b[j].ready < b->first || b->ready < st.b[j].first);
        }
        for (int64_t f = 0; f < F; f++) assert_int_equal(covered[f], 1);
        free(covered);

        /* the oracle: each of two micro-batches, whole vs staged, bit for bit */
        float *slots = calloc((size_t)(st.n_slots * st.slot_floats), sizeof *slots);
        float *acc = calloc((size_t)F, sizeof *acc), *want = malloc((size_t)F * sizeof *want);
        float **at = calloc((size_t)np, sizeof *at);
        assert_non_null(slots), assert_non_null(acc), assert_non_null(want), assert_non_null(at);
        for (int i = 0; i < st.n; i++)
            for (int k = 0; k < np; k++)
                if (p->param_off[k] >= st.b[i].begin && p->param_off[k] < st.b[i].end)
                    at[k] = slots + (int64_t)st.b[i].slot * st.slot_floats + (p->param_off[k] - st.b[i].begin);
        for (int k = 0; k < np; k++) assert_non_null(at[k]);
        for (int mb = 0; mb < 2; mb++) {
            const int32_t *xm = x + mb * B * T, *ym = y + mb * B * T;
            assert_int_equal(dw_engine_zero_grad(whole.e), DW_OK);
            assert_int_equal(dw_engine_forward_backward(whole.e, xm, ym, B, T, 1.0, NULL), DW_OK);
            assert_int_equal(whole.e->be->i->download(whole.e->be, want, whole.e->x->grad, (size_t)F * sizeof *want),
                             DW_OK);
            memset(acc, 0, (size_t)F * sizeof *acc);
            staged.e->x->grad_at = at;
            staged_step(staged.e, &st, slots, acc, xm, ym, B, T);
            staged.e->x->grad_at = NULL;
            for (int64_t f = 0; f < F; f++)
                if (memcmp(&acc[f], &want[f], sizeof *acc))
                    fail_msg("%s (recompute %d, fused head %d, buckets of %lld, reuse %d): gradient float %lld staged "
                             "%.9g, whole %.9g", preset, recompute, fused_head, (long long)size, reuse, (long long)f,
                             acc[f], want[f]);
        }
        free(slots), free(acc), free(want), free(at);
        dw_grad_stage_free(&st);
    }
    free(x), free(y), free(first), free(last), free(w);
    dw_test_model_free(&whole);
    dw_test_model_free(&staged);
}

static void test_dense(void **state) {
    (void)state;
    for (int rep = 0; rep < 2; rep++) {
        check_preset("gpt2-tiny", DW_RECOMPUTE_NONE, rep == 1);
        check_preset("llama-tiny", rep == 1 ? DW_RECOMPUTE_FULL : DW_RECOMPUTE_NONE, rep == 0);
    }
}

static void test_moe(void **state) {
    (void)state;
    check_preset("mixtral-tiny", DW_RECOMPUTE_NONE, false);
    check_preset("mixtral-tiny", DW_RECOMPUTE_FULL, true);
}

/* Slots are reused: with buckets of one parameter each, a model of several blocks needs fewer slots
 * than buckets when the reductions start during backward. */
static void test_reuse(void **state) {
    (void)state;
    dw_model_config mc;
    assert_int_equal(dw_model_config_load(CTX, "llama-tiny", &mc), DW_OK);
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(CTX, &mc, 1, 8, &g), DW_OK);
    dw_test_model m;
    assert_int_equal(dw_test_model_build_opts(CTX, g, NULL, NULL, &m), DW_OK);
    dw_grad_stage st;
    assert_int_equal(dw_grad_stage_plan(CTX, m.c, 64, true, &st), DW_OK);
    assert_true(st.n >= 4 && st.n_slots < st.n);
    dw_grad_stage_free(&st);
    dw_grad_stage_free(&st); /* harmless twice */
    dw_test_model_free(&m);
}

/* An engine made for ZeRO on rank r of 4 (the launcher's environment) allocates its shards alone:
 * the moments of its range (ZeRO-1, 2), the gradients too (ZeRO-2); a whole optimizer checkpoint
 * loads its range; what needs the whole state is refused by name; a stage out of range and a
 * malformed environment too; one rank allocates the whole pools. */
static void test_engine_made_sharded(void **state) {
    (void)state;
    dw_test_rng *rng = &dw_test_group_rng;
    const int64_t B = 1, T = 8;
    dw_graph *g = dw_test_small_graph(CTX, "gpt2-tiny", B, T, rng);
    assert_non_null(g);
    dw_test_model whole;
    assert_int_equal(dw_test_model_build(CTX, g, NULL, DW_DEVICE_AUTO, &whole), DW_OK);
    const dw_compiled *p = whole.c;
    const int64_t F = p->param_floats, V = g->model.vocab;
    int32_t x[8], y[8];
    dw_test_random_tokens(x, B * T, V, rng);
    dw_test_random_tokens(y, B * T, V, rng);
    dw_test_random_params(whole.e, rng, 0.3f, NULL, 0);
    double first, last;
    assert_int_equal(dw_test_train_fixed(whole.e, x, y, B, T, 2, 1e-2, &first, &last), DW_OK);
    char *dir = dw_test_tmpdir(), *opath = dw_test_path(dir, "optimizer.safetensors");
    assert_int_equal(dw_engine_save_optimizer(whole.e, opath), DW_OK);
    float *m = malloc((size_t)F * sizeof *m), *got = malloc((size_t)F * sizeof *got);
    assert_non_null(m), assert_non_null(got);
    assert_int_equal(whole.e->be->i->download(whole.e->be, m, whole.e->x->m, (size_t)F * sizeof *m), DW_OK);

    const int world = 4, rank = (int)(dw_test_next(rng) % 4);
    char rs[8];
    snprintf(rs, sizeof rs, "%d", rank);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    setenv("WORLD_SIZE", "4", 1), setenv("RANK", rs, 1), setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29511", 1);
    int64_t lo, hi;
    dw_shard_range(F, world, rank, &lo, &hi);
    assert_true(hi > lo);
    for (int zero = 1; zero <= 2; zero++) {
        dw_engine_opts eo;
        dw_engine_opts_init(&eo, sizeof eo);
        eo.zero = zero;
        dw_engine *e = NULL;
        if (dw_engine_create(CTX, p, &eo, &e) != DW_OK) fail_msg("ZeRO-%d engine: %s", zero, dw_errmsg(CTX));
        int64_t planned[DW_POOL_COUNT];
        dw_shard_pool_bytes(p->pool_bytes, F, world, zero, planned);
        assert_int_equal(e->x->pool_bytes[DW_POOL_OPTIM], 8 * (hi - lo));
        assert_true(e->x->pool_bytes[DW_POOL_OPTIM] <= planned[DW_POOL_OPTIM]);
        assert_int_equal(e->x->pool_bytes[DW_POOL_GRADS], zero >= 2 ? 4 * (hi - lo) : p->pool_bytes[DW_POOL_GRADS]);
        assert_true(e->x->pool_bytes[DW_POOL_GRADS] <= planned[DW_POOL_GRADS]);
        assert_int_equal(e->x->pool_bytes[DW_POOL_WEIGHTS], p->pool_bytes[DW_POOL_WEIGHTS]);
        assert_int_equal(dw_engine_load_optimizer(e, opath), DW_OK); /* its range of the whole file */
        assert_int_equal(e->be->i->download(e->be, got, e->x->m, (size_t)(hi - lo) * sizeof *got), DW_OK);
        assert_memory_equal(got, m + lo, (size_t)(hi - lo) * sizeof *got);
        double norm = 0;
        assert_int_equal(dw_engine_step(e, NULL, 3, &norm), DW_ERR_UNSUPPORTED);
        assert_non_null(strstr(dw_errmsg(CTX), "ZeRO shard"));
        double ms[512] = {0}, ms_zero = 0;
        assert_true(p->n_steps <= 512);
        assert_int_equal(dw_engine_time_optimizer(e, NULL, 3, ms, &ms_zero), DW_ERR_UNSUPPORTED); /* not over the shard */
        assert_non_null(strstr(dw_errmsg(CTX), "ZeRO shard"));
        const dw_status fb = dw_engine_forward_backward(e, x, y, B, T, 1.0, NULL);
        assert_int_equal(fb, zero >= 2 ? DW_ERR_UNSUPPORTED : DW_OK);
        if (zero >= 2) assert_non_null(strstr(dw_errmsg(CTX), "ZeRO-2/3 shard"));
        assert_int_equal(dw_engine_grad_read(e, 0, got), zero >= 2 ? DW_ERR_UNSUPPORTED : DW_OK);
        assert_int_equal(dw_engine_zero_grad(e), DW_OK);
        dw_engine_free(e);
    }
    dw_engine_opts eo;
    dw_engine_opts_init(&eo, sizeof eo);
    dw_engine *e = NULL;
    eo.zero = 4; /* out of range */
    assert_int_equal(dw_engine_create(CTX, p, &eo, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "dw_engine_opts.zero"));
    assert_null(e);
    eo.zero = 2;
    setenv("RANK", "x1", 1); /* malformed: named */
    assert_int_equal(dw_engine_create(CTX, p, &eo, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "RANK"));
    unsetenv("WORLD_SIZE"), unsetenv("RANK"), unsetenv("MASTER_ADDR"), unsetenv("MASTER_PORT");
    assert_int_equal(dw_engine_create(CTX, p, &eo, &e), DW_OK); /* one rank: whole */
    for (int k = 0; k < DW_POOL_COUNT; k++) assert_int_equal(e->x->pool_bytes[k], p->pool_bytes[k]);
    dw_engine_free(e);
    dw_test_rmtree(dir);
    free(dir), free(opath), free(m), free(got);
    dw_test_model_free(&whole);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_reuse),
        cmocka_unit_test(test_engine_made_sharded),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
