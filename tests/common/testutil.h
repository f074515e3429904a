/* testutil.h — helpers shared by the tests: fresh random seeds, temporary directories,
 * reading expected data paths. Every test draws new random inputs per run and prints the seed
 * so a failure can be replayed with DW_TEST_SEED=<seed>. */
#ifndef DW_TESTUTIL_H
#define DW_TESTUTIL_H

#include <stdint.h>
#include <stddef.h>

/* The run's seed: DW_TEST_SEED if set, else from the clock and pid; printed once. */
uint64_t dw_test_seed(void);
/* splitmix64 / xoshiro-style generator for tests. */
typedef struct { uint64_t s; } dw_test_rng;
void dw_test_rng_init(dw_test_rng *r, uint64_t seed);
uint64_t dw_test_next(dw_test_rng *r);
float dw_test_uniform(dw_test_rng *r, float lo, float hi);
float dw_test_normal(dw_test_rng *r);

/* Creates a fresh temporary directory (removed by dw_test_rmtree); returns a static path copy
 * the caller frees. */
char *dw_test_tmpdir(void);
void dw_test_rmtree(const char *path);
/* path join into a malloc'd string */
char *dw_test_path(const char *dir, const char *name);
/* Writes bytes to a file (non-atomically; for fixtures). Returns 0 on success. */
int dw_test_write(const char *path, const void *data, size_t n);

/* A cmocka group fixture shared by the tests that need a CPU context and a seeded generator:
 * cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown). */
struct dw_ctx;
extern struct dw_ctx *dw_test_ctx;
extern dw_test_rng dw_test_group_rng;
int dw_test_group_setup(void **state);
int dw_test_group_teardown(void **state);
/* The GPU tests' fixture: a CPU and a CUDA context (0), or -1 with the reason on stderr. */
int dw_test_cpu_gpu_setup(struct dw_ctx **cpu, struct dw_ctx **gpu);
void dw_test_cpu_gpu_teardown(struct dw_ctx *cpu, struct dw_ctx *gpu);
/* Uniform integer in [lo, hi] from dw_test_group_rng. */
int64_t dw_test_rnd(int64_t lo, int64_t hi);

#endif
