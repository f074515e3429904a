/* test_ckpt_shard.c — the range bookkeeping of sharded checkpoints (train/ckpt_shard.h) against
 * brute-force oracles, on random tensor sizes, gaps and world sizes: which rank's shard holds
 * which elements (element by element: the rank whose range holds its pool offset), the check that
 * pieces tile a tensor (every element counted), the copies that read any range back from another
 * world size's pieces (a resharded read compared value by value), and the shard files' names. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "train/ckpt_shard.h"

enum { MAX_WORLD = 12, MAX_TENSORS = 8 };

/* A pool of random tensors (gaps between them, as the compiler's 64-float alignment leaves, or
 * random ones) and a world's ranges tiling it: the data-parallel split (64-float blocks, the last
 * rank the tail) or random cut points (empty ranges allowed). */
typedef struct {
    int n, world;
    int64_t off[MAX_TENSORS], numel[MAX_TENSORS], floats;
    int64_t lo[MAX_WORLD], hi[MAX_WORLD];
} pool;

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void random_ranges(pool *p, int world) {
    p->world = world;
    if (dw_test_rnd(0, 1)) { /* train/dp.c's split */
        const int64_t block = p->floats / (world * 64) * 64;
        for (int r = 0; r < world; r++) p->lo[r] = r * block, p->hi[r] = r == world - 1 ? p->floats : (r + 1) * block;
        return;
    }
    int64_t cut[MAX_WORLD + 1];
    cut[0] = 0, cut[world] = p->floats;
    for (int r = 1; r < world; r++) cut[r] = dw_test_rnd(0, p->floats);
    qsort(cut + 1, (size_t)(world - 1), sizeof *cut, cmp_i64);
    for (int r = 0; r < world; r++) p->lo[r] = cut[r], p->hi[r] = cut[r + 1];
}

static pool random_pool(void) {
    pool p;
    memset(&p, 0, sizeof p);
    p.n = (int)dw_test_rnd(1, MAX_TENSORS);
    const bool aligned = dw_test_rnd(0, 1);
    int64_t at = 0;
    for (int i = 0; i < p.n; i++) {
        p.off[i] = at;
        p.numel[i] = dw_test_rnd(1, 700);
        at += p.numel[i];
        at = aligned ? (at + 63) / 64 * 64 : at + dw_test_rnd(0, 5);
    }
    p.floats = at;
    random_ranges(&p, (int)dw_test_rnd(1, MAX_WORLD));
    return p;
}

/* The rank whose range holds pool offset x (the oracle). */
static int owner(const pool *p, int64_t x) {
    for (int r = 0; r < p->world; r++)
        if (p->lo[r] <= x && x < p->hi[r]) return r;
    return -1;
}

static void test_pieces_oracle(void **state) {
    (void)state;
    for (int trial = 0; trial < 400; trial++) {
        pool p = random_pool();
        for (int i = 0; i < p.n; i++) {
            dw_ckpt_piece pc[MAX_WORLD];
            const int np = dw_ckpt_pieces(p.off[i], p.numel[i], p.world, p.lo, p.hi, pc);
            int owners = 0, last = -1;
            for (int64_t e = 0; e < p.numel[i]; e++) { /* each element in one piece, its owner's */
                const int o = owner(&p, p.off[i] + e);
                if (o != last) owners++, last = o;
                int in = 0;
                for (int q = 0; q < np; q++) in += pc[q].begin <= e && e < pc[q].end ? 1 + 100 * (pc[q].rank != o) : 0;
                if (in != 1) fail_msg("trial %d tensor %d element %lld: %d pieces (owner %d)", trial, i, (long long)e, in, o);
            }
            assert_int_equal(np, owners); /* one piece per rank that holds any of it, none empty */
            for (int q = 0; q < np; q++) {
                assert_true(pc[q].begin < pc[q].end);
                if (q) assert_true(pc[q].rank > pc[q - 1].rank);
            }
            char why[160] = "";
            if (!dw_ckpt_pieces_check(pc, np, p.numel[i], why, sizeof why)) fail_msg("trial %d: refused: %s", trial, why);
        }
    }
}

/* pieces_check against counting: valid exactly when every piece is non-empty and inside the
 * tensor and every element is covered once. */
static void test_check_oracle(void **state) {
    (void)state;
    int refused = 0, accepted = 0;
    for (int trial = 0; trial < 3000; trial++) {
        const int64_t numel = dw_test_rnd(1, 60);
        dw_ckpt_piece pc[MAX_WORLD];
        int np = 0;
        if (dw_test_rnd(0, 2)) { /* a valid tiling, then perhaps one change */
            pool p = {.n = 1, .numel = {numel}, .floats = numel};
            random_ranges(&p, (int)dw_test_rnd(1, MAX_WORLD));
            np = dw_ckpt_pieces(0, numel, p.world, p.lo, p.hi, pc);
            const int change = (int)dw_test_rnd(0, 5), q = (int)dw_test_rnd(0, np - 1);
            if (change == 1) pc[q].end += dw_test_rnd(-2, 2);
            if (change == 2) pc[q].begin += dw_test_rnd(-2, 2);
            if (change == 3 && np < MAX_WORLD) pc[np++] = pc[q];
            if (change == 4 && np > 0) pc[q] = pc[--np];
        } else { /* anything */
            np = (int)dw_test_rnd(0, 5);
            for (int q = 0; q < np; q++) {
                pc[q].rank = q;
                pc[q].begin = dw_test_rnd(-3, numel + 3);
                pc[q].end = dw_test_rnd(-3, numel + 3);
            }
        }
        bool valid = true;
        int count[70] = {0};
        for (int q = 0; q < np; q++) {
            if (pc[q].begin < 0 || pc[q].end > numel || pc[q].begin >= pc[q].end) valid = false;
            for (int64_t e = pc[q].begin; valid && e < pc[q].end; e++) count[e]++;
        }
        for (int64_t e = 0; valid && e < numel; e++) valid = count[e] == 1;
        char why[160] = "";
        const bool got = dw_ckpt_pieces_check(pc, np, numel, why, sizeof why);
        if (got != valid) fail_msg("trial %d: check says %d, the count %d (%s)", trial, got, valid, why);
        if (!got && !*why) fail_msg("trial %d: refused without saying why", trial);
        refused += !got, accepted += got;
    }
    assert_true(refused > 300 && accepted > 300); /* both verdicts were exercised */
}

/* A tensor written by one world is read back, range by range, by another: the copies rebuild the
 * wanted elements exactly, each written once. */
static void test_reshard_oracle(void **state) {
    (void)state;
    for (int trial = 0; trial < 400; trial++) {
        pool p = random_pool();
        const int i = (int)dw_test_rnd(0, p.n - 1);
        const int64_t numel = p.numel[i];
        float *value = malloc((size_t)numel * sizeof *value);
        for (int64_t e = 0; e < numel; e++) value[e] = (float)dw_test_next(&dw_test_group_rng);
        dw_ckpt_piece pc[MAX_WORLD];
        const int np = dw_ckpt_pieces(p.off[i], numel, p.world, p.lo, p.hi, pc);
        float *stored[MAX_WORLD]; /* what each shard file holds: its piece's values */
        for (int q = 0; q < np; q++) {
            stored[q] = malloc((size_t)(pc[q].end - pc[q].begin) * sizeof(float));
            memcpy(stored[q], value + pc[q].begin, (size_t)(pc[q].end - pc[q].begin) * sizeof(float));
        }
        pool to = p; /* the reading world: its ranks' parts of the tensor, and one random range */
        random_ranges(&to, (int)dw_test_rnd(1, MAX_WORLD));
        for (int r = 0; r <= to.world; r++) {
            int64_t a, b;
            if (r < to.world) {
                a = to.lo[r] - p.off[i], b = to.hi[r] - p.off[i];
                a = a < 0 ? 0 : a > numel ? numel : a, b = b < a ? a : b > numel ? numel : b;
            } else {
                a = dw_test_rnd(0, numel), b = dw_test_rnd(a, numel);
            }
            float *got = malloc((size_t)(b - a + 1) * sizeof *got);
            int *hits = calloc((size_t)(b - a + 1), sizeof *hits);
            dw_ckpt_copy cp[MAX_WORLD];
            const int nc = dw_ckpt_copies(pc, np, a, b, cp);
            for (int c = 0; c < nc; c++) {
                if (c) assert_true(cp[c].dst > cp[c - 1].dst);
                assert_true(cp[c].count > 0);
                assert_true(cp[c].src >= 0 && cp[c].src + cp[c].count <= pc[cp[c].piece].end - pc[cp[c].piece].begin);
                for (int64_t k = 0; k < cp[c].count; k++) {
                    got[cp[c].dst + k] = stored[cp[c].piece][cp[c].src + k];
                    hits[cp[c].dst + k]++;
                }
            }
            for (int64_t e = a; e < b; e++)
                if (hits[e - a] != 1 || memcmp(&got[e - a], &value[e], sizeof(float)))
                    fail_msg("trial %d: element %lld of [%lld, %lld): written %d times", trial, (long long)e,
                             (long long)a, (long long)b, hits[e - a]);
            free(got);
            free(hits);
        }
        for (int q = 0; q < np; q++) free(stored[q]);
        free(value);
    }
}

static void test_shard_names(void **state) {
    (void)state;
    for (int trial = 0; trial < 500; trial++) {
        const int w = (int)dw_test_rnd(1, 99999), r = (int)dw_test_rnd(0, w - 1);
        char name[64];
        dw_ckpt_shard_name(r, w, name, sizeof name);
        int r2 = -1, w2 = -1;
        assert_true(dw_ckpt_shard_parse(name, &r2, &w2));
        assert_int_equal(r2, r);
        assert_int_equal(w2, w);
    }
    char name[64];
    dw_ckpt_shard_name(1, 4, name, sizeof name);
    assert_string_equal(name, "optimizer-00001-of-00004.safetensors");
    static const char *const bad[] = {"optimizer.safetensors", "optimizer-1-of-4.safetensors",
                                      "optimizer-00004-of-00004.safetensors", "optimizer-00000-of-00000.safetensors",
                                      "optimizer-00001-of-00004.safetensors.tmp", "optimizer--0001-of-00004.safetensors",
                                      "model-00001-of-00004.safetensors", DW_CKPT_INDEX, ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int r = -1, w = -1;
        if (dw_ckpt_shard_parse(bad[i], &r, &w)) fail_msg("'%s' parsed as shard %d of %d", bad[i], r, w);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_oracle),
        cmocka_unit_test(test_check_oracle),
        cmocka_unit_test(test_reshard_oracle),
        cmocka_unit_test(test_shard_names),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
