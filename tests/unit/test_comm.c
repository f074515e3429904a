/* test_comm.c — the communicator (src/comm/): the launchers' environments read strictly (mpirun,
 * torchrun, srun; malformed values named), Slurm node lists, the self backend, and every
 * collective of the tcp backend among 3 forked ranks on fresh random data against exact oracles
 * (sums in rank order, so equality is exact), a rank that dies named within the timeout, and the
 * data reader's rank split (dw_data_next_rank) against one reader of world x B windows. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm/comm.h"
#include "deepwell.h"
#include "testutil.h"
#include "train/data.h"

static const char *const launch_vars[] = {
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_STEP_ID",
    "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "SLURM_NTASKS_PER_NODE"};

static void clear_env(void) {
    for (size_t i = 0; i < sizeof launch_vars / sizeof launch_vars[0]; i++) unsetenv(launch_vars[i]);
}

static void test_launch_env(void **state) {
    (void)state;
    dw_launch_env e;
    clear_env();
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_OK);
    assert_int_equal(e.world, 1);
    assert_string_equal(e.launcher, "none");

    /* torchrun (and deepwell launch) */
    setenv("RANK", "3", 1), setenv("WORLD_SIZE", "4", 1), setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1), setenv("MASTER_ADDR", "node7", 1), setenv("MASTER_PORT", "29400", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_OK);
    assert_string_equal(e.launcher, "torchrun");
    assert_int_equal(e.rank, 3), assert_int_equal(e.world, 4), assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_world, 2), assert_int_equal(e.master_port, 29400);
    assert_string_equal(e.master_addr, "node7");
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1); /* the agent's store holds MASTER_PORT */
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_OK);
    assert_int_equal(e.master_port, 29401);
    setenv("RANK", "4", 1); /* rank outside the world */
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "RANK=4"));
    setenv("RANK", "1x", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "RANK=1x"));
    setenv("RANK", "1", 1);
    unsetenv("MASTER_ADDR");
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "MASTER_ADDR"));
    assert_int_equal(e.world, 1); /* an error leaves one rank */

    /* mpirun takes precedence over torchrun's variables */
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1), setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1), setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_OK);
    assert_string_equal(e.launcher, "mpirun");
    assert_int_equal(e.rank, 1), assert_int_equal(e.world, 2), assert_int_equal(e.local_rank, 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "OMPI_COMM_WORLD_LOCAL_RANK=2"));

    /* srun: only inside a job step; the first host of the step's nodes and a port from the job id */
    clear_env();
    setenv("SLURM_PROCID", "5", 1), setenv("SLURM_NTASKS", "8", 1), setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_NODELIST", "gpu[003-006,010],cpu1", 1), setenv("SLURM_JOB_ID", "123456", 1);
    setenv("SLURM_NTASKS_PER_NODE", "4(x2)", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_OK);
    assert_string_equal(e.launcher, "none"); /* a batch script (no SLURM_STEP_ID) is not a rank */
    setenv("SLURM_STEP_ID", "0", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_OK);
    assert_string_equal(e.launcher, "srun");
    assert_int_equal(e.rank, 5), assert_int_equal(e.world, 8), assert_int_equal(e.local_rank, 1);
    assert_int_equal(e.local_world, 4), assert_int_equal(e.master_port, 29500 + 456);
    assert_string_equal(e.master_addr, "gpu003");
    setenv("SLURM_NTASKS", "-2", 1);
    assert_int_equal(dw_launch_env_read(dw_test_ctx, &e), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "SLURM_NTASKS=-2"));
    clear_env();

    /* the public view */
    setenv("RANK", "0", 1), setenv("WORLD_SIZE", "1", 1);
    dw_dist_env d;
    assert_int_equal(dw_dist_env_get(&d), DW_OK);
    assert_int_equal(d.world_size, 1);
    assert_string_equal(d.launcher, "torchrun");
    clear_env();
}

static void test_slurm_hosts(void **state) {
    (void)state;
    char h[64];
    assert_true(dw_slurm_first_host("n1,n2", h, sizeof h)), assert_string_equal(h, "n1");
    assert_true(dw_slurm_first_host("a[07-09]", h, sizeof h)), assert_string_equal(h, "a07");
    assert_true(dw_slurm_first_host("rack[2,4]-gpu", h, sizeof h)), assert_string_equal(h, "rack2-gpu");
    assert_false(dw_slurm_first_host("a[07-09", h, sizeof h));
    assert_false(dw_slurm_first_host("", h, sizeof h));
    assert_false(dw_slurm_first_host("averyveryverylongname", h, 8));
}

static void test_self(void **state) {
    (void)state;
    dw_comm *c = NULL;
    assert_int_equal(dw_comm_self_create(dw_test_ctx, &c), DW_OK);
    float x[3] = {1, 2, 3};
    assert_int_equal(dw_comm_all_reduce(dw_test_ctx, c, x, 3, DW_COMM_F32, DW_COMM_AVG), DW_OK);
    assert_int_equal(dw_comm_reduce_scatter(dw_test_ctx, c, x, 3, DW_COMM_F32, DW_COMM_SUM), DW_OK);
    assert_int_equal(dw_comm_broadcast(dw_test_ctx, c, x, 3, DW_COMM_F32, 0), DW_OK);
    assert_true(x[0] == 1 && x[1] == 2 && x[2] == 3);
    int64_t s[2] = {7, 8}, r[2] = {0, 0}, n1 = 2, n2 = 2;
    assert_int_equal(dw_comm_all_to_all(dw_test_ctx, c, s, &n1, r, &n2, DW_COMM_I64), DW_OK);
    assert_true(r[0] == 7 && r[1] == 8);
    assert_int_equal(dw_comm_broadcast(dw_test_ctx, c, x, 3, DW_COMM_F32, 1), DW_ERR_INVALID);
    assert_int_equal(dw_comm_all_reduce(dw_test_ctx, c, s, 2, DW_COMM_I64, DW_COMM_AVG), DW_ERR_INVALID);
    dw_comm_free(c, true);
}

/* ---- tcp among forked ranks ------------------------------------------------------------------ */
enum { W = 3 };

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Rank r's input value i of a test, the same on every rank (each recomputes the others'). */
static float val(uint64_t seed, int r, int64_t i) {
    dw_test_rng g;
    dw_test_rng_init(&g, seed ^ ((uint64_t)r << 40) ^ (uint64_t)i * 0x9e3779b97f4a7c15ULL);
    return dw_test_uniform(&g, -4, 4);
}

/* Runs every collective as rank `rank`; 0 when every result is exact. */
static int collectives(dw_ctx *ctx, dw_comm *c, uint64_t seed) {
    const int rank = c->rank;
    const int64_t n = 1000 + (int64_t)(seed % 300), ne = 37; /* odd sizes */
    float *x = malloc((size_t)(n > ne * W ? n : ne * W) * sizeof *x);
    int bad = 0;
    /* all-reduce SUM and AVG: rank 0 adds in rank order, so the oracle is exact */
    for (int op = 0; op < 2; op++) {
        for (int64_t i = 0; i < n; i++) x[i] = val(seed + (uint64_t)op, rank, i);
        if (dw_comm_all_reduce(ctx, c, x, n, DW_COMM_F32, (dw_comm_op)op) != DW_OK) return 100;
        for (int64_t i = 0; i < n; i++) {
            float want = val(seed + (uint64_t)op, 0, i);
            for (int r = 1; r < W; r++) want += val(seed + (uint64_t)op, r, i);
            if (op == DW_COMM_AVG) want /= (float)W;
            bad += x[i] != want;
        }
    }
    /* reduce-scatter (AVG): this rank's block */
    for (int64_t i = 0; i < ne * W; i++) x[i] = val(seed + 2, rank, i);
    if (dw_comm_reduce_scatter(ctx, c, x, ne, DW_COMM_F32, DW_COMM_AVG) != DW_OK) return 101;
    for (int64_t i = rank * ne; i < (rank + 1) * ne; i++) {
        float want = val(seed + 2, 0, i);
        for (int r = 1; r < W; r++) want += val(seed + 2, r, i);
        bad += x[i] != want / (float)W;
    }
    /* all-gather: block r from rank r */
    for (int64_t i = 0; i < ne * W; i++) x[i] = i / ne == rank ? val(seed + 3, rank, i) : NAN;
    if (dw_comm_all_gather(ctx, c, x, ne, DW_COMM_F32) != DW_OK) return 102;
    for (int64_t i = 0; i < ne * W; i++) bad += x[i] != val(seed + 3, (int)(i / ne), i);
    /* broadcast from rank 1 (not the hub) */
    for (int64_t i = 0; i < n; i++) x[i] = val(seed + 4, rank, i);
    if (dw_comm_broadcast(ctx, c, x, n, DW_COMM_F32, 1) != DW_OK) return 103;
    for (int64_t i = 0; i < n; i++) bad += x[i] != val(seed + 4, 1, i);
    if (dw_comm_barrier(ctx, c) != DW_OK) return 104;
    /* all-to-all: rank s sends (s + 2 d + seed) % 5 int64 to rank d, values naming s, d and k */
    int64_t sc[W], rc[W], send[64], recv[64], o = 0;
    for (int d = 0; d < W; d++) {
        sc[d] = (int64_t)((rank + 2 * d + seed) % 5), rc[d] = (int64_t)((d + 2 * rank + seed) % 5);
        for (int64_t k = 0; k < sc[d]; k++) send[o++] = rank * 10000 + d * 100 + k;
    }
    if (dw_comm_all_to_all(ctx, c, send, sc, recv, rc, DW_COMM_I64) != DW_OK) return 105;
    o = 0;
    for (int s = 0; s < W; s++)
        for (int64_t k = 0; k < rc[s]; k++) bad += recv[o++] != s * 10000 + rank * 100 + k;
    /* mismatching counts are an error, not a hang or garbage: rank 0 expects one too many from
     * rank 1 and says so; the others hear that rank 0 left (the caller closes it) */
    if (rank == 0) rc[1]++;
    dw_status st = dw_comm_all_to_all(ctx, c, send, sc, recv, rc, DW_COMM_I64);
    if (rank == 0) bad += st != DW_ERR_INVALID || !strstr(dw_errmsg(ctx), "expects");
    if (rank == 0) dw_comm_free(c, false);
    if (rank != 0) bad += st != DW_ERR_IO || !strstr(dw_errmsg(ctx), "rank 0");
    free(x);
    return bad ? 1 : 0;
}

static int run_rank(int rank, int port, uint64_t seed, bool die) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return 90;
    dw_comm *c = NULL;
    if (dw_comm_tcp_create(ctx, rank, W, rank, "127.0.0.1", port, 20, &c) != DW_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, dw_errmsg(ctx));
        return 91;
    }
    int rc = 0;
    if (die && rank == 2) {
        dw_comm_free(c, false); /* leaves before the first collective */
    } else if (die) {         /* the others are told who is gone */
        float x = 1;
        dw_status st = dw_comm_all_reduce(ctx, c, &x, 1, DW_COMM_F32, DW_COMM_SUM);
        rc = st == DW_OK ? 92 : strstr(dw_errmsg(ctx), rank == 0 ? "rank 2" : "rank 0") ? 0 : 93;
        dw_comm_free(c, false);
    } else {
        rc = collectives(ctx, c, seed); /* rank 0 frees c there */
        if (rc) fprintf(stderr, "rank %d: collectives failed (%d): %s\n", rank, rc, dw_errmsg(ctx));
        if (rank != 0) dw_comm_free(c, false);
    }
    dw_ctx_free(ctx);
    return rc;
}

/* Forks ranks 1 and 2, runs rank 0 here; every rank must return 0. */
static void tcp_job(bool die) {
    const int port = free_port();
    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    fflush(stdout), fflush(stderr);
    pid_t kids[W] = {0};
    for (int r = 1; r < W; r++) {
        kids[r] = fork();
        assert_true(kids[r] >= 0);
        if (kids[r] == 0) _exit(run_rank(r, port, seed, die));
    }
    assert_int_equal(run_rank(0, port, seed, die), 0);
    for (int r = 1; r < W; r++) {
        int status = 0;
        assert_int_equal(waitpid(kids[r], &status, 0), kids[r]);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 0);
    }
}

static void test_tcp_collectives(void **state) {
    (void)state;
    tcp_job(false);
}

static void test_tcp_dead_rank(void **state) {
    (void)state;
    tcp_job(true);
}

static void test_tcp_nobody_comes(void **state) {
    (void)state;
    dw_comm *c = NULL;
    assert_int_equal(dw_comm_tcp_create(dw_test_ctx, 0, 2, 0, "127.0.0.1", free_port(), 0.3, &c), DW_ERR_IO);
    assert_null(c);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "1 of 2 ranks joined"));
    assert_int_equal(dw_comm_tcp_create(dw_test_ctx, 1, 2, 1, "127.0.0.1", free_port(), 0.3, &c), DW_ERR_IO);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "cannot reach rank 0"));
}

/* Ranks' parts of each micro-batch, side by side, are one reader's world x B windows. */
static void test_data_rank_split(void **state) {
    (void)state;
    char *dir = dw_test_tmpdir(), *path = dw_test_path(dir, "t.txt");
    const int64_t nbytes = 3000 + dw_test_rnd(0, 500), T = 16, B = 3;
    char *text = malloc((size_t)nbytes);
    for (int64_t i = 0; i < nbytes; i++) text[i] = (char)('a' + dw_test_next(&dw_test_group_rng) % 26);
    assert_int_equal(dw_test_write(path, text, (size_t)nbytes), 0);
    dw_data_opts o = {.pattern = path, .T = T, .vocab_size = 256, .shuffle = true, .seed = 5};
    for (int world = 1; world <= 3; world++) {
        dw_data *one = NULL, *part[3] = {NULL, NULL, NULL};
        assert_int_equal(dw_data_open(dw_test_ctx, &o, &one), DW_OK);
        for (int r = 0; r < world; r++) assert_int_equal(dw_data_open(dw_test_ctx, &o, &part[r]), DW_OK);
        int32_t x[3 * 3 * 16], y[3 * 3 * 16], px[3 * 16], py[3 * 16];
        for (int step = 0; step < 40; step++) { /* past an epoch: the reshuffle too */
            dw_data_next(one, B * world, x, y);
            for (int r = 0; r < world; r++) {
                dw_data_next_rank(part[r], B, r, world, px, py);
                assert_memory_equal(px, x + r * B * T, sizeof px);
                assert_memory_equal(py, y + r * B * T, sizeof py);
                assert_int_equal(dw_data_position(part[r]), dw_data_position(one));
            }
        }
        dw_data_free(one);
        for (int r = 0; r < world; r++) dw_data_free(part[r]);
    }
    free(text);
    free(path);
    dw_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launch_env),      cmocka_unit_test(test_slurm_hosts),
        cmocka_unit_test(test_self),            cmocka_unit_test(test_tcp_collectives),
        cmocka_unit_test(test_tcp_dead_rank),   cmocka_unit_test(test_tcp_nobody_comes),
        cmocka_unit_test(test_data_rank_split),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
