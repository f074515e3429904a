/* test_moe_fp8_ep.c — fp8_block MoE experts under expert parallelism (train/ep.c with
 * runtime/moe_fp8.h's moe_ep) on 2 forked tcp ranks, each holding a one-rank engine of the same
 * weights beside its --ep 2 engine (a Mixtral of hidden 128, experts of 256, 4 experts: 2 a rank),
 * all three expert passes in fp8_block (DW_TEST_FP8_WGRAD: the rule's "bf16_passes": [], so the
 * owner's wgrad quantises the rows it receives too; the default's BF16 wgrad: tests/cli/test_ep_fp8.sh):
 *   - the rank's loss of a forward+backward over its own batch equals the one-rank engine's bit for
 *     bit (every row is quantised 1x128 alone and meets its expert's cached W the same way on
 *     whichever rank), and so does the embedding's gradient (dgrad's rows travel back unchanged);
 *   - after the expert masters change, the refresh quantises this rank's experts only: their W and
 *     W^T codes and scales equal the one-rank cache's slices byte for byte, the other experts'
 *     slices keep their old bytes;
 *   - suspended (every expert local, as a sample runs), the forward equals the one-rank engine's and
 *     the whole cache equals its cache; dw_ep_free leaves the whole cache current too.
 * With --mpi, under mpirun -np 2 (tests/cli/test_ep_fp8.sh), the same over the job's MPI ranks. */
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

#include "capture/capture.h"
#include "comm/comm.h"
#include "compile/program.h"
#include "runtime/engine.h"
#include "testutil.h"
#include "train/ep.h"

enum { W = 2, B = 2, T = 16 };

static dw_graph *mixtral128(dw_ctx *ctx) {
    dw_model_config c;
    if (dw_model_config_load(ctx, "mixtral-tiny", &c) != DW_OK) return NULL;
    c.d_model = 128, c.head_dim = 32, c.d_ff = 256, c.d_ff_expert = 256;
    dw_graph *g = NULL;
    return dw_capture_config(ctx, &c, B, T, &g) == DW_OK ? g : NULL;
}

/* Node's cache t (0: W [E,M,K], 1: W^T [E,K,M]) of engine e: codes and FP32 scales, per expert. */
typedef struct {
    const uint8_t *codes;
    const uint8_t *scales;
    int64_t codes_each, scales_each; /* bytes per expert */
} cache;
static cache cache_of(const dw_engine *e, int node, int t) {
    const dw_qslot_layout *l = &e->p->node[node].wq[t];
    const int64_t *sh = e->g->tensors[e->g->nodes[node].in[1]].shape;
    const uint8_t *at = (const uint8_t *)e->x->work + l->off;
    return (cache){.codes = at, .scales = at + l->scales, .codes_each = sh[1] * sh[2],
                   .scales_each = (sh[1] / 128) * (sh[2] / 128) * 4};
}
static bool same_expert(cache a, cache b, int64_t x) {
    return !memcmp(a.codes + x * a.codes_each, b.codes + x * b.codes_each, (size_t)a.codes_each) &&
           !memcmp(a.scales + x * a.scales_each, b.scales + x * b.scales_each, (size_t)a.scales_each);
}

/* The expert layers with a weight cache. */
static int cached_nodes(const dw_engine *e, int *out) {
    int n = 0;
    for (int i = 0; i < e->g->n_nodes; i++)
        if (e->g->nodes[i].op == DW_OP_MOE_LINEAR && e->p->node[i].wq[0].off >= 0) out[n++] = i;
    return n;
}

/* Every expert master of both engines moved by the same normal(0, 0.02) draws. */
static void move_experts(dw_engine *a, dw_engine *b, const int *nodes, int n, uint64_t seed) {
    dw_engine *es[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        dw_test_rng r;
        dw_test_rng_init(&r, seed);
        for (int j = 0; j < n; j++) {
            const dw_ir_tensor *w = &es[k]->g->tensors[es[k]->g->nodes[nodes[j]].in[1]];
            float *m = es[k]->x->w + es[k]->p->param_off[es[k]->p->tensor[es[k]->g->nodes[nodes[j]].in[1]].param];
            for (int64_t i = 0; i < dw_ir_numel(w); i++) m[i] += 0.02f * dw_test_normal(&r);
        }
    }
}

/* A copy of node's two caches (W then W^T, codes then scales). */
static uint8_t *snapshot(const dw_engine *e, int node, int64_t experts) {
    uint8_t *s = malloc((size_t)(4 * experts) * (size_t)(cache_of(e, node, 0).codes_each + 1024));
    uint8_t *o = s;
    for (int t = 0; t < 2; t++) {
        const cache c = cache_of(e, node, t);
        memcpy(o, c.codes, (size_t)(experts * c.codes_each)), o += experts * c.codes_each;
        memcpy(o, c.scales, (size_t)(experts * c.scales_each)), o += experts * c.scales_each;
    }
    return s;
}
static cache cache_in(const dw_engine *e, int node, int t, const uint8_t *snap, int64_t experts) {
    cache c = cache_of(e, node, t);
    const uint8_t *o = snap + (t ? experts * (c.codes_each + c.scales_each) : 0);
    c.codes = o, c.scales = o + experts * c.codes_each;
    return c;
}

#define CHECK(cond, ...)                                                                                             \
    do {                                                                                                           \
        if (!(cond)) {                                                                                             \
            fprintf(stderr, "rank %d: ", rank), fprintf(stderr, __VA_ARGS__), fputc('\n', stderr);                \
            rc = __LINE__;                                                                                         \
            goto done;                                                                                             \
        }                                                                                                          \
    } while (0)

/* Everything above on this rank of comm (2 ranks); 0, or the failing line. */
static int checks(dw_ctx *ctx, dw_comm *comm, uint64_t seed) {
    const int rank = comm->rank;
    int rc = 0, nodes[16], n = 0;
    dw_ep *ep = NULL;
    dw_test_model ref = {0}, m = {0};
    uint8_t *old[16] = {0};
    float *ga = NULL, *gb = NULL;
    dw_graph *g1 = mixtral128(ctx), *g2 = mixtral128(ctx);
    CHECK(g1 && g2, "capture: %s", dw_errmsg(ctx));
    CHECK(dw_test_model_build(ctx, g1, DW_TEST_FP8_WGRAD, DW_DEVICE_AUTO, &ref) == DW_OK, "build: %s", dw_errmsg(ctx));
    CHECK(dw_test_model_build(ctx, g2, DW_TEST_FP8_WGRAD, DW_DEVICE_AUTO, &m) == DW_OK, "build: %s", dw_errmsg(ctx));
    dw_test_rng r;
    dw_test_rng_init(&r, seed), dw_test_random_params(ref.e, &r, 0.05f, NULL, 0);
    dw_test_rng_init(&r, seed), dw_test_random_params(m.e, &r, 0.05f, NULL, 0);
    CHECK(dw_engine_refresh(ref.e) == DW_OK && dw_engine_refresh(m.e) == DW_OK, "refresh: %s", dw_errmsg(ctx));
    n = cached_nodes(m.e, nodes);
    CHECK(n == 6, "%d expert layers with an fp8_block weight cache, expected 6 (3 a MoE layer)", n);
    for (int j = 0; j < n; j++) /* the owner's wgrad operand slots in use too */
        CHECK(m.c->node[nodes[j]].bind.quantised[DW_QPASS_WGRAD], "%s: wgrad not fp8_block", m.g->nodes[nodes[j]].name);
    const int64_t E = m.g->tensors[m.g->nodes[nodes[0]].in[1]].shape[0], El = E / W, first = rank * El;
    int32_t x[B * T], y[B * T];
    dw_test_rng_init(&r, seed ^ (0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1))); /* each rank its own batch */
    dw_test_random_tokens(x, B * T, m.g->model.vocab, &r), dw_test_random_tokens(y, B * T, m.g->model.vocab, &r);

    /* forward and backward of this rank's batch through the group's experts */
    CHECK(dw_ep_create(m.e, comm, W, &ep) == DW_OK, "dw_ep_create: %s", dw_errmsg(ctx));
    double la = 0, lb = 0;
    CHECK(dw_engine_forward_backward(ref.e, x, y, B, T, 1.0, &la) == DW_OK, "%s", dw_errmsg(ctx));
    CHECK(dw_engine_forward_backward(m.e, x, y, B, T, 1.0, &lb) == DW_OK, "%s", dw_errmsg(ctx));
    CHECK(la == lb, "--ep 2 loss %.9g, one rank's %.9g", lb, la);
    int ia = -1, ib = -1;
    ga = dw_test_param_read(ref.e, "model.embed_tokens.weight", &ia);
    gb = dw_test_param_read(m.e, "model.embed_tokens.weight", &ib);
    CHECK(ga && gb, "no model.embed_tokens.weight");
    const int64_t ne = dw_test_param_numel(m.e, ib);
    const float *da = ref.e->x->grad + ref.e->p->param_off[ia], *db = m.e->x->grad + m.e->p->param_off[ib];
    CHECK(!memcmp(da, db, (size_t)ne * sizeof *da), "the embedding's gradient differs from one rank's");

    /* the refresh after an update: this rank's experts, byte for byte the one-rank cache's */
    for (int j = 0; j < n; j++) old[j] = snapshot(m.e, nodes[j], E);
    move_experts(ref.e, m.e, nodes, n, seed + 1);
    CHECK(dw_engine_refresh(ref.e) == DW_OK && dw_engine_refresh(m.e) == DW_OK, "refresh: %s", dw_errmsg(ctx));
    for (int j = 0; j < n; j++)
        for (int t = 0; t < 2; t++) {
            const cache a = cache_of(ref.e, nodes[j], t), b = cache_of(m.e, nodes[j], t);
            const cache o = cache_in(m.e, nodes[j], t, old[j], E);
            for (int64_t e = 0; e < E; e++) {
                const bool mine = e >= first && e < first + El;
                CHECK(same_expert(mine ? a : o, b, e), "node %s cache %d expert %lld: not the %s bytes",
                      m.g->nodes[nodes[j]].name, t, (long long)e, mine ? "one-rank cache's" : "old");
                CHECK(mine || !same_expert(a, b, e), "node %s expert %lld: the move did not change its cache",
                      m.g->nodes[nodes[j]].name, (long long)e);
            }
        }

    /* suspended: every expert here, the caches whole again */
    dw_ep_suspend(ep, true);
    CHECK(dw_engine_forward(ref.e, x, y, B, T, NULL, &la) == DW_OK, "%s", dw_errmsg(ctx));
    CHECK(dw_engine_forward(m.e, x, y, B, T, NULL, &lb) == DW_OK, "%s", dw_errmsg(ctx));
    CHECK(la == lb, "suspended: loss %.9g, one rank's %.9g", lb, la);
    for (int j = 0; j < n; j++)
        for (int t = 0; t < 2; t++)
            for (int64_t e = 0; e < E; e++)
                CHECK(same_expert(cache_of(ref.e, nodes[j], t), cache_of(m.e, nodes[j], t), e),
                      "suspended: node %s cache %d expert %lld differs", m.g->nodes[nodes[j]].name, t, (long long)e);
    dw_ep_suspend(ep, false);

    /* freed after a local refresh: whole again */
    move_experts(ref.e, m.e, nodes, n, seed + 2);
    CHECK(dw_engine_refresh(ref.e) == DW_OK && dw_engine_refresh(m.e) == DW_OK, "refresh: %s", dw_errmsg(ctx));
    dw_ep_free(ep), ep = NULL;
    for (int j = 0; j < n; j++)
        for (int t = 0; t < 2; t++)
            for (int64_t e = 0; e < E; e++)
                CHECK(same_expert(cache_of(ref.e, nodes[j], t), cache_of(m.e, nodes[j], t), e),
                      "after dw_ep_free: node %s cache %d expert %lld differs", m.g->nodes[nodes[j]].name, t,
                      (long long)e);
done:
    for (int j = 0; j < 16; j++) free(old[j]);
    free(ga), free(gb);
    dw_ep_free(ep);
    dw_test_model_free(&m), dw_test_model_free(&ref);
    return rc;
}

static int run_rank(int rank, int port, uint64_t seed) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return 90;
    dw_comm *comm = NULL;
    int rc = 91;
    if (dw_comm_tcp_create(ctx, rank, W, rank, "127.0.0.1", port, 20, &comm) == DW_OK) rc = checks(ctx, comm, seed);
    else fprintf(stderr, "rank %d: %s\n", rank, dw_errmsg(ctx));
    dw_comm_free(comm, rc == 0);
    dw_ctx_free(ctx);
    return rc;
}

/* Under mpirun -np 2 (tests/cli/test_ep_fp8.sh): the same checks with the job's MPI communicator. */
static int mpi_main(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts co = {.device = DW_DEVICE_CPU};
    if (dw_ctx_create(&co, &ctx) != DW_OK) return 90;
    uint64_t seed = 0;
    dw_comm *c = dw_test_mpi_world(ctx, W, "test_moe_fp8_ep", &seed);
    if (!c) return 91;
    const int rc = checks(ctx, c, seed);
    if (c->rank == 0) printf("%s: fp8_block experts under --ep 2 over mpi (seed %llu)\n", rc ? "FAIL" : "ok",
                             (unsigned long long)seed);
    dw_dist_shutdown(rc == 0);
    dw_ctx_free(ctx);
    return rc;
}

static void test_ep_fp8(void **state) {
    (void)state;
    const int port = dw_test_free_port();
    assert_true(port > 0);
    const uint64_t seed = dw_test_next(&dw_test_group_rng);
    fflush(stdout), fflush(stderr);
    const pid_t kid = fork();
    assert_true(kid >= 0);
    if (kid == 0) _exit(run_rank(1, port, seed));
    const int rc = run_rank(0, port, seed);
    int status = 0;
    assert_int_equal(waitpid(kid, &status, 0), kid);
    assert_int_equal(rc, 0);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--mpi")) return mpi_main();
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ep_fp8)};
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
