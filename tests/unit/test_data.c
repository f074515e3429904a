/* test_data.c — data loaders: llm.c shards (uint16 and uint32, globs), raw text, the built-in set,
 * deterministic shuffling and seeking, and errors for bad shards that name file and offset. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepwell.h"
#include "testutil.h"
#include "train/data.h"



/* Writes an llm.c shard: header (magic, version, n) + n tokens of es bytes; returns the tokens. */
static uint32_t *write_shard(const char *path, int es, int64_t n, uint32_t vocab, uint32_t magic,
                             uint32_t version, int64_t claimed_n) {
    size_t bytes = 1024 + (size_t)n * (size_t)es;
    unsigned char *buf = calloc(1, bytes);
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    int32_t hdr[3] = {(int32_t)magic, (int32_t)version, (int32_t)claimed_n};
    memcpy(buf, hdr, sizeof hdr);
    for (int64_t i = 0; i < n; i++) {
        tok[i] = (uint32_t)(dw_test_next(&dw_test_group_rng) % vocab);
        if (es == 2) {
            uint16_t v = (uint16_t)tok[i];
            memcpy(buf + 1024 + i * 2, &v, 2);
        } else {
            memcpy(buf + 1024 + i * 4, &tok[i], 4);
        }
    }
    assert_int_equal(dw_test_write(path, buf, bytes), 0);
    free(buf);
    return tok;
}

/* Reads one epoch and checks every window appears exactly once and holds the file's tokens. */
static void check_epoch(dw_data *d, uint32_t **files, const int64_t *nfile, int nf, int64_t T) {
    int64_t N = dw_data_windows(d);
    int64_t expect = 0;
    for (int f = 0; f < nf; f++) expect += (nfile[f] - 1) / T;
    assert_int_equal(N, expect);
    char *seen = calloc((size_t)N, 1);
    int32_t *x = malloc((size_t)T * 4), *y = malloc((size_t)T * 4);
    for (int64_t w = 0; w < N; w++) {
        dw_data_next(d, 1, x, y);
        for (int64_t t = 0; t + 1 < T; t++) assert_int_equal(y[t], x[t + 1]);
        /* find the window: file f, offset k*T, whose tokens match */
        int64_t id = -1, base = 0;
        for (int f = 0; f < nf && id < 0; f++) {
            for (int64_t k = 0; k < (nfile[f] - 1) / T; k++) {
                const uint32_t *s = files[f] + k * T;
                int ok = 1;
                for (int64_t t = 0; t < T && ok; t++) ok = (uint32_t)x[t] == s[t] && (uint32_t)y[t] == s[t + 1];
                if (ok && !seen[base + k]) {
                    id = base + k;
                    break;
                }
            }
            base += (nfile[f] - 1) / T;
        }
        assert_true(id >= 0);
        seen[id] = 1;
    }
    free(seen);
    free(x);
    free(y);
}

static void test_shards_glob_epoch(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    const int nf = 3;
    uint32_t *files[3];
    int64_t n[3];
    int64_t T = 1 + (int64_t)(dw_test_next(&dw_test_group_rng) % 9);
    uint32_t vocab = 70000;
    for (int f = 0; f < nf; f++) {
        char name[64];
        snprintf(name, sizeof name, "tok_%d.bin", f);
        char *p = dw_test_path(dir, name);
        n[f] = 2 + (int64_t)(dw_test_next(&dw_test_group_rng) % 300);
        files[f] = write_shard(p, 4, n[f], vocab, DW_SHARD_MAGIC_U32, DW_SHARD_VERSION_U32, n[f]);
        free(p);
    }
    char *pat = dw_test_path(dir, "tok_*.bin");
    dw_data_opts o = {.pattern = pat, .T = T, .vocab_size = vocab, .shuffle = true,
                      .seed = dw_test_next(&dw_test_group_rng)};
    dw_data *d = NULL;
    dw_status st = dw_data_open(dw_test_ctx, &o, &d);
    if (st != DW_OK) { /* all files too short for one window: a legal outcome, then it must say so */
        assert_int_equal(st, DW_ERR_INVALID);
        assert_non_null(strstr(dw_errmsg(dw_test_ctx), "--seq"));
    } else {
        assert_int_equal(dw_data_file_count(d), nf);
        assert_int_equal(dw_data_get_kind(d), DW_DATA_SHARDS);
        assert_int_equal(dw_data_tokens(d), n[0] + n[1] + n[2]);
        check_epoch(d, files, n, nf, T);
        check_epoch(d, files, n, nf, T); /* the second epoch: again each window once */
        dw_data_free(d);
    }
    for (int f = 0; f < nf; f++) free(files[f]);
    free(pat);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_shuffle_deterministic_and_seek(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    char *p = dw_test_path(dir, "a.bin");
    int64_t n = 4000, T = 8, B = 3;
    uint32_t *tok = write_shard(p, 2, n, 50257, DW_SHARD_MAGIC_U16, DW_SHARD_VERSION_U16, n);
    uint64_t seed = dw_test_next(&dw_test_group_rng);
    dw_data_opts o = {.pattern = p, .T = T, .vocab_size = 50257, .shuffle = true, .seed = seed};
    dw_data *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &a), DW_OK);
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &b), DW_OK);
    o.seed = seed + 1;
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &c), DW_OK);
    int64_t steps = 2 * dw_data_windows(a) / B + 5; /* crosses two epoch boundaries */
    int32_t *xa = malloc((size_t)(B * T) * 4), *ya = malloc((size_t)(B * T) * 4);
    int32_t *xb = malloc((size_t)(B * T) * 4), *yb = malloc((size_t)(B * T) * 4);
    int64_t differ = 0, cut = (int64_t)(dw_test_next(&dw_test_group_rng) % (uint64_t)steps);
    uint64_t cut_pos = 0;
    int32_t *saved = malloc((size_t)(B * T) * 4 * (size_t)steps);
    for (int64_t s = 0; s < steps; s++) {
        if (s == cut) cut_pos = dw_data_position(a);
        dw_data_next(a, B, xa, ya);
        dw_data_next(b, B, xb, yb);
        assert_memory_equal(xa, xb, (size_t)(B * T) * 4);
        assert_memory_equal(ya, yb, (size_t)(B * T) * 4);
        memcpy(saved + s * B * T, xa, (size_t)(B * T) * 4);
        dw_data_next(c, B, xb, yb);
        differ += memcmp(xa, xb, (size_t)(B * T) * 4) != 0;
    }
    assert_true(differ > steps / 2); /* another seed, another order */
    assert_int_equal(cut_pos, (uint64_t)(cut * B));
    /* seeking to a saved position replays the same batches (what resume relies on) */
    dw_data_free(b);
    o.seed = seed;
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &b), DW_OK);
    dw_data_seek(b, cut_pos);
    for (int64_t s = cut; s < steps; s++) {
        dw_data_next(b, B, xb, yb);
        assert_memory_equal(xb, saved + s * B * T, (size_t)(B * T) * 4);
    }
    /* no shuffle: windows in file order */
    o.shuffle = false;
    dw_data_free(c);
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &c), DW_OK);
    for (int64_t w = 0; w < 10; w++) {
        dw_data_next(c, 1, xb, yb);
        for (int64_t t = 0; t < T; t++) assert_int_equal(xb[t], (int32_t)tok[w * T + t]);
    }
    dw_data_free(a);
    dw_data_free(b);
    dw_data_free(c);
    free(xa); free(ya); free(xb); free(yb); free(saved); free(tok); free(p);
    dw_test_rmtree(dir);
    free(dir);
}

static void expect_error(const char *pattern, int64_t vocab, dw_status want, const char *a,
                         const char *b) {
    dw_data_opts o = {.pattern = pattern, .T = 4, .vocab_size = vocab, .shuffle = true, .seed = 1};
    dw_data *d = (dw_data *)1;
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &d), want);
    assert_null(d);
    const char *msg = dw_errmsg(dw_test_ctx);
    if (!strstr(msg, a) || (b && !strstr(msg, b))) fail_msg("message '%s' lacks '%s' / '%s'", msg, a, b ? b : "");
}

static void test_bad_shards(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    char *p = dw_test_path(dir, "bad.bin");
    char off[64];
    /* wrong magic */
    free(write_shard(p, 2, 100, 100, 12345, 1, 100));
    expect_error(p, 100, DW_ERR_FORMAT, p, "byte offset 0");
    /* wrong version */
    free(write_shard(p, 2, 100, 100, DW_SHARD_MAGIC_U16, 7, 100));
    expect_error(p, 100, DW_ERR_FORMAT, p, "byte offset 4");
    /* truncated: the header promises more tokens than the file has */
    int64_t n = 50 + (int64_t)(dw_test_next(&dw_test_group_rng) % 50);
    free(write_shard(p, 2, n, 100, DW_SHARD_MAGIC_U16, 1, n + 3));
    snprintf(off, sizeof off, "byte offset %lld", (long long)(1024 + 2 * n));
    expect_error(p, 100, DW_ERR_FORMAT, p, off);
    /* truncated header */
    assert_int_equal(dw_test_write(p, "abc", 3), 0);
    expect_error(p, 100, DW_ERR_FORMAT, p, "truncated");
    /* a token >= vocab, at a random index */
    uint32_t *tok = write_shard(p, 4, n, 100, DW_SHARD_MAGIC_U32, DW_SHARD_VERSION_U32, n);
    int64_t bad = (int64_t)(dw_test_next(&dw_test_group_rng) % (uint64_t)n);
    FILE *f = fopen(p, "r+b");
    uint32_t big = 100 + (uint32_t)(dw_test_next(&dw_test_group_rng) % 1000);
    fseek(f, 1024 + bad * 4, SEEK_SET);
    fwrite(&big, 4, 1, f);
    fclose(f);
    snprintf(off, sizeof off, "byte offset %lld: token %u", (long long)(1024 + 4 * bad), big);
    expect_error(p, 100, DW_ERR_FORMAT, p, off);
    free(tok);
    /* no match; a mix of shards and text */
    char *none = dw_test_path(dir, "nothing*.bin");
    expect_error(none, 100, DW_ERR_IO, none, "no file");
    free(write_shard(p, 2, 100, 100, DW_SHARD_MAGIC_U16, 1, 100));
    char *txt = dw_test_path(dir, "bad.txt");
    assert_int_equal(dw_test_write(txt, "hello world", 11), 0);
    char *all = dw_test_path(dir, "bad.*");
    expect_error(all, 100, DW_ERR_INVALID, all, "text");
    /* raw text needs a byte-level vocab */
    expect_error(txt, 100, DW_ERR_INVALID, txt, "vocab");
    free(none); free(txt); free(all); free(p);
    dw_test_rmtree(dir);
    free(dir);
}

static void test_raw_text(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir();
    char *p = dw_test_path(dir, "t.txt");
    int64_t n = 200 + (int64_t)(dw_test_next(&dw_test_group_rng) % 200), T = 16;
    unsigned char *bytes = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) bytes[i] = (unsigned char)(dw_test_next(&dw_test_group_rng) & 255);
    assert_int_equal(dw_test_write(p, bytes, (size_t)n), 0);
    dw_data_opts o = {.pattern = p, .T = T, .vocab_size = 256, .shuffle = false, .seed = 0};
    dw_data *d = NULL;
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &d), DW_OK);
    assert_int_equal(dw_data_get_kind(d), DW_DATA_TEXT);
    assert_int_equal(dw_data_windows(d), (n - 1) / T);
    int32_t x[16], y[16];
    for (int64_t w = 0; w < (n - 1) / T; w++) {
        dw_data_next(d, 1, x, y);
        for (int64_t t = 0; t < T; t++) {
            assert_int_equal(x[t], bytes[w * T + t]);
            assert_int_equal(y[t], bytes[w * T + t + 1]);
        }
    }
    dw_data_free(d);
    free(bytes);
    free(p);
    dw_test_rmtree(dir);
    free(dir);
}

/* Every line of the built-in set is a correct fact; each stream holds every fact equally often
 * (whole shuffled rounds), and the two streams differ. */
static void test_builtin(void **state) {
    (void)state;
    char *texts[2];
    for (int split = 0; split < 2; split++) {
        int64_t len = 0;
        char *text = dw_synth_text(split == 1, &len);
        assert_non_null(text);
        assert_int_equal((int64_t)strlen(text), len);
        texts[split] = strdup(text);
        int count[DW_SYNTH_MAX * DW_SYNTH_MAX] = {0}, lines = 0;
        char *save = NULL;
        for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
            int a, b, c, used = 0;
            assert_int_equal(sscanf(line, "%d+%d=%d%n", &a, &b, &c, &used), 3);
            assert_int_equal(used, (int)strlen(line));
            assert_true(a >= 0 && a < DW_SYNTH_MAX && b >= 0 && b < DW_SYNTH_MAX);
            assert_int_equal(a + b, c);
            count[a * DW_SYNTH_MAX + b]++;
            lines++;
        }
        assert_true(lines >= 2 * DW_SYNTH_MAX * DW_SYNTH_MAX);
        for (int i = 0; i < DW_SYNTH_MAX * DW_SYNTH_MAX; i++) assert_int_equal(count[i], count[0]);
        assert_true(split == 1 || len > 100000);
        free(text);
    }
    assert_true(strncmp(texts[0], texts[1], 200) != 0);
    free(texts[0]);
    free(texts[1]);
    dw_data_opts o = {.pattern = "builtin", .T = 32, .vocab_size = 256, .shuffle = true, .seed = 3};
    dw_data *d = NULL;
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &d), DW_OK);
    assert_int_equal(dw_data_get_kind(d), DW_DATA_BUILTIN);
    assert_true(dw_data_windows(d) > 1000);
    dw_data_free(d);
    o.vocab_size = 50; /* '=' is 61: a byte beyond the vocab is refused */
    assert_int_equal(dw_data_open(dw_test_ctx, &o, &d), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "builtin"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_glob_epoch),
        cmocka_unit_test(test_shuffle_deterministic_and_seek),
        cmocka_unit_test(test_bad_shards),
        cmocka_unit_test(test_raw_text),
        cmocka_unit_test(test_builtin),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
