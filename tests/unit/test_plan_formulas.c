/* test_plan_formulas.c — the planner's closed forms against hand-computed cases: parameter
 * counts, model FLOPs, executed FLOPs, activation bytes, per-rank parameter shares, memory per
 * GPU, collective costs, GEMM efficiency curve and measured-rate interpolation. The arithmetic
 * is written out beside each expected number. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "capture/model_config_impl.h"
#include "core/json.h"
#include "plan/layout.h"
#include "test_plan_common.h"
#include "testutil.h"

static dw_plan_in mk_in(dw_ctx *ctx, const dw_model_config *c, const dw_hw *hw, int64_t seq, int64_t G,
                        dw_recipe prec) {
    dw_job j = {.seq = seq, .global_batch = G, .recipe = prec};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, c, hw, &j, NULL, &in), DW_OK);
    return in;
}

static void test_param_counts(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_param_counts pc;
    /* GPT-2 124M, tied embeddings:
     *   wte 50257*768 = 38,597,376; wpe 1024*768 = 786,432
     *   block: ln1 2*768 = 1,536; c_attn 768*2304 + 2304 = 1,771,776; attn c_proj 768*768 + 768
     *          = 590,592; ln2 1,536; c_fc 768*3072 + 3072 = 2,362,368; mlp c_proj 3072*768 + 768
     *          = 2,360,064 → 7,087,872; x 12 = 85,054,464
     *   ln_f 1,536 → total 38,597,376 + 786,432 + 85,054,464 + 1,536 = 124,439,808 */
    dw_model_config g2 = plan_gpt(50257, 768, 12, 12, 1024);
    dw_plan_in in = mk_in(ctx, &g2, hw, 1024, 8, DW_RECIPE_BF16);
    dw_plan_params(&in, &pc);
    assert_true(pc.total == 124439808.0);
    assert_true(pc.attn + pc.mlp + pc.norms == 7087872.0);
    /* Llama-3.1-8B, untied: embed 128256*4096 = 525,336,576 (x2 with the LM head);
     *   block: attn 4096*(32+2*8)*128 + 4096*4096 = 25,165,824 + 16,777,216 = 41,943,040;
     *          MLP 3*4096*14336 = 176,160,768; norms 2*4096 = 8,192 → 218,112,000; x 32
     *          = 6,979,584,000; final norm 4,096 → 1,050,673,152 + 6,979,584,000 + 4,096
     *          = 8,030,261,248 (the published 8.03B) */
    dw_model_config l8 = plan_llama(128256, 4096, 32, 32, 8, 14336);
    in = mk_in(ctx, &l8, hw, 8192, 8, DW_RECIPE_BF16);
    dw_plan_params(&in, &pc);
    assert_true(pc.total == 8030261248.0);
    /* Mixtral-8x7B: block attn 41,943,040 + experts 8*3*4096*14336 = 1,409,286,144 + router
     *   4096*8 = 32,768 + norms 8,192 = 1,451,270,144; x 32 = 46,440,644,608; embeddings
     *   2*32000*4096 = 262,144,000; final norm 4,096 → 46,702,792,704 (published 46.7B) */
    dw_model_config mx = plan_llama(32000, 4096, 32, 32, 8, 14336);
    mx.n_experts = 8, mx.top_k = 2, mx.d_ff_expert = 14336;
    in = mk_in(ctx, &mx, hw, 4096, 8, DW_RECIPE_BF16);
    dw_plan_params(&in, &pc);
    assert_true(pc.total == 46702792704.0);
    /* active: 32*(attn 41,943,040 + 2 experts 352,321,536 + router 32,768) + head 131,072,000 */
    assert_true(pc.active_per_token == 32.0 * (41943040.0 + 352321536.0 + 32768.0) + 131072000.0);
    /* Every model preset: this closed form agrees with capture's independent one. */
    for (int i = 0; i < dw_model_preset_count(); i++) {
        dw_model_config c;
        assert_int_equal(dw_model_config_load(ctx, dw_model_preset_name(i), &c), DW_OK);
        in = mk_in(ctx, &c, hw, 256, 8, DW_RECIPE_BF16);
        dw_plan_params(&in, &pc);
        if (pc.total != (double)dw_model_config_params(&c))
            fail_msg("preset %s: planner %.0f vs capture %lld params", dw_model_preset_name(i), pc.total,
                     (long long)dw_model_config_params(&c));
    }
    /* and the families without a preset: Gemma 2 (four norms a block), Phi-3, Qwen3 */
    static const char *const configs[] = {
        "{\"model_type\":\"gemma2\",\"vocab_size\":300,\"hidden_size\":64,\"num_hidden_layers\":3,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":24,\"intermediate_size\":96,\"max_position_embeddings\":128}",
        "{\"model_type\":\"phi3\",\"vocab_size\":300,\"hidden_size\":64,\"num_hidden_layers\":3,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"intermediate_size\":96,\"max_position_embeddings\":128}",
        "{\"model_type\":\"qwen3\",\"vocab_size\":300,\"hidden_size\":64,\"num_hidden_layers\":3,"
        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"intermediate_size\":96,\"max_position_embeddings\":128}"};
    for (size_t i = 0; i < sizeof configs / sizeof configs[0]; i++) {
        json_t *j = NULL;
        dw_model_config c;
        assert_int_equal(dw_json_load_string(ctx, configs[i], strlen(configs[i]), "config.json", &j), DW_OK);
        assert_int_equal(dw_model_config_from_json(ctx, j, "config.json", &c), DW_OK);
        json_decref(j);
        in = mk_in(ctx, &c, hw, 64, 8, DW_RECIPE_BF16);
        dw_plan_params(&in, &pc);
        if (pc.total != (double)dw_model_config_params(&c))
            fail_msg("%s: planner %.0f vs capture %lld params", c.model_type, pc.total,
                     (long long)dw_model_config_params(&c));
    }
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_model_flops(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    /* GPT-2 124M at seq 1024: matmul weights per block 768*2304 + 768*768 + 2*768*3072
     *   = 7,077,888; x 12 = 84,934,656; + LM head 50257*768 = 38,597,376 → 123,532,032;
     *   6 x = 741,192,192; attention 12*L*H*hd*s = 12*12*12*64*1024 = 113,246,208
     *   → 854,438,400 FLOPs per token */
    dw_model_config g2 = plan_gpt(50257, 768, 12, 12, 1024);
    dw_plan_in in = mk_in(ctx, &g2, hw, 1024, 8, DW_RECIPE_BF16);
    assert_true(dw_plan_model_flops_per_token(&in) == 854438400.0);
    /* Llama-3.1-8B at 8192: 6*(32*218,103,808 + 525,336,576) = 45,027,950,592;
     *   attention 12*32*32*128*8192 = 12,884,901,888 → 57,912,852,480 */
    dw_model_config l8 = plan_llama(128256, 4096, 32, 32, 8, 14336);
    in = mk_in(ctx, &l8, hw, 8192, 8, DW_RECIPE_BF16);
    assert_true(dw_plan_model_flops_per_token(&in) == 57912852480.0);
    /* one FLOP model: the closed form equals the op table's count over the captured graph for
     * every preset capture builds, at a random seq within its positions */
    int compared = 0;
    for (int i = 0; i < dw_model_preset_count(); i++) {
        dw_model_config c;
        assert_int_equal(dw_model_config_load(ctx, dw_model_preset_name(i), &c), DW_OK);
        const int64_t seq = 1 + (int64_t)(dw_test_next(&dw_test_group_rng) % (uint64_t)(c.max_seq < 4096 ? c.max_seq : 4096));
        in = mk_in(ctx, &c, hw, seq, 8, DW_RECIPE_BF16);
        if (!in.engine_model) continue;
        const double graph = in.graph_flops_per_token, formula = dw_plan_formula_flops_per_token(&in);
        assert_true(graph > 0 && dw_plan_model_flops_per_token(&in) == graph);
        if (fabs(graph - formula) > 1e-12 * formula)
            fail_msg("preset %s at seq %lld: op table %.0f vs closed form %.0f FLOPs per token", dw_model_preset_name(i),
                     (long long)seq, graph, formula);
        compared++;
    }
    assert_true(compared >= 4);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_activation_bytes(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    /* GPT-2 (d 768, 12 heads of 64, ff 3072), BF16, per token per block:
     *   attention: ln1 in 2*768 + QKV in 2*768 + Q,K,V 2*2304 + O 2*768 + LSE 4*12 + ln2 in 2*768
     *            = 1536 + 1536 + 4608 + 1536 + 48 + 1536 = 10,800
     *   MLP: fc in 2*768 + GELU in 2*3072 + proj in 2*3072 = 13,824 → 24,624 (= 32d + 4H; the
     *   34sbh of Korthikanti et al. less the two 1-byte dropout masks, flash attention)
     *   selective drops QKV in, fc in, proj in: 24,624 - 1536 - 1536 - 6144 = 15,408
     *   full keeps the block input: 2*768 = 1,536 */
    dw_model_config g2 = plan_gpt(50257, 768, 12, 12, 1024);
    dw_plan_in in = mk_in(ctx, &g2, hw, 1024, 8, DW_RECIPE_BF16);
    assert_true(dw_plan_act_bytes_dense(&in, DW_RECOMPUTE_NONE) == 24624.0);
    assert_true(dw_plan_act_bytes_dense(&in, DW_RECOMPUTE_SELECTIVE) == 15408.0);
    assert_true(dw_plan_act_bytes_dense(&in, DW_RECOMPUTE_FULL) == 1536.0);
    /* Llama-8B, FP8 (a = 1 byte for saved GEMM inputs):
     *   attention: 2*4096 + 2*(32+16)*128 + 2*4096 + 4*32 + 2*4096 + QKV in 1*4096 + O copy 1*4096
     *            = 8192 + 12288 + 8192 + 128 + 8192 + 4096 + 4096 = 45,184
     *   MLP: gate+up in 1*4096 + SwiGLU in 2*2*14336 + down in 1*14336 = 75,776 → 120,960
     *   selective: 120,960 - 4096 - 4096 - 4096 - 14336 = 94,336 */
    dw_model_config l8 = plan_llama(128256, 4096, 32, 32, 8, 14336);
    in = mk_in(ctx, &l8, hw, 8192, 8, DW_RECIPE_FP8_BLOCK);
    assert_true(dw_plan_act_bytes_dense(&in, DW_RECOMPUTE_NONE) == 120960.0);
    assert_true(dw_plan_act_bytes_dense(&in, DW_RECOMPUTE_SELECTIVE) == 94336.0);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_moe_shares(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_model_config mx = plan_llama(32000, 4096, 32, 32, 8, 14336);
    mx.n_experts = 8, mx.top_k = 2, mx.d_ff_expert = 14336;
    dw_job j = {.seq = 4096, .global_batch = 8, .moe_capacity = 1.25};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &mx, hw, &j, NULL, &in), DW_OK);
    /* Mixtral, BF16, no recompute, per token per block:
     *   attention 2*4096 + 2*(32+16)*128 + 2*4096 + 4*32 + 2*4096 + QKV in 2*4096 = 45,184
     *   routed copies top_k x capacity = 2 x 1.25 = 2.5, each: expert input 2*4096 + SwiGLU
     *   inputs 2*2*14336 + down input 2*14336 = 94,208 → 235,520; routing 8*top_k = 16
     *   → 280,720 */
    assert_true(dw_plan_act_bytes_moe(&in, DW_RECOMPUTE_NONE) == 280720.0);
    assert_true(dw_plan_act_bytes_moe(&in, DW_RECOMPUTE_FULL) == 8192.0);
    /* tp 2, ep 4, pp 1: experts 32 x 8 x 3*4096*14336 / (ep 4 x tp 2) = 5,637,144,576;
     *   the rest: 32 x (attention 41,943,040 / 2 + router 32,768 + norms 8,192) = 672,399,360
     *   + embedding and LM head 2 x 32000*4096/2 = 131,072,000 + final norm 4,096
     *   = 803,475,456 */
    dw_par p = {.dp = 4, .tp = 2, .pp = 1, .cp = 1, .ep = 4, .vpp = 1, .micro_batch = 1, .grad_accum = 2};
    dw_vstage st;
    assert_true(dw_plan_vstage(&in, 1, 1, 0, &st));
    assert_int_equal(st.moe_layers, 32);
    dw_local_params lp;
    dw_plan_local_params(&in, &p, &st, &lp);
    assert_true(lp.expert == 5637144576.0);
    assert_true(lp.dense == 803475456.0);
    /* optimizer with ZeRO-1: dense over dp*cp = 4 ranks, experts over dp*cp/ep = 1 rank:
     *   12 x (803,475,456 / 4 + 5,637,144,576 / 1) */
    p.zero = 1;
    dw_mem m;
    dw_plan_memory(&in, &p, &m);
    assert_true(m.optimizer == 12.0 * (803475456.0 / 4 + 5637144576.0));
    /* EP all-to-all, ep 8 inside one NVLink domain, T = 4096 tokens, 2 x 1.25 routed copies of
     * d = 4096: 41,943,040 elements; BF16 all-to-all = 7 x 3 us + 7/8 x 83,886,080 B / 360 GB/s;
     * 4 per block (dispatch + combine, forward + backward), 32 blocks, one micro-batch */
    dw_par pe = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 8, .vpp = 1, .micro_batch = 1, .grad_accum = 1};
    dw_plan_entry e;
    dw_plan_time(&in, &pe, &e, NULL);
    double a2a = 7 * 3e-6 + 0.875 * 83886080.0 / 360e9, a2a8 = 7 * 3e-6 + 0.875 * 41943040.0 / 360e9;
    assert_true(fabs(e.cost.ep_comm - 32 * 4 * a2a) < 1e-12);
    /* FP8: the forward dispatch carries 1-byte codes */
    dw_job j8 = j;
    j8.recipe = DW_RECIPE_FP8_BLOCK;
    dw_plan_in in8;
    assert_int_equal(dw_plan_in_init(ctx, &mx, hw, &j8, NULL, &in8), DW_OK);
    dw_plan_time(&in8, &pe, &e, NULL);
    assert_true(fabs(e.cost.ep_comm - 32 * (a2a8 + 3 * a2a)) < 1e-12);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_local_params_and_layout(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 2);
    dw_model_config l8 = plan_llama(128256, 4096, 32, 32, 8, 14336);
    dw_plan_in in = mk_in(ctx, &l8, hw, 8192, 8, DW_RECIPE_BF16);
    dw_par p = {.dp = 4, .tp = 2, .pp = 2, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1, .grad_accum = 2};
    dw_vstage st;
    dw_local_params lp;
    /* stage 0: 16 blocks x ((41,943,040 + 176,160,768)/2 + 8,192 norms) = 16 x 109,060,096
     *   = 1,744,961,536, + embedding 525,336,576/2 = 262,668,288 → 2,007,629,824 */
    assert_true(dw_plan_vstage(&in, 2, 1, 0, &st));
    assert_true(st.layers == 16 && st.embed && !st.head);
    dw_plan_local_params(&in, &p, &st, &lp);
    assert_true(lp.dense == 2007629824.0);
    assert_true(lp.matmul == 16.0 * 218103808.0 / 2); /* 1,744,830,464: no norms, no embedding */
    /* stage 1: 1,744,961,536 + LM head 262,668,288 + final norm 4,096 = 2,007,633,920 */
    assert_true(dw_plan_vstage(&in, 2, 1, 1, &st));
    dw_plan_local_params(&in, &p, &st, &lp);
    assert_true(lp.dense == 2007633920.0);
    /* Llama-3 405B layout: 126 blocks over pp 16 → (126 + 2)/16 = 8 slots; first and last
     * stage hold 7 blocks (room for embedding / LM head), the 14 others 8: 7 + 14*8 + 7 = 126 */
    dw_model_config l405 = plan_llama(128256, 16384, 126, 128, 8, 53248);
    in = mk_in(ctx, &l405, hw, 8192, 16, DW_RECIPE_BF16);
    int64_t sum = 0;
    for (int vs = 0; vs < 16; vs++) {
        assert_true(dw_plan_vstage(&in, 16, 1, vs, &st));
        assert_int_equal(st.layers, (vs == 0 || vs == 15) ? 7 : 8);
        sum += st.layers;
    }
    assert_int_equal(sum, 126);
    /* uneven: 126 over 10 → 13 per middle stage, the ends give up 130 - 126 = 4: 11 + 8*13 + 11 */
    for (int vs = 0; vs < 10; vs++) {
        assert_true(dw_plan_vstage(&in, 10, 1, vs, &st));
        assert_int_equal(st.layers, (vs == 0 || vs == 9) ? 11 : 13);
    }
    /* 126 over 100 → 2 per middle stage, 74 missing: the ends cannot give up more than 3 */
    assert_false(dw_plan_vstage(&in, 100, 1, 0, &st));
    /* DeepSeek-V3-like: 61 blocks, first 3 dense; pp 1 holds 58 MoE blocks */
    dw_model_config ds = plan_llama(129280, 7168, 61, 128, 128, 18432);
    ds.n_experts = 256, ds.top_k = 8, ds.d_ff_expert = 2048, ds.n_shared_experts = 1, ds.first_dense_layers = 3;
    in = mk_in(ctx, &ds, hw, 4096, 16, DW_RECIPE_BF16);
    assert_true(dw_plan_vstage(&in, 1, 1, 0, &st));
    assert_int_equal(st.moe_layers, 58);
    /* pp 16 (DeepSeek-V3's): 4 per middle stage, 3 missing → stage 0 holds 2 (both dense), stage
     * 1 layers 2-5 (one dense, 3 MoE), the last 3 */
    int64_t moe_sum = 0, all = 0;
    for (int vs = 0; vs < 16; vs++) {
        assert_true(dw_plan_vstage(&in, 16, 1, vs, &st));
        assert_int_equal(st.layers, vs == 0 ? 2 : vs == 15 ? 3 : 4);
        assert_int_equal(st.moe_layers, vs == 0 ? 0 : vs == 1 ? 3 : st.layers);
        moe_sum += st.moe_layers, all += st.layers;
    }
    assert_int_equal(all, 61);
    assert_int_equal(moe_sum, 58);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_memory_hand_case(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_model_config g2 = plan_gpt(50257, 768, 12, 12, 1024);
    dw_plan_in in = mk_in(ctx, &g2, hw, 1024, 64, DW_RECIPE_BF16);
    dw_par p = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 4, .grad_accum = 2};
    dw_mem m;
    dw_plan_memory(&in, &p, &m);
    /* P = 124,439,808 on every rank (dp 8, nothing sharded, ZeRO-0):
     *   weights BF16 2P = 248,879,616; grads FP32 4P = 497,759,232; Adam 12P = 1,493,277,696
     *   activations: 1 micro-batch in flight x T = 4*1024 = 4096 tokens x 12 blocks x 24,624
     *   = 1,210,318,848, + logits 4096 x 50257 x (2 + 4) = 1,235,116,032 → 2,445,434,880
     *   workspace 1 GiB = 1,073,741,824 (tp 1: no all-gather buffers); scales 0
     *   total 5,759,093,248 */
    assert_true(m.weights == 248879616.0);
    assert_true(m.grads == 497759232.0);
    assert_true(m.optimizer == 1493277696.0);
    assert_true(m.activations == 2445434880.0);
    assert_true(m.workspace == 1073741824.0);
    assert_true(m.scales == 0);
    assert_true(m.total == 5759093248.0);
    assert_true(m.limit == 0.9 * 80e9);
    /* ZeRO-1: Adam state sharded over dp 8: 1,493,277,696 / 8 = 186,659,712 */
    p.zero = 1;
    dw_plan_memory(&in, &p, &m);
    assert_true(m.optimizer == 186659712.0);
    /* ZeRO-2: grads 4P/8 = 62,219,904 + one block's FP32 bucket 4 x 7,087,872 = 28,351,488 */
    p.zero = 2;
    dw_plan_memory(&in, &p, &m);
    assert_true(m.grads == 62219904.0 + 28351488.0);
    /* offload: no optimizer state on the GPU */
    p.offload = true;
    dw_plan_memory(&in, &p, &m);
    assert_true(m.optimizer == 0);
    /* full recompute: 12 block inputs 4096 x 1536 x 12 = 75,497,472 + one block's working set
     * 4096 x 24,624 = 100,859,904 + logits 1,235,116,032 */
    p.offload = false, p.zero = 0, p.recompute = DW_RECOMPUTE_FULL;
    dw_plan_memory(&in, &p, &m);
    assert_true(m.activations == 75497472.0 + 100859904.0 + 1235116032.0);
    /* FP8 block-scaled: weights 2P + two FP8 copies of the matmul weights; 12 x 7,077,888
     * = 84,934,656 matmul params → weights 248,879,616 + 169,869,312; weight scales
     * 2 x 84,934,656 x 4/16384 = 41,472 */
    dw_plan_in in8 = mk_in(ctx, &g2, hw, 1024, 64, DW_RECIPE_FP8_BLOCK);
    p.recompute = DW_RECOMPUTE_NONE;
    dw_plan_memory(&in8, &p, &m);
    assert_true(m.weights == 248879616.0 + 169869312.0);
    /* activation scales: 4096 tokens x 12 blocks x (2*768 + 768 + 3072 quantised inputs)
     * x 4/128 = 4096*12*5376/32 = 8,257,536 */
    assert_true(fabs(m.scales - (41472.0 + 8257536.0)) < 1e-6);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_executed_flops(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_model_config g2 = plan_gpt(50257, 768, 12, 12, 1024);
    dw_plan_in in = mk_in(ctx, &g2, hw, 1024, 64, DW_RECIPE_BF16);
    dw_par p = {.dp = 8, .tp = 1, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 4, .grad_accum = 2};
    dw_plan_entry e;
    dw_reject why;
    char det[200];
    assert_true(dw_plan_evaluate(&in, &p, true, &e, &why, det, sizeof det));
    /* per micro-batch (T = 4096 tokens) per rank:
     *   block GEMMs 3 x 2 x 4096 x 7,077,888 = 173,946,175,488
     *   causal flash attention fwd 4 x mb 4 x s 1024 x s/2 512 x hd 64 x H 12 = 6,442,450,944,
     *   fwd + bwd (2.5x) = 3.5 x = 22,548,578,304
     *   LM head 3 x 2 x 4096 x 50257 x 768 = 948,569,112,576
     * step: 8 ranks x 2 micro-batches x (12 x (173,946,175,488 + 22,548,578,304) + 948,569,112,576)
     *   = 52,904,098,529,280 FLOPs executed */
    double exec = e.cost.hfu * e.cost.step * 8 * 989e12;
    assert_true(fabs(exec - 52904098529280.0) < 1e-9 * exec);
    /* full recompute adds one forward per block: 12 x (57,982,058,496 GEMM + 6,442,450,944
     * attention) = 773,094,113,280 per micro-batch; x 2 micro-batches x 8 ranks
     * = 12,369,505,812,480 */
    dw_par pf = p;
    pf.recompute = DW_RECOMPUTE_FULL;
    dw_plan_entry ef;
    assert_true(dw_plan_evaluate(&in, &pf, true, &ef, &why, det, sizeof det));
    double exec_full = ef.cost.hfu * ef.cost.step * 8 * 989e12;
    assert_true(fabs(exec_full - (52904098529280.0 + 12369505812480.0)) < 1e-9 * exec_full);
    assert_true(ef.cost.step > e.cost.step); /* recomputing is never free */
    /* DP: ZeRO-0 all-reduces the FP32 gradients (4 x 124,439,808 = 497,759,232 bytes) over 8
     * ranks in one domain: 14 x 3 us + 2*7/8 x 497,759,232 / 360 GB/s, hidden under the last
     * backward when shorter; ZeRO-1 reduce-scatters them and all-gathers BF16 parameters */
    double ar = 14 * 3e-6 + 1.75 * 497759232.0 / 360e9;
    assert_true(fabs(e.cost.dp_comm - ar) < 1e-12);
    assert_true(e.cost.dp_exposed >= 0 && e.cost.dp_exposed <= ar);
    dw_par p1 = p;
    p1.zero = 1;
    dw_plan_entry e1;
    dw_plan_time(&in, &p1, &e1, NULL);
    double rs = 7 * 3e-6 + 0.875 * 497759232.0 / 360e9, ag = 7 * 3e-6 + 0.875 * 248879616.0 / 360e9;
    assert_true(fabs(e1.cost.dp_comm - (rs + ag)) < 1e-12);
    /* Adam on the 1/8 shard: 124,439,808 / 8 x 32 bytes at 0.75 x 3350 GB/s */
    assert_true(fabs(e1.cost.optimizer - 124439808.0 / 8 * 32 / (0.75 * 3350e9)) < 1e-15);
    /* model FLOPs: 854,438,400 per token x 64 x 1024 tokens */
    assert_true(e.cost.model_flops == 854438400.0 * 65536);
    assert_true(fabs(e.cost.mfu - e.cost.model_flops / (e.cost.step * 8 * 989e12)) < 1e-12);
    assert_true(fabs(e.cost.tokens_per_s * e.cost.step - 65536) < 1e-6);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_tp_cp_traffic(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    dw_model_config l8 = plan_llama(128256, 4096, 32, 32, 8, 14336);
    dw_job j = {.seq = 4096, .global_batch = 1};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &l8, hw, &j, NULL, &in), DW_OK);
    /* TP 8, one micro-batch of 4096 tokens: each sequence-parallel all-gather / reduce-scatter
     * moves T x d x 2 = 33,554,432 bytes: 7 x 3 us + 7/8 x 33,554,432 / 360 GB/s;
     * 10 per block (4 forward, 6 backward) x 32 blocks + 2 around the LM head = 322 */
    dw_par p = {.dp = 1, .tp = 8, .pp = 1, .cp = 1, .ep = 1, .vpp = 1, .micro_batch = 1, .grad_accum = 1};
    dw_plan_entry e;
    dw_plan_time(&in, &p, &e, NULL);
    double ag = 7 * 3e-6 + 0.875 * 33554432.0 / 360e9;
    assert_true(fabs(e.cost.tp_comm - 322 * ag) < 1e-12);
    assert_true(e.cost.cp_comm == 0 && e.cost.ep_comm == 0 && e.cost.pp_comm == 0);
    /* TP 4 x CP 2: T = 2048 per rank → TP all-gather 2048 x 4096 x 2 bytes over 4 ranks; CP
     * all-gathers K and V of the whole sequence, 4096 x 2 x 8 heads x 128 / tp 4 x 2 bytes
     * = 4,194,304 bytes over 2 ranks 4 apart (same domain): 3 us + 1/2 x 4,194,304 / 360 GB/s,
     * 3 per block (forward all-gather, backward all-gather + reduce-scatter) */
    p.tp = 4, p.cp = 2;
    dw_plan_time(&in, &p, &e, NULL);
    double ag_tp = 3 * 3e-6 + 0.75 * 16777216.0 / 360e9, ag_cp = 3e-6 + 0.5 * 4194304.0 / 360e9;
    assert_true(fabs(e.cost.tp_comm - 322 * ag_tp) < 1e-12);
    assert_true(fabs(e.cost.cp_comm - 32 * 3 * ag_cp) < 1e-12);
    /* full recompute repeats the forward's 4 TP and 1 CP collectives per block */
    p.recompute = DW_RECOMPUTE_FULL;
    dw_plan_time(&in, &p, &e, NULL);
    assert_true(fabs(e.cost.tp_comm - (322 + 32 * 4) * ag_tp) < 1e-12);
    assert_true(fabs(e.cost.cp_comm - 32 * 4 * ag_cp) < 1e-12);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_collectives(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_hw *hw = NULL;
    assert_int_equal(dw_hw_preset(ctx, "h100-sxm", 4, &hw), DW_OK); /* NVLink 450 GB/s, NIC 50 */
    double S = 1e9;
    /* ring all-reduce, 8 ranks in one NVLink domain: 2*7 steps x 3 us + 2*7/8 x 1 GB / (450 GB/s
     * x 0.8 bus efficiency) = 42 us + 4.8611 ms */
    double t = dw_plan_coll_time(hw, DW_COLL_ALLREDUCE, 8, 1, S);
    assert_true(fabs(t - (14 * 3e-6 + 1.75e9 / 360e9)) < 1e-12);
    /* all-gather, same ranks: 7 x 3 us + 7/8 x 1 GB / 360 GB/s */
    t = dw_plan_coll_time(hw, DW_COLL_ALLGATHER, 8, 1, S);
    assert_true(fabs(t - (7 * 3e-6 + 0.875e9 / 360e9)) < 1e-12);
    assert_true(dw_plan_coll_time(hw, DW_COLL_REDUCESCATTER, 8, 1, S) == t);
    /* 32 ranks, stride 1 → 8 per domain: hierarchical = intra AR(8, S) + inter AR(4, S/8) over
     * the NIC: 14 x 3 us + 1.75 GB/360 + 6 x 8 us + 2*3/4 x 0.125 GB / 40 GB/s */
    t = dw_plan_coll_time(hw, DW_COLL_ALLREDUCE, 32, 1, S);
    double want = 14 * 3e-6 + 1.75e9 / 360e9 + 6 * 8e-6 + 1.5 * 0.125e9 / 40e9;
    assert_true(fabs(t - want) < 1e-12);
    /* stride 8 (one member per node): pure network ring, 4 ranks */
    t = dw_plan_coll_time(hw, DW_COLL_ALLREDUCE, 4, 8, S);
    assert_true(fabs(t - (6 * 8e-6 + 1.5e9 / 40e9)) < 1e-12);
    /* all-to-all over 16 ranks, 8 per domain: 15 x 8 us + S x 7/16 over NVLink + S x 8/16 over NIC */
    t = dw_plan_coll_time(hw, DW_COLL_ALLTOALL, 16, 1, S);
    assert_true(fabs(t - (15 * 8e-6 + S * 7 / 16 / 360e9 + S * 8 / 16 / 40e9)) < 1e-12);
    /* p2p inside / across the domain */
    assert_true(fabs(dw_plan_coll_time(hw, DW_COLL_P2P, 2, 1, S) - (3e-6 + S / 360e9)) < 1e-12);
    assert_true(fabs(dw_plan_coll_time(hw, DW_COLL_P2P, 2, 8, S) - (8e-6 + S / 40e9)) < 1e-12);
    assert_true(dw_plan_coll_time(hw, DW_COLL_ALLREDUCE, 1, 1, S) == 0);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

static void test_gemm_curve_and_table(void **state) {
    (void)state;
    dw_ctx *ctx = plan_ctx();
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    dw_hw *hw = plan_preset(ctx, "h100-sxm", 1);
    const dw_gpu_info *g = &hw->gpus[0];
    for (int p = 0; p < DW_PLAN_RECIPES; p++)
        for (int i = 0; i < 200; i++) {
            double m = 1 + (double)(dw_test_next(&rng) % 16384), n = 1 + (double)(dw_test_next(&rng) % 16384);
            double k = 1 + (double)(dw_test_next(&rng) % 16384);
            double e = dw_plan_gemm_eff(g, dw_plan_recipes[p], m, n, k);
            assert_true(e > 0 && e <= 0.75);
            /* small K / N lowers efficiency: halving any dimension never helps */
            assert_true(dw_plan_gemm_eff(g, dw_plan_recipes[p], m, n, k / 2) <= e + 1e-15);
            assert_true(dw_plan_gemm_eff(g, dw_plan_recipes[p], m, n / 2, k) <= e + 1e-15);
            assert_true(dw_plan_gemm_eff(g, dw_plan_recipes[p], m / 2, n, k) <= e + 1e-15);
        }
    /* big square BF16 GEMM: 0.75 x (8192/8256)^3 = 0.7327 of 989 TFLOP/s */
    double e = dw_plan_gemm_eff(g, DW_RECIPE_BF16, 8192, 8192, 8192);
    assert_true(fabs(e - 0.75 * pow(8192.0 / 8256.0, 3)) < 1e-12);
    /* a GEMV-like shape is memory bound: m = 1 → at most 2 x HBM bandwidth x 0.75 / 2 bytes */
    e = dw_plan_gemm_eff(g, DW_RECIPE_BF16, 1, 8192, 8192);
    assert_true(e * 989e12 <= 3350e9 * 0.75 * 2 * 8192.0 * 8192.0 / (2.0 * (8192.0 * 8192 + 8192 + 8192)) + 1);
    /* measured table: exact hits return the measurement; a point between two measurements gets
     * a correction between theirs; the file format errors name the field */
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "gemm.json");
    const char *doc = "{\"results\":[{\"m\":4096,\"n\":4096,\"k\":4096,\"recipe\":\"bf16\",\"tflops\":600},"
                      "{\"m\":1024,\"n\":1024,\"k\":1024,\"recipe\":\"bf16\",\"tflops\":300},"
                      "{\"m\":4096,\"n\":4096,\"k\":4096,\"recipe\":\"fp8_tensor\",\"tflops\":900}]}";
    assert_int_equal(dw_test_write(path, doc, strlen(doc)), 0);
    dw_gemm_table t;
    assert_int_equal(dw_gemm_table_load(ctx, path, &t), DW_OK);
    assert_int_equal(t.n, 2); /* fp8_tensor is not a planner recipe: skipped */
    dw_model_config c = plan_gpt(50257, 768, 12, 12, 1024);
    dw_job j = {.seq = 1024, .global_batch = 8};
    dw_plan_in in;
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, &t, &in), DW_OK);
    assert_true(fabs(dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 4096, 4096, 4096) - 600e12) < 1);
    assert_true(fabs(dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 1024, 1024, 1024) - 300e12) < 1);
    double r1 = 300e12 / (989e12 * dw_plan_gemm_eff(g, DW_RECIPE_BF16, 1024, 1024, 1024));
    double r2 = 600e12 / (989e12 * dw_plan_gemm_eff(g, DW_RECIPE_BF16, 4096, 4096, 4096));
    double mid = dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 2048, 2048, 2048) /
                 (989e12 * dw_plan_gemm_eff(g, DW_RECIPE_BF16, 2048, 2048, 2048));
    assert_true(mid >= fmin(r1, r2) - 1e-9 && mid <= fmax(r1, r2) + 1e-9);
    assert_true(fabs(mid - (r1 + r2) / 2) < 1e-9); /* equidistant in log space: the mean */
    /* a misaligned GEMM (a dimension not a multiple of 8): no misaligned point in the table, so
     * the model's rate / 5.6, untouched by the aligned points */
    double mis = dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 4096, 4097, 4096);
    assert_true(fabs(mis - 989e12 * dw_plan_gemm_eff(g, DW_RECIPE_BF16, 4096, 4097, 4096) / 5.6) < 1);
    /* FP8 has no measurements: the analytical curve */
    assert_true(dw_plan_gemm_rate(&in, DW_RECIPE_FP8_BLOCK, 4096, 4096, 4096) ==
                1979e12 * dw_plan_gemm_eff(g, DW_RECIPE_FP8_BLOCK, 4096, 4096, 4096));
    dw_gemm_table_free(&t);
    /* with a misaligned measurement: misaligned queries use it (exact hit), aligned ones ignore it */
    const char *doc2 = "[{\"m\":4096,\"n\":4096,\"k\":4096,\"recipe\":\"bf16\",\"tflops\":600},"
                       "{\"m\":4096,\"n\":4097,\"k\":4096,\"recipe\":\"bf16\",\"tflops\":100}]";
    assert_int_equal(dw_test_write(path, doc2, strlen(doc2)), 0);
    assert_int_equal(dw_gemm_table_load(ctx, path, &t), DW_OK);
    assert_int_equal(dw_plan_in_init(ctx, &c, hw, &j, &t, &in), DW_OK);
    assert_true(fabs(dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 4096, 4097, 4096) - 100e12) < 1);
    assert_true(fabs(dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 4096, 4096, 4096) - 600e12) < 1);
    assert_true(fabs(dw_plan_gemm_rate(&in, DW_RECIPE_BF16, 2048, 2048, 2048) /
                         (989e12 * dw_plan_gemm_eff(g, DW_RECIPE_BF16, 2048, 2048, 2048)) -
                     r2) < 1e-9); /* only the aligned point corrects it */
    dw_gemm_table_free(&t);
    const char *bad = "{\"results\":[{\"m\":4096,\"n\":4096,\"recipe\":\"bf16\",\"tflops\":1}]}";
    assert_int_equal(dw_test_write(path, bad, strlen(bad)), 0);
    assert_int_equal(dw_gemm_table_load(ctx, path, &t), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(ctx), "results[0]"));
    assert_non_null(strstr(dw_errmsg(ctx), "'k'"));
    const char *neg = "[{\"m\":4096,\"n\":4096,\"k\":0,\"recipe\":\"bf16\",\"tflops\":1}]";
    assert_int_equal(dw_test_write(path, neg, strlen(neg)), 0);
    assert_int_equal(dw_gemm_table_load(ctx, path, &t), DW_ERR_FORMAT);
    dw_test_rmtree(dir);
    free(dir), free(path);
    dw_hw_free(hw);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_counts),        cmocka_unit_test(test_model_flops),
        cmocka_unit_test(test_activation_bytes),    cmocka_unit_test(test_local_params_and_layout),
        cmocka_unit_test(test_moe_shares),
        cmocka_unit_test(test_memory_hand_case),    cmocka_unit_test(test_executed_flops),
        cmocka_unit_test(test_collectives),         cmocka_unit_test(test_tp_cp_traffic),         cmocka_unit_test(test_gemm_curve_and_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
