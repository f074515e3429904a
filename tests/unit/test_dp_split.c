/* test_dp_split.c — sub-communicators (comm.h dw_comm_split) and started collectives
 * (dw_comm_start / dw_comm_test / dw_comm_wait), which data parallelism uses to overlap its bucket
 * reductions with backward and will use to reduce expert gradients among the ranks holding the same
 * experts. 4 tcp ranks (forked): splits by rank mod 2 (the replica sets of --ep 2), by rank / 2 (the
 * expert groups), a lone rank and three others, and a split of a split; on each, all-reduce (SUM,
 * AVG), a started all-reduce, a started reduce to every root, a started all-reduce averaged
 * over the whole job's 4 ranks and a started broadcast from every root (ZeRO-3's prefetched
 * gathers), against exact oracles (whole numbers: any order of addition is
 * exact). Run as `test_dp_split --mpi` under `mpirun -np 4`
 * (tests/cli/test_dp_split.sh) the same checks run over MPI_Comm_split. Bad input: a negative
 * color, a reduce to a root outside the communicator, refused by name. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "deepwell.h"
#include "testutil.h"

enum { W = 4 };

/* Rank r's value i in test t: a whole number in [-50, 50], the same on every rank. */
static float val(uint64_t seed, int t, int r, int64_t i) {
    dw_test_rng g;
    dw_test_rng_init(&g, seed ^ ((uint64_t)t << 52) ^ ((uint64_t)r << 40) ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL);
    return (float)(int)(dw_test_next(&g) % 101) - 50.0f;
}

/* Checks c, the split of the world's ranks `members` (ascending, n of them) that holds rank `me`;
 * 0 when every result is exact. */
static int check_sub(dw_ctx *ctx, dw_comm *c, const int *members, int n, int me, uint64_t seed, int t) {
    int sub = -1;
    for (int k = 0; k < n; k++)
        if (members[k] == me) sub = k;
    if (!c || c->world != n || c->rank != sub) return 10;
    const int64_t len = 300 + (int64_t)(seed % 97);
    float *x = malloc((size_t)len * sizeof *x);
    int bad = 0;
    /* all-reduce SUM, AVG; started all-reduce (SUM); started reduce to every root; started all-reduce
     * averaged over the whole job (divide_by W, as expert gradients are); started broadcast from
     * every root */
    for (int kind = 0; kind < 6 && !bad; kind++) {
        for (int root = 0; root < (kind == 3 || kind == 5 ? n : 1); root++) {
            const int tt = t * 32 + kind * 4 + root;
            for (int64_t i = 0; i < len; i++) x[i] = val(seed, tt, me, i);
            const dw_comm_op op = kind == 1 || kind == 4 ? DW_COMM_AVG
                                  : kind == 3 ? (root % 2 ? DW_COMM_AVG : DW_COMM_SUM) : DW_COMM_SUM;
            const int divide = kind == 4 ? W : n;
            if (kind < 2) {
                if (dw_comm_all_reduce(ctx, c, x, len, DW_COMM_F32, op) != DW_OK) return 11;
            } else {
                dw_comm_async a = {.kind = kind == 5   ? DW_COMM_ASYNC_BROADCAST
                                           : kind == 3 ? DW_COMM_ASYNC_REDUCE
                                                       : DW_COMM_ASYNC_ALL_REDUCE,
                                   .buf = x,
                                   .n = len, .t = DW_COMM_F32, .op = op, .root = root, .divide_by = kind == 4 ? W : 0};
                if (dw_comm_start(ctx, c, &a) != DW_OK) return 12;
                if (dw_comm_test(ctx, c, &a) != DW_OK || dw_comm_wait(ctx, c, &a) != DW_OK) return 13;
                if (!a.done || !(a.seconds >= 0)) return 14;
                if (dw_comm_wait(ctx, c, &a) != DW_OK) return 15; /* a second wait: nothing */
            }
            if (kind == 3 && sub != root) continue; /* the result is the root's */
            for (int64_t i = 0; kind == 5 && i < len; i++) bad += x[i] != val(seed, tt, members[root], i);
            for (int64_t i = 0; kind != 5 && i < len; i++) {
                float want = 0;
                for (int k = 0; k < n; k++) want += val(seed, tt, members[k], i);
                if (op == DW_COMM_AVG) want /= (float)divide;
                bad += x[i] != want;
            }
        }
    }
    free(x);
    return bad ? 16 : 0;
}

/* Every split of the test as world rank `me` of c; 0 when all are right. */
static int splits(dw_ctx *ctx, dw_comm *c, uint64_t seed) {
    const int me = c->rank;
    static const int odd_even[2][2] = {{0, 2}, {1, 3}}, halves[2][2] = {{0, 1}, {2, 3}};
    static const int lone[1] = {3}, rest[3] = {0, 1, 2};
    dw_comm *s = NULL, *s2 = NULL;
    int rc = 0;
    /* replica sets of --ep 2: ranks with the same rank mod 2 */
    if (dw_comm_split(ctx, c, me % 2, &s) != DW_OK) return 20;
    rc = check_sub(ctx, s, odd_even[me % 2], 2, me, seed, 1);
    /* a split of the split: each replica set of two into singles */
    if (!rc && dw_comm_split(ctx, s, s->rank, &s2) != DW_OK) rc = 21;
    if (!rc && (s2->world != 1 || s2->rank != 0)) rc = 22;
    dw_comm_free(s2, true), s2 = NULL;
    dw_comm_free(s, true), s = NULL;
    /* expert groups of --ep 2: consecutive ranks */
    if (!rc && dw_comm_split(ctx, c, me / 2, &s) != DW_OK) rc = 23;
    if (!rc) rc = check_sub(ctx, s, halves[me / 2], 2, me, seed, 2);
    dw_comm_free(s, true), s = NULL;
    /* one rank alone (colors need not be small), the three others */
    if (!rc && dw_comm_split(ctx, c, me == 3 ? 1000 : 7, &s) != DW_OK) rc = 24;
    if (!rc) rc = me == 3 ? check_sub(ctx, s, lone, 1, me, seed, 3) : check_sub(ctx, s, rest, 3, me, seed, 3);
    dw_comm_free(s, true), s = NULL;
    /* started collectives on the world itself: every root */
    static const int all[W] = {0, 1, 2, 3};
    if (!rc) rc = check_sub(ctx, c, all, W, me, seed, 4);
    /* a reduce to a root outside the communicator is refused before anything is sent */
    float x = 1;
    dw_comm_async a = {.kind = DW_COMM_ASYNC_REDUCE, .buf = &x, .n = 1, .t = DW_COMM_F32, .root = W};
    if (!rc && (dw_comm_start(ctx, c, &a) != DW_ERR_INVALID || !strstr(dw_errmsg(ctx), "root 4 of 4"))) rc = 25;
    a = (dw_comm_async){.kind = DW_COMM_ASYNC_BROADCAST, .buf = &x, .n = 1, .t = DW_COMM_F32, .root = -1};
    if (!rc && (dw_comm_start(ctx, c, &a) != DW_ERR_INVALID || !strstr(dw_errmsg(ctx), "broadcast: root -1"))) rc = 27;
    if (!rc && dw_comm_barrier(ctx, c) != DW_OK) rc = 26;
    if (rc) fprintf(stderr, "rank %d: split checks failed (%d): %s\n", me, rc, dw_errmsg(ctx));
    return rc;
}

/* ---- tcp among forked ranks ---------------------------------------------------------------- */
static int run_rank(int rank, int port, uint64_t seed) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return 90;
    dw_comm *c = NULL;
    if (dw_comm_tcp_create(ctx, rank, W, rank, "127.0.0.1", port, 20, &c) != DW_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dw_errmsg(ctx));
        return 91;
    }
    const int rc = splits(ctx, c, seed);
    dw_comm_free(c, rc == 0);
    dw_ctx_free(ctx);
    return rc;
}

static void test_tcp_splits(void **state) {
    (void)state;
    const int port = dw_test_free_port();
    assert_true(port > 0);
    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    fflush(stdout), fflush(stderr);
    pid_t kids[W] = {0};
    for (int r = 1; r < W; r++) {
        kids[r] = fork();
        assert_true(kids[r] >= 0);
        if (kids[r] == 0) _exit(run_rank(r, port, seed));
    }
    assert_int_equal(run_rank(0, port, seed), 0);
    for (int r = 1; r < W; r++) {
        int status = 0;
        assert_int_equal(waitpid(kids[r], &status, 0), kids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

static void test_refusals(void **state) {
    (void)state;
    dw_comm *c = NULL, *s = (dw_comm *)1;
    assert_int_equal(dw_comm_self_create(dw_test_ctx, &c), DW_OK);
    assert_int_equal(dw_comm_split(dw_test_ctx, c, -1, &s), DW_ERR_INVALID);
    assert_null(s);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "color -1"));
    assert_int_equal(dw_comm_split(dw_test_ctx, c, 5, &s), DW_OK); /* one rank: itself */
    assert_true(s->world == 1 && s->rank == 0);
    float x[2] = {3, 4};
    dw_comm_async a = {.kind = DW_COMM_ASYNC_ALL_REDUCE, .buf = x, .n = 2, .t = DW_COMM_F32, .op = DW_COMM_AVG};
    assert_int_equal(dw_comm_start(dw_test_ctx, s, &a), DW_OK);
    assert_true(a.done && x[0] == 3 && x[1] == 4);
    a.t = DW_COMM_I64; /* an average of integers */
    assert_int_equal(dw_comm_start(dw_test_ctx, s, &a), DW_ERR_INVALID);
    a = (dw_comm_async){.kind = (dw_comm_async_kind)7, .buf = x, .n = 2, .t = DW_COMM_F32};
    assert_int_equal(dw_comm_start(dw_test_ctx, s, &a), DW_ERR_INVALID);
    dw_comm_free(s, true);
    dw_comm_free(c, true);
}

/* Under mpirun -np 4: the same splits over MPI, as the job's communicator. */
static int mpi_main(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return 90;
    uint64_t seed = 0;
    dw_comm *c = dw_test_mpi_world(ctx, W, "test_dp_split", &seed);
    if (!c) return 91;
    const int rc = splits(ctx, c, seed);
    if (c->rank == 0) printf("%s: mpi splits of %d ranks (seed %llu)\n", rc ? "FAIL" : "ok", W, (unsigned long long)seed);
    dw_dist_shutdown(rc == 0);
    dw_ctx_free(ctx);
    return rc;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--mpi")) return mpi_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_splits),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
