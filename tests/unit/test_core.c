/* test_core.c — status names, error messages, log levels, arenas, atomic file writes, JSON. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/ctx.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/json.h"
#include "deepwell.h"
#include "testutil.h"

static void test_status_names(void **state) {
    (void)state;
    assert_string_equal(dw_status_name(DW_OK), "DW_OK");
    assert_string_equal(dw_status_name(DW_ERR_FORMAT), "DW_ERR_FORMAT");
    assert_string_equal(dw_status_name(DW_ERR_NUMERIC), "DW_ERR_NUMERIC");
    assert_string_equal(dw_status_name((dw_status)99), "DW_ERR_UNKNOWN");
}

static void test_cpu_ctx_and_errors(void **state) {
    (void)state;
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&o, &ctx), DW_OK);
    assert_non_null(ctx);
    assert_int_equal(dw_ctx_device(ctx), DW_DEVICE_CPU);
    assert_string_equal(dw_errmsg(ctx), "");
    assert_int_equal(dw_set_error(ctx, DW_ERR_IO, "%s: broken %d", "f.bin", 7), DW_ERR_IO);
    assert_string_equal(dw_errmsg(ctx), "f.bin: broken 7");
    dw_prefix_error(ctx, DW_ERR_IO, "loading %s", "model");
    assert_string_equal(dw_errmsg(ctx), "loading model: f.bin: broken 7");
    dw_clear_error(ctx);
    assert_string_equal(dw_errmsg(ctx), "");
    void *stream = (void *)1;
    assert_int_equal(dw_ctx_stream(ctx, &stream), DW_ERR_UNSUPPORTED);
    assert_null(stream);
    dw_ctx_free(ctx);
    dw_ctx_free(NULL); /* no-op */
}

static void test_cuda_ctx_without_gpu(void **state) {
    (void)state;
    /* CI has no GPU: asking for one must fail cleanly with a message and a NULL handle. When a
     * GPU exists (GPU machine), creation must succeed instead. */
    dw_ctx *ctx = (dw_ctx *)1;
    dw_ctx_opts o = {.device = DW_DEVICE_CUDA, .device_index = 0};
    dw_status s = dw_ctx_create(&o, &ctx);
    dw_hw *hw = NULL;
    dw_ctx *cpu = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&co, &cpu), DW_OK);
    assert_int_equal(dw_probe(cpu, &hw), DW_OK);
    if (dw_hw_gpu_count(hw) == 0) {
        assert_int_not_equal(s, DW_OK);
        assert_null(ctx);
        assert_true(strlen(dw_errmsg(NULL)) > 0);
    } else {
        assert_int_equal(s, DW_OK);
        assert_int_equal(dw_ctx_device(ctx), DW_DEVICE_CUDA);
        dw_ctx_free(ctx);
    }
    /* AUTO resolves to a concrete device. */
    dw_ctx_opts ao = {.device = DW_DEVICE_AUTO};
    dw_ctx *actx = NULL;
    assert_int_equal(dw_ctx_create(&ao, &actx), DW_OK);
    assert_int_equal(dw_ctx_device(actx),
                     dw_hw_gpu_count(hw) > 0 ? DW_DEVICE_CUDA : DW_DEVICE_CPU);
    dw_ctx_free(actx);
    dw_hw_free(hw);
    dw_ctx_free(cpu);
}

static void test_log_levels(void **state) {
    (void)state;
    dw_log_level l;
    assert_true(dw_log_parse_level("debug", &l));
    assert_int_equal(l, DW_LOG_DEBUG);
    assert_true(dw_log_parse_level("error", &l));
    assert_int_equal(l, DW_LOG_ERROR);
    assert_false(dw_log_parse_level("verbose", &l));
    assert_false(dw_log_parse_level(NULL, &l));
    dw_log_level old = dw_log_get_level();
    dw_log_set_level(DW_LOG_WARN);
    assert_int_equal(dw_log_get_level(), DW_LOG_WARN);
    dw_log_set_level(old);
}

static void test_arena_alignment_and_limits(void **state) {
    (void)state;
    dw_test_rng rng;
    dw_test_rng_init(&rng, dw_test_seed());
    dw_arena a;
    size_t cap = 1 << 20;
    assert_int_equal(dw_arena_init(NULL, &a, DW_ARENA_HOST, cap, "test"), DW_OK);
    size_t expect_used = 0;
    for (int i = 0; i < 200; i++) {
        size_t align = (size_t)1 << (dw_test_next(&rng) % 9); /* 1..256 */
        size_t bytes = dw_test_next(&rng) % 3000;
        void *p = NULL;
        size_t before = a.used;
        dw_status s = dw_arena_alloc(NULL, &a, bytes, align, &p);
        size_t start = (before + align - 1) & ~(align - 1);
        if (start + bytes > cap) {
            assert_int_equal(s, DW_ERR_NOMEM);
            assert_null(p);
            assert_int_equal(a.used, before); /* a failed reservation changes nothing */
            assert_non_null(strstr(dw_errmsg(NULL), "arena 'test' is full"));
            break;
        }
        assert_int_equal(s, DW_OK);
        assert_int_equal(((uintptr_t)p) % align, 0);
        assert_ptr_equal(p, a.base + start);
        memset(p, 0xAB, bytes); /* ASan catches writes past the backing store */
        expect_used = start + bytes;
        assert_int_equal(a.used, expect_used);
    }
    size_t hw = a.high_water;
    dw_arena_rewind(&a, 0);
    assert_int_equal(a.used, 0);
    assert_int_equal(a.high_water, hw);
    /* overflow of size_t arithmetic is refused, not wrapped */
    assert_int_equal(dw_arena_reserve(&a, SIZE_MAX - 8, 16), SIZE_MAX);
    dw_arena_release(&a);

    dw_arena m;
    assert_int_equal(dw_arena_init(NULL, &m, DW_ARENA_MEASURE, 0, "measure"), DW_OK);
    assert_int_equal(dw_arena_reserve(&m, 100, 256), 0);
    assert_int_equal(dw_arena_reserve(&m, 10, 256), 256);
    assert_int_equal(m.high_water, 266);
    dw_arena_release(&m);
}

static void test_atomic_write(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    assert_non_null(dir);
    char *path = dw_test_path(dir, "out.bin");
    const char payload[] = "first version";
    assert_int_equal(dw_write_file_atomic(NULL, path, payload, sizeof payload), DW_OK);
    char *back = NULL;
    size_t n = 0;
    assert_int_equal(dw_read_file(NULL, path, &back, &n), DW_OK);
    assert_int_equal(n, sizeof payload);
    assert_memory_equal(back, payload, n);
    free(back);

    /* An aborted write leaves the old file and no temporary behind. */
    dw_atomic_file f;
    assert_int_equal(dw_atomic_open(NULL, &f, path), DW_OK);
    assert_int_equal(dw_atomic_write(NULL, &f, "partial", 7), DW_OK);
    char *tmp = strdup(f.tmp_path);
    dw_atomic_abort(&f);
    assert_int_equal(access(tmp, F_OK), -1);
    free(tmp);
    assert_int_equal(dw_read_file(NULL, path, &back, &n), DW_OK);
    assert_memory_equal(back, payload, sizeof payload);
    free(back);

    /* Writing into a missing directory fails with a message naming the path. */
    char *bad = dw_test_path(dir, "no/such/dir/x.bin");
    assert_int_equal(dw_write_file_atomic(NULL, bad, "x", 1), DW_ERR_IO);
    assert_non_null(strstr(dw_errmsg(NULL), "no/such/dir/x.bin"));
    assert_int_equal(dw_read_file(NULL, bad, &back, &n), DW_ERR_IO);
    assert_null(back);
    free(bad);
    free(path);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_json_errors_name_location(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    char *path = dw_test_path(dir, "bad.json");
    const char text[] = "{\n  \"a\": 1,\n  \"b\": [1, 2,\n}\n";
    assert_int_equal(dw_test_write(path, text, sizeof text - 1), 0);
    json_t *j = NULL;
    assert_int_equal(dw_json_load_file(NULL, path, &j), DW_ERR_FORMAT);
    assert_null(j);
    assert_non_null(strstr(dw_errmsg(NULL), "bad.json:4:"));

    const char good[] = "{\"n\": 12, \"x\": 2.5, \"s\": \"hi\", \"f\": 3.0, \"t\": true}";
    assert_int_equal(dw_json_load_string(NULL, good, sizeof good - 1, "doc", &j), DW_OK);
    long long n = 0;
    double x = 0;
    const char *s = NULL;
    bool t = false;
    assert_int_equal(dw_json_get_int(NULL, j, "n", "doc", &n), DW_OK);
    assert_int_equal(n, 12);
    assert_int_equal(dw_json_get_int(NULL, j, "f", "doc", &n), DW_OK); /* 3.0 is integral */
    assert_int_equal(n, 3);
    assert_int_equal(dw_json_get_int(NULL, j, "x", "doc", &n), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(NULL), "field 'x'"));
    assert_int_equal(dw_json_get_num(NULL, j, "x", "doc", &x), DW_OK);
    assert_true(x == 2.5);
    assert_int_equal(dw_json_get_str(NULL, j, "s", "doc", &s), DW_OK);
    assert_string_equal(s, "hi");
    assert_int_equal(dw_json_get_bool_opt(NULL, j, "t", "doc", &t), DW_OK);
    assert_true(t);
    assert_int_equal(dw_json_get_int(NULL, j, "missing", "doc", &n), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(NULL), "missing field 'missing'"));
    n = 77;
    assert_int_equal(dw_json_get_int_opt(NULL, j, "missing", "doc", &n), DW_OK);
    assert_int_equal(n, 77);
    json_decref(j);
    const char dup[] = "{\"a\": 1, \"a\": 2}";
    assert_int_equal(dw_json_load_string(NULL, dup, sizeof dup - 1, "dup", &j), DW_ERR_FORMAT);
    free(path);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_version(void **state) {
    (void)state;
    const char *v = dw_version_string();
    assert_non_null(strstr(v, "0.1.0"));
    assert_non_null(strstr(v, dw_built_with_cuda() ? "sm_90a" : "cpu-only"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_names),
        cmocka_unit_test(test_cpu_ctx_and_errors),
        cmocka_unit_test(test_cuda_ctx_without_gpu),
        cmocka_unit_test(test_log_levels),
        cmocka_unit_test(test_arena_alignment_and_limits),
        cmocka_unit_test(test_atomic_write),
        cmocka_unit_test(test_json_errors_name_location),
        cmocka_unit_test(test_version),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
