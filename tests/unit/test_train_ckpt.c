/* test_train_ckpt.c — checkpoint directories: state round trip, `latest`, keep-K, atomicity when
 * a save fails half way, and refusal (naming the file) of missing, truncated, altered files and
 * bad state.json. The CRC-32 is checked against the standard check value. */
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

#include "core/fileio.h"
#include "deepwell.h"
#include "testutil.h"
#include "train/ckpt.h"



typedef struct {
    int fail_at; /* -1: write all files; else stop with an error before file i */
    size_t sizes[DW_CKPT_NFILES];
} writer;

static dw_status write_files(dw_ctx *c, const char *dir, void *user) {
    writer *w = user;
    for (int i = 0; i < DW_CKPT_NFILES; i++) {
        if (i == w->fail_at) return DW_ERR_IO;
        w->sizes[i] = 1 + dw_test_next(&dw_test_group_rng) % 5000;
        unsigned char *b = malloc(w->sizes[i]);
        for (size_t k = 0; k < w->sizes[i]; k++) b[k] = (unsigned char)dw_test_next(&dw_test_group_rng);
        char *p = dw_path_join(dir, dw_ckpt_files[i]);
        dw_status s = dw_write_file_atomic(c, p, b, w->sizes[i]);
        free(p);
        free(b);
        if (s != DW_OK) return s;
    }
    return DW_OK;
}

static dw_ckpt_state random_state(int64_t step) {
    dw_ckpt_state s;
    memset(&s, 0, sizeof s);
    s.step = step;
    s.total_steps = step + (int64_t)(dw_test_next(&dw_test_group_rng) % 100);
    s.tokens_seen = (int64_t)(dw_test_next(&dw_test_group_rng) >> 20);
    s.data_position = dw_test_next(&dw_test_group_rng); /* full 64 bits: must survive JSON */
    s.seed = dw_test_next(&dw_test_group_rng);
    s.rng_state = dw_test_next(&dw_test_group_rng);
    s.schedule = (dw_schedule){.kind = DW_SCHED_LINEAR, .lr = dw_test_uniform(&dw_test_group_rng, 0, 1),
                               .min_lr = dw_test_uniform(&dw_test_group_rng, 0, 1e-3f), .warmup = 7, .total = s.total_steps};
    s.beta1 = 0.9;
    s.beta2 = dw_test_uniform(&dw_test_group_rng, 0.9f, 1.0f);
    s.eps = 1e-8;
    s.weight_decay = 0.1;
    s.clip = 1.0 / 3.0;
    s.batch = 4;
    s.seq = 64;
    s.global_batch = 8;
    strcpy(s.data, "/data/fineweb_train_*.bin");
    strcpy(s.tokenizer, "ids");
    strcpy(s.precision, "fp32-cpu");
    return s;
}

static void assert_state_equal(const dw_ckpt_state *a, const dw_ckpt_state *b) {
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->total_steps, b->total_steps);
    assert_int_equal(a->tokens_seen, b->tokens_seen);
    assert_true(a->data_position == b->data_position);
    assert_true(a->seed == b->seed && a->rng_state == b->rng_state);
    assert_int_equal(a->schedule.kind, b->schedule.kind);
    assert_true(a->schedule.lr == b->schedule.lr && a->schedule.min_lr == b->schedule.min_lr);
    assert_int_equal(a->schedule.warmup, b->schedule.warmup);
    assert_int_equal(a->schedule.total, b->schedule.total);
    assert_true(a->beta1 == b->beta1 && a->beta2 == b->beta2 && a->eps == b->eps);
    assert_true(a->weight_decay == b->weight_decay && a->clip == b->clip);
    assert_int_equal(a->batch, b->batch);
    assert_int_equal(a->seq, b->seq);
    assert_int_equal(a->global_batch, b->global_batch);
    assert_string_equal(a->data, b->data);
    assert_string_equal(a->tokenizer, b->tokenizer);
    assert_string_equal(a->precision, b->precision);
}

static void test_crc32_check_value(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    char *p = dw_test_path(dir, "f");
    assert_int_equal(dw_test_write(p, "123456789", 9), 0);
    uint32_t crc = 0;
    int64_t size = 0;
    assert_int_equal(dw_file_crc32(dw_test_ctx, p, &crc, &size), DW_OK);
    assert_int_equal(crc, 0xCBF43926u);
    assert_int_equal(size, 9);
    free(p);
    dw_test_rmtree(dir);
    free(dir);
}

static bool exists(const char *dir, const char *name) {
    char *p = dw_test_path(dir, name);
    struct stat sb;
    bool ok = stat(p, &sb) == 0;
    free(p);
    return ok;
}

static void test_save_open_keep(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    writer w = {.fail_at = -1};
    dw_ckpt_state saved[4];
    for (int k = 0; k < 4; k++) {
        saved[k] = random_state(10 * (k + 1));
        char *path = NULL;
        assert_int_equal(dw_ckpt_save(dw_test_ctx, dir, &saved[k], write_files, &w, 2, &path), DW_OK);
        assert_non_null(strstr(path, "ckpt-"));
        free(path);
    }
    assert_false(exists(dir, "ckpt-10"));
    assert_false(exists(dir, "ckpt-20"));
    assert_true(exists(dir, "ckpt-30"));
    assert_true(exists(dir, "ckpt-40"));
    /* the run directory resolves through `latest` */
    dw_ckpt_state got;
    char *cdir = NULL;
    assert_int_equal(dw_ckpt_open(dw_test_ctx, dir, &cdir, &got), DW_OK);
    assert_non_null(strstr(cdir, "ckpt-40"));
    assert_state_equal(&got, &saved[3]);
    free(cdir);
    char *c30 = dw_test_path(dir, "ckpt-30");
    assert_int_equal(dw_ckpt_open(dw_test_ctx, c30, &cdir, &got), DW_OK);
    assert_state_equal(&got, &saved[2]);
    free(cdir);
    /* a save that fails half way leaves the previous checkpoints and `latest` as they were */
    w.fail_at = (int)(dw_test_next(&dw_test_group_rng) % DW_CKPT_NFILES);
    dw_ckpt_state s50 = random_state(50);
    char *path = (char *)1;
    assert_int_not_equal(dw_ckpt_save(dw_test_ctx, dir, &s50, write_files, &w, 2, &path), DW_OK);
    assert_null(path);
    assert_false(exists(dir, "ckpt-50"));
    assert_int_equal(dw_ckpt_open(dw_test_ctx, dir, &cdir, &got), DW_OK);
    assert_state_equal(&got, &saved[3]);
    free(cdir);
    /* saving the same step again replaces it */
    w.fail_at = -1;
    saved[3].tokens_seen++;
    assert_int_equal(dw_ckpt_save(dw_test_ctx, dir, &saved[3], write_files, &w, 0, NULL), DW_OK);
    assert_int_equal(dw_ckpt_open(dw_test_ctx, dir, &cdir, &got), DW_OK);
    assert_state_equal(&got, &saved[3]);
    free(cdir);
    free(c30);
    dw_test_rmtree(dir);
    free(dir);
}

static void expect_refused(const char *dir, const char *name, const char *what) {
    dw_ckpt_state got;
    char *cdir = (char *)1;
    dw_status s = dw_ckpt_open(dw_test_ctx, dir, &cdir, &got);
    assert_int_not_equal(s, DW_OK);
    assert_null(cdir);
    const char *msg = dw_errmsg(dw_test_ctx);
    if (!strstr(msg, name) || !strstr(msg, what)) fail_msg("message '%s' lacks '%s' or '%s'", msg, name, what);
}

/* Each kind of damage, to each file, is refused with a message naming the file. */
static void test_corrupt_refused(void **state) {
    (void)state;
    for (int i = 0; i < DW_CKPT_NFILES; i++) {
        for (int damage = 0; damage < 3; damage++) {
            char *dir = dw_test_tmpdir();
            writer w = {.fail_at = -1};
            dw_ckpt_state s = random_state(5);
            char *cdir = NULL;
            assert_int_equal(dw_ckpt_save(dw_test_ctx, dir, &s, write_files, &w, 1, &cdir), DW_OK);
            char *p = dw_test_path(cdir, dw_ckpt_files[i]);
            if (damage == 0) {
                assert_int_equal(unlink(p), 0);
                expect_refused(dir, p, "missing");
            } else if (damage == 1) {
                assert_int_equal(truncate(p, (off_t)(w.sizes[i] - 1)), 0);
                expect_refused(dir, p, "bytes");
            } else {
                FILE *f = fopen(p, "r+b");
                long at = (long)(dw_test_next(&dw_test_group_rng) % w.sizes[i]);
                fseek(f, at, SEEK_SET);
                int c = fgetc(f);
                fseek(f, at, SEEK_SET);
                fputc(c ^ (1 << (dw_test_next(&dw_test_group_rng) % 8)), f);
                fclose(f);
                expect_refused(dir, p, "CRC-32");
            }
            free(p);
            free(cdir);
            dw_test_rmtree(dir);
            free(dir);
        }
    }
    /* state.json: missing, invalid JSON, a missing field */
    char *dir = dw_test_tmpdir();
    writer w = {.fail_at = -1};
    dw_ckpt_state s = random_state(5);
    char *cdir = NULL;
    assert_int_equal(dw_ckpt_save(dw_test_ctx, dir, &s, write_files, &w, 1, &cdir), DW_OK);
    char *sp = dw_test_path(cdir, "state.json");
    char *text = NULL;
    size_t n = 0;
    assert_int_equal(dw_read_file(dw_test_ctx, sp, &text, &n), DW_OK);
    assert_int_equal(dw_test_write(sp, text, n / 2), 0);
    expect_refused(dir, sp, "invalid JSON");
    char *cut = strstr(text, "\"tokens_seen\"");
    assert_non_null(cut);
    memcpy(cut, "\"tokens_SEEN\"", 13);
    assert_int_equal(dw_test_write(sp, text, n), 0);
    expect_refused(dir, sp, "tokens_seen");
    unlink(sp);
    expect_refused(dir, sp, "missing");
    /* `latest` naming something else */
    char *lp = dw_test_path(dir, "latest");
    assert_int_equal(dw_test_write(lp, "garbage\n", 8), 0);
    expect_refused(dir, lp, "ckpt-");
    expect_refused("/nonexistent/run", "/nonexistent/run", "no such");
    free(lp);
    free(text);
    free(sp);
    free(cdir);
    dw_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32_check_value),
        cmocka_unit_test(test_save_open_keep),
        cmocka_unit_test(test_corrupt_refused),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
