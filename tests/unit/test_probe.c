/* test_probe.c — presets, feature derivation, JSON round trips and malformed hardware files. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "deepwell.h"
#include "probe/hw.h"
#include "testutil.h"

static dw_ctx *cpu_ctx(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&o, &ctx), DW_OK);
    return ctx;
}

static void test_presets_have_datasheet_fields(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    assert_true(dw_hw_preset_count() >= 5);
    const char *required[] = {"h100-sxm", "h200", "b200", "b100", "gb200-nvl72"};
    for (size_t r = 0; r < 5; r++) {
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(ctx, required[r], 3, &hw), DW_OK);
        assert_string_equal(hw->source, "preset");
        assert_non_null(strstr(hw->label, "datasheet"));
        assert_int_equal(hw->nodes, 3);
        assert_true(hw->n_gpus >= 4);
        assert_true(hw->nvlink_gbps > 0 && hw->internode_gbps > 0);
        assert_true(hw->nvlink_domain >= hw->n_gpus);
        const dw_gpu_info *g = &hw->gpus[0];
        assert_true(g->hbm_bytes > 50e9);
        assert_true(g->peak_bf16_tflops > 500);
        assert_true(fabs(g->peak_fp8_tflops - 2 * g->peak_bf16_tflops) < 0.01 * g->peak_fp8_tflops);
        assert_true(g->hbm_gbps > 1000);
        bool blackwell = g->cc_major == 10;
        assert_int_equal(g->tcgen05, blackwell);
        assert_int_equal(g->tmem, blackwell);
        assert_int_equal(g->mx_block_scaling, blackwell);
        assert_int_equal(g->fp4, blackwell);
        assert_int_equal(g->wgmma, !blackwell);
        assert_true(g->fp8);
        assert_true(blackwell ? g->peak_fp4_tflops > 0 : g->peak_fp4_tflops == 0);
        dw_hw_free(hw);
    }
    dw_hw *nvl = NULL;
    assert_int_equal(dw_hw_preset(ctx, "gb200-nvl72", 18, &nvl), DW_OK);
    assert_int_equal(nvl->nvlink_domain, 72);
    dw_hw_free(nvl);
    dw_ctx_free(ctx);
}

static void test_bad_presets(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    dw_hw *hw = (dw_hw *)1;
    assert_int_equal(dw_hw_preset(ctx, "a100", 1, &hw), DW_ERR_INVALID);
    assert_null(hw);
    assert_non_null(strstr(dw_errmsg(ctx), "unknown hardware preset 'a100'"));
    assert_non_null(strstr(dw_errmsg(ctx), "b200")); /* lists the known ones */
    assert_int_equal(dw_hw_preset(ctx, "h200", 0, &hw), DW_ERR_INVALID);
    dw_ctx_free(ctx);
}

static void test_feature_derivation(void **state) {
    (void)state;
    struct { int maj, min; bool wgmma, fp8, tc5, mx, fp4; } cases[] = {
        {8, 0, false, false, false, false, false}, {8, 9, false, true, false, false, false},
        {9, 0, true, true, false, false, false},   {10, 0, false, true, true, true, true},
        {12, 0, false, true, false, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dw_gpu_info g = {.cc_major = cases[i].maj, .cc_minor = cases[i].min};
        dw_gpu_derive_features(&g);
        assert_int_equal(g.wgmma, cases[i].wgmma);
        assert_int_equal(g.fp8, cases[i].fp8);
        assert_int_equal(g.tcgen05, cases[i].tc5);
        assert_int_equal(g.mx_block_scaling, cases[i].mx);
        assert_int_equal(g.fp4, cases[i].fp4);
    }
    /* H100 SXM: 132 SMs at 1830 MHz → 989 TFLOP/s dense BF16 (datasheet); HBM3 2619 MHz x 5120 bit. */
    dw_gpu_info h = {.cc_major = 9, .sms = 132, .sm_clock_mhz = 1830, .mem_clock_mhz = 2619,
                     .mem_bus_bits = 5120};
    dw_gpu_derive_features(&h);
    dw_gpu_derive_peaks(&h);
    assert_true(h.peak_bf16_tflops > 985 && h.peak_bf16_tflops < 993);
    assert_true(h.hbm_gbps > 3340 && h.hbm_gbps < 3360);
}

static void test_json_round_trip(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    char *dir = dw_test_tmpdir();
    for (int i = 0; i < dw_hw_preset_count(); i++) {
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(ctx, dw_hw_preset_name(i), 2 + i, &hw), DW_OK);
        char *text = NULL;
        assert_int_equal(dw_hw_to_json(ctx, hw, true, &text), DW_OK);
        char *path = dw_test_path(dir, "hw.json");
        assert_int_equal(dw_test_write(path, text, strlen(text)), 0);
        dw_hw *back = NULL;
        assert_int_equal(dw_hw_load(ctx, path, &back), DW_OK);
        char *text2 = NULL;
        assert_int_equal(dw_hw_to_json(ctx, back, true, &text2), DW_OK);
        assert_string_equal(text, text2);
        assert_int_equal(back->nodes, 2 + i);
        free(text);
        free(text2);
        free(path);
        dw_hw_free(hw);
        dw_hw_free(back);
    }
    /* The probe's own JSON (zero GPUs in CI, real GPUs elsewhere) has the required schema. */
    dw_hw *hw = NULL;
    assert_int_equal(dw_probe(ctx, &hw), DW_OK);
    char *text = NULL;
    assert_int_equal(dw_hw_to_json(ctx, hw, false, &text), DW_OK);
    json_t *j = NULL;
    assert_int_equal(dw_json_load_string(ctx, text, strlen(text), "probe", &j), DW_OK);
    assert_string_equal(json_string_value(json_object_get(j, "source")), "probe");
    assert_true(json_is_object(json_object_get(j, "host")));
    assert_true(json_is_array(json_object_get(j, "gpus")));
    assert_true(json_is_array(json_object_get(j, "links")));
    assert_int_equal(json_array_size(json_object_get(j, "gpus")), (size_t)dw_hw_gpu_count(hw));
    if (dw_hw_gpu_count(hw) == 0) assert_non_null(dw_hw_notice(hw));
    json_t *g;
    size_t idx;
    json_array_foreach(json_object_get(j, "gpus"), idx, g) {
        const char *keys[] = {"index", "name", "cc", "sms", "hbm_bytes", "hbm_free_bytes",
                              "sm_clock_mhz", "mem_clock_mhz", "l2_bytes", "features"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
            assert_non_null(json_object_get(g, keys[k]));
    }
    json_decref(j);
    free(text);
    dw_hw_free(hw);
    dw_test_rmtree(dir);
    free(dir);
    dw_ctx_free(ctx);
}

static void expect_load_error(dw_ctx *ctx, const char *dir, const char *content, dw_status want,
                              const char *needle) {
    char *path = dw_test_path(dir, "bad.json");
    assert_int_equal(dw_test_write(path, content, strlen(content)), 0);
    dw_hw *hw = (dw_hw *)1;
    dw_status s = dw_hw_load(ctx, path, &hw);
    if (s != want || !strstr(dw_errmsg(ctx), needle))
        fail_msg("content %s: got %s '%s', want %s containing '%s'", content, dw_status_name(s),
                 dw_errmsg(ctx), dw_status_name(want), needle);
    assert_null(hw);
    assert_non_null(strstr(dw_errmsg(ctx), "bad.json"));
    free(path);
}

static void test_malformed_hw_files(void **state) {
    (void)state;
    dw_ctx *ctx = cpu_ctx();
    char *dir = dw_test_tmpdir();
    expect_load_error(ctx, dir, "{\"gpus\": [", DW_ERR_FORMAT, "invalid JSON");
    expect_load_error(ctx, dir, "[1,2]", DW_ERR_FORMAT, "top level");
    expect_load_error(ctx, dir, "{\"source\":\"probe\"}", DW_ERR_FORMAT, "'gpus'");
    expect_load_error(ctx, dir, "{\"gpus\":[{\"name\":\"x\",\"cc\":\"nine\",\"sms\":1,\"hbm_bytes\":1}]}",
                      DW_ERR_FORMAT, "'cc'");
    expect_load_error(ctx, dir, "{\"gpus\":[{\"name\":\"x\",\"cc\":\"9.0\",\"sms\":0,\"hbm_bytes\":1}]}",
                      DW_ERR_FORMAT, "gpus[0]");
    expect_load_error(ctx, dir, "{\"gpus\":[{\"name\":\"x\",\"cc\":\"9.0\",\"sms\":\"many\",\"hbm_bytes\":1}]}",
                      DW_ERR_FORMAT, "'sms'");
    expect_load_error(ctx, dir, "{\"nodes\":0,\"gpus\":[]}", DW_ERR_FORMAT, "'nodes'");
    dw_hw *hw = (dw_hw *)1;
    assert_int_equal(dw_hw_load(ctx, "/nonexistent/hw.json", &hw), DW_ERR_IO);
    assert_null(hw);
    assert_non_null(strstr(dw_errmsg(ctx), "/nonexistent/hw.json"));
    dw_test_rmtree(dir);
    free(dir);
    dw_ctx_free(ctx);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_have_datasheet_fields),
        cmocka_unit_test(test_bad_presets),
        cmocka_unit_test(test_feature_derivation),
        cmocka_unit_test(test_json_round_trip),
        cmocka_unit_test(test_malformed_hw_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
