/* test_plan_mla.c — the MoE-at-scale pieces of the planner (issue 33): DeepSeek-V3's config
 * (config.json and preset, MLA ranks, exact parameter counts, capture's refusal), the
 * node-limited all-to-all against hand arithmetic, and the overlapped 1F1B and DualPipe
 * simulations against an independent replay on random shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "capture/capture.h"
#include "capture/model_config_impl.h"
#include "plan/layout.h"
#include "test_plan_common.h"
#include "testutil.h"

/* DeepSeek-V3's config.json as published (deepseek-ai/DeepSeek-V3), quantization block left out. */
static const char *DSV3 =
    "{\"architectures\":[\"DeepseekV3ForCausalLM\"],\"attention_bias\":false,\"first_k_dense_replace\":3,"
    "\"hidden_act\":\"silu\",\"hidden_size\":7168,\"initializer_range\":0.02,\"intermediate_size\":18432,"
    "\"kv_lora_rank\":512,\"max_position_embeddings\":163840,\"model_type\":\"deepseek_v3\","
    "\"moe_intermediate_size\":2048,\"moe_layer_freq\":1,\"n_group\":8,\"n_routed_experts\":256,"
    "\"n_shared_experts\":1,\"norm_topk_prob\":true,\"num_attention_heads\":128,\"num_experts_per_tok\":8,"
    "\"num_hidden_layers\":61,\"num_key_value_heads\":128,\"num_nextn_predict_layers\":1,\"q_lora_rank\":1536,"
    "\"qk_nope_head_dim\":128,\"qk_rope_head_dim\":64,\"rms_norm_eps\":1e-06,\"rope_scaling\":{\"beta_fast\":32,"
    "\"beta_slow\":1,\"factor\":40,\"mscale\":1.0,\"mscale_all_dim\":1.0,\"original_max_position_embeddings\":4096,"
    "\"type\":\"yarn\"},\"rope_theta\":10000,\"routed_scaling_factor\":2.5,\"scoring_func\":\"sigmoid\","
    "\"tie_word_embeddings\":false,\"topk_group\":4,\"topk_method\":\"noaux_tc\",\"v_head_dim\":128,"
    "\"vocab_size\":129280}";

static dw_status parse(const char *text, dw_model_config *c) {
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    assert_non_null(j);
    dw_status s = dw_model_config_from_json(dw_test_ctx, j, "config.json", c);
    json_decref(j);
    return s;
}

static void test_config(void **state) {
    (void)state;
    dw_model_config c, p;
    assert_int_equal(parse(DSV3, &c), DW_OK);
    assert_int_equal(dw_model_config_load(dw_test_ctx, "deepseek-v3", &p), DW_OK);
    /* per layer (hand count): q_a 7168*1536 + q_a norm 1536 + q_b 1536*128*192 + kv_a 7168*576 +
     * kv_a norm 512 + kv_b 512*128*256 + o 128*128*7168 = 11,010,048 + 1,536 + 37,748,736 +
     * 4,128,768 + 512 + 16,777,216 + 117,440,512 = 187,107,328 */
    assert_int_equal(dw_mla_attn_params(&c), 187107328LL);
    /* 2 * 129280 * 7168 (embedding, head) + 7168 (final norm) + 61 * (attention + 2 * 7168 norms)
     * + 3 * 3 * 7168 * 18432 (dense MLPs) + 58 * (257 * 3 * 7168 * 2048 + 256 * 7168 router + 256
     * bias) = 671,026,419,200: the published 671 B, the MTP module not counted */
    assert_int_equal(dw_model_config_params(&c), 671026419200LL);
    assert_int_equal(dw_model_config_params(&p), 671026419200LL);
    assert_true(c.planning_only && c.mla.q_lora_rank == 1536 && c.mla.kv_lora_rank == 512 && c.route.n_group == 8 &&
                c.route.topk_group == 4 && c.route.expert_bias && c.route.n_mtp_layers == 1 && c.first_dense_layers == 3);
    /* the planner's own count agrees, and 36.6 B matrix parameters are active per token (the
     * report's "36.6B including 0.9B for the output head") */
    dw_hw *hw = plan_preset(dw_test_ctx, "h100-sxm", 1);
    dw_job j = {.seq = 4096, .global_batch = 8};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(dw_test_ctx, &c, hw, &j, NULL, &in), DW_OK);
    dw_param_counts pc;
    dw_plan_params(&in, &pc);
    assert_true(pc.total == 671026419200.0);
    assert_true(fabs(pc.active_per_token - 36624596992.0) < 0.5);
    /* model FLOPs: 6 x active + 6 L H (192 + 128) s */
    assert_true(fabs(dw_plan_formula_flops_per_token(&in) - (6 * 36624596992.0 + 6.0 * 61 * 128 * 320 * 4096)) < 1);
    /* layout: the MTP module takes a slot of the last stage. 62 slots over 16: 3, 14 x 4, 2 + MTP;
     * over 32 (PP8 x v4): 1, 30 x 2, the MTP alone; the first 3 layers (dense) on the first stages */
    dw_vstage st;
    int64_t all = 0, moe = 0;
    for (int vs = 0; vs < 16; vs++) {
        assert_true(dw_plan_vstage(&in, 16, 1, vs, &st));
        assert_int_equal(st.layers, vs == 0 ? 3 : vs == 15 ? 2 : 4);
        assert_int_equal(st.mtp, vs == 15 ? 1 : 0);
        all += st.layers, moe += st.moe_layers;
    }
    assert_true(all == 61 && moe == 58);
    assert_true(dw_plan_vstage(&in, 8, 4, 0, &st) && st.layers == 1 && st.moe_layers == 0);
    assert_true(dw_plan_vstage(&in, 8, 4, 31, &st) && st.layers == 0 && st.mtp == 1 && st.head);
    /* the last stage's parameters carry the module: a MoE block + eh_proj 2d^2 + 3 norms (tp 1,
     * ep 1: all of it) on top of the LM head and final norm */
    dw_par par = {.dp = 1, .tp = 1, .pp = 8, .ep = 1, .cp = 1, .vpp = 4, .micro_batch = 1, .grad_accum = 8,
                  .sched = DW_SCHED_INTERLEAVED};
    dw_local_params lp;
    dw_plan_local_params(&in, &par, &st, &lp);
    double block = 187107328.0 + 2 * 7168 + 11320164608.0, mtp = block + 2.0 * 7168 * 7168 + 3 * 7168;
    assert_true(fabs(lp.dense + lp.expert - (mtp + 129280.0 * 7168 + 7168)) < 1);
    dw_hw_free(hw);
    /* save -> load is the identity on what the planner reads */
    char *dir = dw_test_tmpdir(), path[512];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(dw_model_config_save(dw_test_ctx, &c, path), DW_OK);
    dw_model_config back;
    assert_int_equal(dw_model_config_load(dw_test_ctx, dir, &back), DW_OK);
    assert_int_equal(dw_model_config_params(&back), 671026419200LL);
    assert_memory_equal(&back.mla, &c.mla, sizeof c.mla);
    assert_memory_equal(&back.route, &c.route, sizeof c.route);
    dw_test_rmtree(dir);
    free(dir);
    /* capture and training refuse it by name */
    dw_graph *g = NULL;
    assert_int_equal(dw_capture_config(dw_test_ctx, &c, 1, 16, &g), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "planning-only"));
    /* bad fields are named */
    static const struct { const char *from, *to, *field; } bad[] = {
        {"\"qk_rope_head_dim\":64", "\"qk_rope_head_dim\":63", "qk_rope_head_dim"},
        {"\"topk_group\":4", "\"topk_group\":9", "n_group"},
        {"\"moe_layer_freq\":1", "\"moe_layer_freq\":2", "moe_layer_freq"},
        {"\"attention_bias\":false", "\"attention_bias\":true", "attention_bias"},
        {"\"kv_lora_rank\":512", "\"kv_lora_rank\":0", "kv_lora_rank"},
        {"\"first_k_dense_replace\":3", "\"first_k_dense_replace\":62", "first_k_dense_replace"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[4096];
        const char *at = strstr(DSV3, bad[i].from);
        assert_non_null(at);
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - DSV3), DSV3, bad[i].to, at + strlen(bad[i].from));
        dw_model_config x;
        assert_int_not_equal(parse(text, &x), DW_OK);
        if (!strstr(dw_errmsg(dw_test_ctx), bad[i].field) || !strstr(dw_errmsg(dw_test_ctx), "config.json"))
            fail_msg("%s: message '%s'", bad[i].to, dw_errmsg(dw_test_ctx));
    }
}

static void test_node_limited_a2a(void **state) {
    (void)state;
    dw_hw *hw = plan_preset(dw_test_ctx, "h100-sxm", 8);
    hw->nvlink_gbps = 160, hw->internode_gbps = 50;
    /* EP64 over 8 nodes, 4096 tokens of 7168 FP8 bytes, top 8 within 4 nodes: a token reaches
     * 4 (1 - (3/4)^8) = 3.5995 nodes, 7/8 of them remote: 3.1496 copies over the NIC; 8 * 7/8 = 7
     * over NVLink; NIC phase 4096 * 3.1496 * 7168 / (50e9 * 0.8) = 2.3117 ms dominates the NVLink
     * phase 4096 * 7 * 7168 / (160e9 * 0.8); + 7 * 8 us + 7 * 3 us latency */
    double t = dw_plan_moe_a2a_time(hw, 64, 1, 4096, 8, 7168, 4);
    double remote = 4 * (1 - pow(0.75, 8)) * 7.0 / 8;
    double want = 7 * 8e-6 + 7 * 3e-6 + 4096 * remote * 7168 / (50e9 * 0.8);
    assert_true(fabs(t - want) < 1e-12);
    /* no limit: the plain all-to-all of every copy */
    assert_true(dw_plan_moe_a2a_time(hw, 64, 1, 4096, 8, 7168, 0) ==
                dw_plan_coll_time(hw, DW_COLL_ALLTOALL, 64, 1, 4096 * 8 * 7168.0));
    assert_true(dw_plan_moe_a2a_time(hw, 64, 1, 4096, 8, 7168, 4) < dw_plan_moe_a2a_time(hw, 64, 1, 4096, 8, 7168, 0));
    dw_hw_free(hw);
}

/* Independent replay of a simulated step: every op of a rank after the previous one ends; a
 * forward after the previous stage's forward of its micro-batch (+ p2p), a backward after the
 * next stage's backward (+ p2p) or, on the last stage, after its own forward. Stage of (rank,
 * chunk): interleaved chunk*p + rank; DualPipe rank or p-1-rank. */
static void replay(const dw_sim_in *in, const dw_sim_out *o) {
    int p = in->p, P = in->dual ? p : p * in->v;
    double *fend = calloc((size_t)in->m * P, sizeof *fend), *bend = calloc((size_t)in->m * P, sizeof *bend);
    double *last = calloc((size_t)p, sizeof *last);
    int64_t n = 0;
    for (int64_t i = 0; i < o->n_ops; i++) {
        const dw_sim_op *op = &o->ops[i];
        int st = in->dual ? (op->chunk == 0 ? op->stage : p - 1 - op->stage) : op->chunk * p + op->stage;
        (op->kind == DW_OP_F ? fend : bend)[(int64_t)op->mb * P + st] = op->end;
        n++;
    }
    assert_int_equal(n, 2 * (int64_t)in->m * P);
    for (int64_t i = 0; i < o->n_ops; i++) {
        const dw_sim_op *op = &o->ops[i];
        int st = in->dual ? (op->chunk == 0 ? op->stage : p - 1 - op->stage) : op->chunk * p + op->stage;
        assert_true(op->start >= last[op->stage] - 1e-12 && op->end >= op->start);
        last[op->stage] = op->end;
        if (op->kind == DW_OP_F && st > 0) assert_true(op->start >= fend[(int64_t)op->mb * P + st - 1] + in->p2p - 1e-9);
        if (op->kind == DW_OP_B && st < P - 1) assert_true(op->start >= bend[(int64_t)op->mb * P + st + 1] + in->p2p - 1e-9);
        if (op->kind == DW_OP_B && st == P - 1) assert_true(op->start >= fend[(int64_t)op->mb * P + st] - 1e-9);
    }
    free(fend), free(bend), free(last);
}

static void test_overlap_and_dualpipe(void **state) {
    (void)state;
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed());
    for (int it = 0; it < 200; it++) {
        int p = 2 * (1 + (int)(dw_test_next(&r) % 6)), m = 2 * (1 + (int)(dw_test_next(&r) % 12));
        bool dual = it % 2;
        int v = dual ? 1 : 1 + (int)(dw_test_next(&r) % 2);
        if (v > 1) m = p * (1 + m % 3);
        int P = p * v;
        double fw[32], bw[32], fc[32], bc[32];
        for (int i = 0; i < P; i++) {
            fw[i] = dw_test_uniform(&r, 1, 2), bw[i] = 2 * fw[i];
            fc[i] = dw_test_uniform(&r, 0, 0.6f) * fw[i], bc[i] = dw_test_uniform(&r, 0, 0.6f) * bw[i];
        }
        dw_sim_in in = {.p = p, .v = v, .m = m, .fwd = fw, .bwd = bw, .p2p = 0.01, .fcomm = fc, .bcomm = bc,
                        .overlap = !dual, .dual = dual};
        dw_sim_out o;
        assert_int_equal(dw_pipe_simulate(NULL, &in, true, &o), DW_OK);
        replay(&in, &o);
        /* hidden + exposed is every op's all-to-all; busy is the work less what overlap hid, plus
         * its SM share of the hidden part */
        double per = dual ? m / 2.0 : m;
        for (int s = 0; s < p; s++) {
            double work = 0, comm = 0;
            for (int ch = 0; ch < (dual ? 2 : v); ch++) {
                int st = dual ? (ch == 0 ? s : p - 1 - s) : ch * p + s;
                work += per * (fw[st] + bw[st]), comm += per * (fc[st] + bc[st]);
            }
            assert_true(fabs(o.comm_exposed[s] + o.comm_hidden[s] - comm) < 1e-9 * comm + 1e-12);
            assert_true(fabs(o.busy[s] - (work - o.comm_hidden[s] * (1 - DW_PLAN_A2A_SM_SHARE))) < 1e-9 * work);
            assert_true(o.makespan >= o.busy[s] - 1e-9);
            /* DualPipe keeps at most p + 1 micro-batches in flight on a rank */
            if (dual) assert_true(o.max_inflight[s] <= p + 1);
        }
        dw_sim_out_free(&o);
    }
    /* bad shapes */
    double f[4] = {1, 1, 1, 1};
    dw_sim_in bad = {.p = 3, .v = 1, .m = 4, .fwd = f, .bwd = f, .dual = true};
    dw_sim_out o;
    assert_int_equal(dw_pipe_simulate(NULL, &bad, false, &o), DW_ERR_INVALID);
}

/* `deepwell plan --json`'s explanation: the best plan's terms add up to its step, memory per rank
 * peaks at the reported worst rank, and each alternative says by how much, and where, it lost. */
static void test_explain(void **state) {
    (void)state;
    dw_model_config c;
    assert_int_equal(dw_model_config_load(dw_test_ctx, "mixtral-8x7b", &c), DW_OK);
    dw_hw *hw = plan_preset(dw_test_ctx, "h100-sxm", 4);
    dw_job j = {.seq = 4096, .global_batch = 128};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(dw_test_ctx, &c, hw, &j, NULL, &in), DW_OK);
    dw_plan_result r;
    assert_int_equal(dw_plan_search(dw_test_ctx, &in, 4, &r), DW_OK);
    assert_true(r.n_plans >= 2);
    json_t *o = dw_plan_result_json(&in, &r);
    json_t *best = json_object_get(o, "best"), *ex = json_object_get(best, "explain");
    json_t *t = json_object_get(ex, "time"), *ranks = json_object_get(ex, "memory_per_rank");
    static const char *const terms[] = {"compute_s", "tp_exposed_s", "cp_exposed_s", "ep_exposed_s", "recompute_s",
                                        "bubble_s", "dp_exposed_s", "optimizer_s"};
    double sum = 0;
    for (int k = 0; k < 8; k++) {
        double v = json_real_value(json_object_get(t, terms[k]));
        assert_true(v >= -1e-9 * r.plans[0].cost.step);
        sum += v;
    }
    assert_true(fabs(sum - r.plans[0].cost.step) <= 1e-9 * r.plans[0].cost.step);
    assert_int_equal((int)json_array_size(ranks), r.plans[0].par.pp);
    double peak = 0;
    for (size_t s = 0; s < json_array_size(ranks); s++) {
        double tot = (double)json_integer_value(json_object_get(json_array_get(ranks, s), "total_bytes"));
        if (tot > peak) peak = tot;
    }
    assert_true(fabs(peak - r.plans[0].mem.total) <= 1.0 + 1e-12 * peak);
    json_t *alt = json_array_get(json_object_get(o, "alternatives"), 0), *vs = json_object_get(alt, "vs_best");
    assert_true(fabs(json_real_value(json_object_get(vs, "step_s")) - (r.plans[1].cost.step - r.plans[0].cost.step)) <=
                1e-9 * r.plans[0].cost.step);
    assert_non_null(json_string_value(json_object_get(vs, "largest")));
    json_decref(o);
    dw_plan_result_free(&r);
    dw_hw_free(hw);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_node_limited_a2a),
        cmocka_unit_test(test_overlap_and_dualpipe),
        cmocka_unit_test(test_explain),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
