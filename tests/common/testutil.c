/* testutil.c — helpers shared by the tests (see testutil.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "deepwell.h"
#include "testutil.h"

uint64_t dw_test_seed(void) {
    static uint64_t seed = 0;
    static int have = 0;
    if (!have) {
        const char *env = getenv("DW_TEST_SEED");
        if (env && *env) {
            seed = strtoull(env, NULL, 0);
        } else {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
        }
        have = 1;
        fprintf(stderr, "test seed: DW_TEST_SEED=%llu\n", (unsigned long long)seed);
    }
    return seed;
}

void dw_test_rng_init(dw_test_rng *r, uint64_t seed) { r->s = seed; }

uint64_t dw_test_next(dw_test_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

float dw_test_uniform(dw_test_rng *r, float lo, float hi) {
    double u = (double)(dw_test_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

float dw_test_normal(dw_test_rng *r) {
    double u1 = ((double)(dw_test_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double u2 = (double)(dw_test_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

char *dw_test_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/dwtest.XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    return d ? strdup(d) : NULL;
}

void dw_test_rmtree(const char *path) {
    if (!path || !*path || strstr(path, "dwtest.") == NULL) return; /* only our own dirs */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

char *dw_test_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

int dw_test_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(data, 1, n, f);
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

dw_ctx *dw_test_ctx;
dw_test_rng dw_test_group_rng;

int dw_test_group_setup(void **state) {
    (void)state;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    dw_test_rng_init(&dw_test_group_rng, dw_test_seed());
    return dw_ctx_create(&o, &dw_test_ctx) == DW_OK ? 0 : -1;
}

int dw_test_cpu_gpu_setup(dw_ctx **cpu, dw_ctx **gpu) {
    dw_ctx_opts c = {.device = DW_DEVICE_CPU}, g = {.device = DW_DEVICE_CUDA};
    *cpu = *gpu = NULL;
    if (dw_ctx_create(&c, cpu) != DW_OK) return -1;
    if (dw_ctx_create(&g, gpu) != DW_OK) {
        fprintf(stderr, "no CUDA device: %s\n", dw_errmsg(NULL));
        return -1;
    }
    return 0;
}

void dw_test_cpu_gpu_teardown(dw_ctx *cpu, dw_ctx *gpu) {
    dw_ctx_free(gpu);
    dw_ctx_free(cpu);
}

int dw_test_group_teardown(void **state) {
    (void)state;
    dw_ctx_free(dw_test_ctx);
    dw_test_ctx = NULL;
    return 0;
}

int64_t dw_test_rnd(int64_t lo, int64_t hi) {
    return lo + (int64_t)(dw_test_next(&dw_test_group_rng) % (uint64_t)(hi - lo + 1));
}
