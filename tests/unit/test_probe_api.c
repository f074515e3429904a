/* test_probe_api.c — the public hardware accessors of deepwell.h: dw_hw_get_info / _gpu / _peer
 * on every preset and random node counts (against the private description they copy), growable
 * results (nothing past size written), dw_hw_set_nodes and dw_hw_keep_gpus on random counts,
 * and refusals of bad arguments. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "probe/hw.h"
#include "testutil.h"

#define CTX dw_test_ctx
#define RNG (&dw_test_group_rng)

static void test_getters(void **state) {
    (void)state;
    for (int p = 0; p < dw_hw_preset_count(); p++) {
        int nodes = (int)dw_test_rnd(1, 64);
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(CTX, dw_hw_preset_name(p), nodes, &hw), DW_OK);
        dw_hw_info m = {.size = sizeof m};
        assert_int_equal(dw_hw_get_info(hw, &m), DW_OK);
        assert_int_equal(m.size, sizeof m);
        assert_string_equal(m.source, "preset");
        assert_string_equal(m.preset, dw_hw_preset_name(p));
        assert_int_equal(m.nodes, nodes);
        assert_int_equal(m.gpus, dw_hw_gpu_count(hw));
        assert_int_equal(m.nvlink_domain, hw->nvlink_domain);
        assert_true(m.nvlink_gbps == hw->nvlink_gbps && m.internode_gbps == hw->internode_gbps);
        assert_string_equal(m.notice, "");
        for (int i = 0; i < m.gpus; i++) {
            dw_gpu_info g = {.size = sizeof g};
            assert_int_equal(dw_hw_get_gpu(hw, i, &g), DW_OK);
            assert_int_equal(g.size, sizeof g);
            assert_int_equal(g.index, i);
            assert_string_equal(g.name, hw->gpus[i].name);
            assert_int_equal(g.cc_major, hw->gpus[i].cc_major);
            assert_true(g.hbm_bytes == hw->gpus[i].hbm_bytes && g.hbm_free_bytes == -1);
            assert_true(g.peak_bf16_tflops > 0 && g.hbm_gbps > 0);
            assert_int_equal(g.tcgen05, g.cc_major == 10);
            assert_int_equal(g.wgmma, g.cc_major == 9);
            int j = (int)dw_test_rnd(0, m.gpus - 1);
            dw_peer_link l = {.size = sizeof l};
            if (j == i) {
                assert_int_equal(dw_hw_get_peer(hw, i, j, &l), DW_ERR_INVALID);
            } else {
                assert_int_equal(dw_hw_get_peer(hw, i, j, &l), DW_OK);
                assert_int_equal(l.access, hw->peers[i * m.gpus + j].access);
                assert_int_equal(l.perf_rank, hw->peers[i * m.gpus + j].perf_rank);
            }
        }
        /* an older, shorter dw_gpu_info: nothing past its size is written */
        unsigned char buf[sizeof(dw_gpu_info) + 8];
        memset(buf, 0x33, sizeof buf);
        size_t old = offsetof(dw_gpu_info, nvlink_links);
        memcpy(buf, &old, sizeof old);
        assert_int_equal(dw_hw_get_gpu(hw, 0, (dw_gpu_info *)(void *)buf), DW_OK);
        for (size_t k = old; k < sizeof buf; k++) assert_int_equal(buf[k], 0x33);
        dw_hw_free(hw);
    }
}

static void test_bad_args(void **state) {
    (void)state;
    dw_hw *hw = NULL;
    assert_int_equal(dw_hw_preset(CTX, "h100-sxm", 1, &hw), DW_OK);
    dw_hw_info m = {.size = sizeof m};
    dw_gpu_info g = {.size = sizeof g};
    dw_peer_link l = {.size = sizeof l};
    assert_int_equal(dw_hw_get_info(NULL, &m), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "NULL"));
    assert_int_equal(dw_hw_get_info(hw, NULL), DW_ERR_INVALID);
    dw_hw_info unset = {0};
    assert_int_equal(dw_hw_get_info(hw, &unset), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "size"));
    assert_int_equal(dw_hw_get_gpu(hw, 0, &g), DW_OK);
    assert_int_equal(dw_hw_get_gpu(hw, 8, &g), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(NULL), "GPU 8 of 8"));
    assert_true(g.size == sizeof g && g.name[0] == 0 && g.sms == 0); /* zeroed on error */
    assert_int_equal(dw_hw_get_gpu(hw, -1, &g), DW_ERR_INVALID);
    assert_int_equal(dw_hw_get_gpu(NULL, 0, &g), DW_ERR_INVALID);
    assert_int_equal(dw_hw_get_peer(hw, 0, 8, &l), DW_ERR_INVALID);
    assert_int_equal(dw_hw_get_peer(hw, 3, 3, &l), DW_ERR_INVALID);
    assert_int_equal(dw_hw_get_peer(hw, 0, 1, NULL), DW_ERR_INVALID);
    assert_int_equal(dw_hw_set_nodes(CTX, hw, 0), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "got 0"));
    assert_int_equal(dw_hw_set_nodes(CTX, hw, 1000001), DW_ERR_INVALID);
    assert_int_equal(dw_hw_set_nodes(CTX, NULL, 2), DW_ERR_INVALID);
    assert_int_equal(dw_hw_keep_gpus(CTX, hw, 9), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(CTX), "has 8 GPUs per node"));
    assert_int_equal(dw_hw_keep_gpus(CTX, hw, 0), DW_ERR_INVALID);
    assert_int_equal(dw_hw_keep_gpus(CTX, NULL, 1), DW_ERR_INVALID);
    assert_int_equal(dw_hw_gpu_count(hw), 8); /* refusals change nothing */
    dw_hw_free(hw);
}

static void test_nodes_and_gpus(void **state) {
    (void)state;
    for (int it = 0; it < 20; it++) {
        dw_hw *hw = NULL;
        assert_int_equal(dw_hw_preset(CTX, dw_test_next(RNG) % 2 ? "b200" : "h200", 1, &hw), DW_OK);
        int nodes = (int)dw_test_rnd(1, 1000), keep = (int)dw_test_rnd(1, 8);
        assert_int_equal(dw_hw_set_nodes(CTX, hw, nodes), DW_OK);
        dw_hw *copy = dw_hw_dup(hw);
        assert_non_null(copy);
        assert_int_equal(dw_hw_keep_gpus(CTX, hw, keep), DW_OK);
        dw_hw_info m = {.size = sizeof m};
        assert_int_equal(dw_hw_get_info(hw, &m), DW_OK);
        assert_int_equal(m.gpus, keep);
        assert_int_equal(m.nodes, nodes);
        assert_int_equal(m.nvlink_domain, nodes == 1 ? keep : 8); /* one node: the domain shrinks */
        for (int i = 0; i < keep; i++) {
            dw_gpu_info g = {.size = sizeof g}, h = {.size = sizeof h};
            assert_int_equal(dw_hw_get_gpu(hw, i, &g), DW_OK);
            assert_int_equal(dw_hw_get_gpu(copy, i, &h), DW_OK);
            assert_memory_equal(&g, &h, sizeof g);
            for (int j = 0; j < keep; j++) {
                dw_peer_link a = {.size = sizeof a}, b = {.size = sizeof b};
                if (i == j) continue;
                assert_int_equal(dw_hw_get_peer(hw, i, j, &a), DW_OK);
                assert_int_equal(dw_hw_get_peer(copy, i, j, &b), DW_OK);
                assert_memory_equal(&a, &b, sizeof a);
            }
        }
        char *js = NULL;
        assert_int_equal(dw_hw_to_json(CTX, hw, false, &js), DW_OK); /* still serialises */
        dw_free_string(js);
        dw_hw_free(copy);
        dw_hw_free(hw);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_nodes_and_gpus),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
