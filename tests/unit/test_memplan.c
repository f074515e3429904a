/* test_memplan.c — the static memory plan: live buffers never overlap, alignment holds, the
 * arena is never below the live-bytes lower bound, simple schedules reach the bound exactly. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>

#include "compile/memplan.h"
#include "testutil.h"

static void check_plan(const dw_mem_item *it, int n, int64_t arena) {
    for (int i = 0; i < n; i++) {
        int64_t a = it[i].align ? it[i].align : 256;
        assert_int_equal(it[i].offset % a, 0);
        assert_true(it[i].offset >= 0 && it[i].offset + it[i].size <= arena);
        for (int j = i + 1; j < n; j++) {
            bool live_together = !(it[i].last < it[j].first || it[j].last < it[i].first);
            bool overlap = it[i].offset < it[j].offset + it[j].size &&
                           it[j].offset < it[i].offset + it[i].size;
            if (live_together && overlap)
                fail_msg("buffers %d [%d,%d] @%lld+%lld and %d [%d,%d] @%lld+%lld overlap", i,
                         it[i].first, it[i].last, (long long)it[i].offset, (long long)it[i].size, j,
                         it[j].first, it[j].last, (long long)it[j].offset, (long long)it[j].size);
        }
    }
}

static void test_random_schedules(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    for (int trial = 0; trial < 300; trial++) {
        int n = 1 + (int)(dw_test_next(&rng) % 60);
        dw_mem_item *it = calloc((size_t)n, sizeof *it);
        int64_t total = 0;
        for (int i = 0; i < n; i++) {
            it[i].size = 1 + (int64_t)(dw_test_next(&rng) % 100000);
            it[i].first = (int)(dw_test_next(&rng) % 40);
            it[i].last = it[i].first + (int)(dw_test_next(&rng) % 15);
            it[i].align = (int64_t)1 << (dw_test_next(&rng) % 10);
            total += it[i].size + it[i].align;
        }
        int64_t arena = 0;
        assert_int_equal(dw_memplan_assign(NULL, it, n, &arena), DW_OK);
        check_plan(it, n, arena);
        assert_true(arena >= dw_memplan_live_peak(it, n));
        assert_true(arena <= total);
        /* deterministic: the same input gives the same offsets */
        dw_mem_item *again = malloc(sizeof *it * (size_t)n);
        memcpy(again, it, sizeof *it * (size_t)n);
        int64_t arena2 = 0;
        assert_int_equal(dw_memplan_assign(NULL, again, n, &arena2), DW_OK);
        assert_int_equal(arena, arena2);
        for (int i = 0; i < n; i++) assert_int_equal(again[i].offset, it[i].offset);
        free(again);
        free(it);
    }
}

static void test_chain_reuses_memory(void **state) {
    (void)state;
    /* A forward chain: buffer i lives during steps [i, i+1]. Only two are ever live, so with equal
     * sizes the plan needs exactly two slots, whatever the length. */
    enum { N = 50 };
    dw_mem_item it[N];
    for (int i = 0; i < N; i++) it[i] = (dw_mem_item){.size = 4096, .first = i, .last = i + 1};
    int64_t arena = 0;
    assert_int_equal(dw_memplan_assign(NULL, it, N, &arena), DW_OK);
    check_plan(it, N, arena);
    assert_int_equal(arena, 2 * 4096);
    assert_int_equal(dw_memplan_live_peak(it, N), 2 * 4096);
}

static void test_rejects_bad_items(void **state) {
    (void)state;
    dw_mem_item bad[] = {{.size = 0, .first = 0, .last = 1}};
    int64_t arena = 0;
    assert_int_equal(dw_memplan_assign(NULL, bad, 1, &arena), DW_ERR_INVALID);
    dw_mem_item rev[] = {{.size = 8, .first = 3, .last = 1}};
    assert_int_equal(dw_memplan_assign(NULL, rev, 1, &arena), DW_ERR_INVALID);
    dw_mem_item align[] = {{.size = 8, .first = 0, .last = 1, .align = 24}};
    assert_int_equal(dw_memplan_assign(NULL, align, 1, &arena), DW_ERR_INVALID);
    assert_int_equal(dw_memplan_assign(NULL, NULL, 0, &arena), DW_OK);
    assert_int_equal(arena, 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_schedules),
        cmocka_unit_test(test_chain_reuses_memory),
        cmocka_unit_test(test_rejects_bad_items),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
