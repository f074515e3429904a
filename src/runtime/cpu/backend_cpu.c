/* backend_cpu.c — the CPU backend's table (backend.h): host memory for the pools, plain copies,
 * the op entries of ops.def's cpu column, the optimizer steps, host-clock timers; it issues
 * synchronously, so nothing is recorded and sync has nothing to wait for. Also the BF16 views the
 * op entries share (cpu.h). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "formats/formats.h"
#include "runtime/cpu/cpu.h"

#define ST(be) ((dw_cpu_state *)(be)->impl)

float *dw_cpu_scratch(dw_backend *be, int slot, int64_t n) {
    dw_cpu_state *s = ST(be);
    if (n < 1) n = 1;
    if (s->cap[slot] < n) {
        float *p = realloc(s->buf[slot], (size_t)n * sizeof(float));
        if (!p) {
            dw_set_error(be->ctx, DW_ERR_NOMEM, "cpu backend: out of memory for %lld floats of scratch", (long long)n);
            return NULL;
        }
        s->buf[slot] = p, s->cap[slot] = n;
    }
    return s->buf[slot];
}

const float *dw_cpu_in(dw_backend *be, const dw_op_call *c, const void *v, int64_t n, int slot) {
    if (!dw_cpu_bf16(c)) return v;
    float *f = dw_cpu_scratch(be, slot, n);
    if (!f) return NULL;
    const uint16_t *h = v;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) f[i] = dw_decode_bf16(h[i]);
    return f;
}

float *dw_cpu_out(dw_backend *be, const dw_op_call *c, void *v, int64_t n, int slot) {
    return dw_cpu_bf16(c) ? dw_cpu_scratch(be, slot, n) : v;
}

void dw_cpu_put(const dw_op_call *c, void *v, const float *r, int64_t n, bool acc) {
    if (!dw_cpu_bf16(c)) {
        float *f = v;
        if (acc) {
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < n; i++) f[i] += r[i];
        } else if (f != r) {
            memcpy(f, r, (size_t)n * sizeof(float));
        }
        return;
    }
    uint16_t *h = v;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) h[i] = dw_encode_bf16(acc ? dw_decode_bf16(h[i]) + r[i] : r[i]);
}

void dw_cpu_deliver(const dw_op_call *c, int s, const float *g, int64_t n) {
    if (c->dx[s]) dw_cpu_put(c, c->dx[s], g, n, c->dx_acc[s]);
}

/* ---- memory ---------------------------------------------------------------------------------- */
static dw_status cpu_alloc(dw_backend *be, int64_t bytes, void **out) {
    size_t n = (size_t)((bytes + 255) / 256 * 256);
    *out = aligned_alloc(256, n ? n : 256);
    if (!*out) return dw_set_error(be->ctx, DW_ERR_NOMEM, "cpu backend: out of memory (%lld bytes)", (long long)bytes);
    return DW_OK;
}
static void cpu_release(dw_backend *be, void *p) { (void)be, free(p); }
static dw_status cpu_copy(dw_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memmove(dst, src, bytes);
    return DW_OK;
}
static dw_status cpu_zero(dw_backend *be, void *dst, size_t bytes) {
    (void)be;
    memset(dst, 0, bytes);
    return DW_OK;
}
static dw_status cpu_add(dw_backend *be, dw_act_type dt, void *dst, const void *src, int64_t n) {
    (void)be;
    if (dt == DW_DT_ACT_F32) {
        float *d = dst;
        const float *s = src;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] += s[i];
    } else {
        uint16_t *d = dst;
        const uint16_t *s = src;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) d[i] = dw_encode_bf16(dw_decode_bf16(d[i]) + dw_decode_bf16(s[i]));
    }
    return DW_OK;
}
static dw_status cpu_sync(dw_backend *be) { return (void)be, DW_OK; }

/* ---- timers: the host clock (the CPU issues synchronously) --------------------------------------- */
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}
static dw_status cpu_timers(dw_backend *be, int count) {
    dw_cpu_state *s = ST(be);
    double *m = realloc(s->marks, (size_t)(count > 0 ? count : 1) * sizeof *m);
    if (!m) return dw_set_error(be->ctx, DW_ERR_NOMEM, "cpu backend: out of memory");
    s->marks = m, s->n_marks = count;
    return DW_OK;
}
static void cpu_mark(dw_backend *be, int k) {
    if (k >= 0 && k < ST(be)->n_marks) ST(be)->marks[k] = now_ms();
}
static double cpu_elapsed(dw_backend *be, int a, int b) { return ST(be)->marks[b] - ST(be)->marks[a]; }

static void cpu_destroy(dw_backend *be) {
    dw_cpu_state *s = ST(be);
    for (int k = 0; s && k < CPU_S_COUNT; k++) free(s->buf[k]);
    if (s) free(s->marks);
    free(s);
}

/* The op table: an entry where ops.def's cpu column is 1, NULL where it is 0. */
#define CPU_ENTRY_2(name) {dw_cpu_op_##name##_fwd, dw_cpu_op_##name##_bwd, dw_cpu_op_##name##_prepare}
#define CPU_ENTRY_1(name) {dw_cpu_op_##name##_fwd, dw_cpu_op_##name##_bwd, NULL}
#define CPU_ENTRY_0(name) {NULL, NULL, NULL}
#define CPU_ENTRY(flag, name) CPU_ENTRY_##flag(name)
static const dw_op_entry cpu_ops[DW_OP_COUNT] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) CPU_ENTRY(cpu, name),
#include "ir/ops.def"
#undef DW_OP
};

static const dw_backend_i cpu_iface = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .zero = cpu_zero,
    .add = cpu_add,
    .sync = cpu_sync,
    .grad_norm = dw_cpu_step_grad_norm,
    .adamw = dw_cpu_step_adamw,
    .cast_bf16 = dw_cpu_step_cast_bf16,
    .quant_weight = dw_cpu_step_quant_weight,
    .timers = cpu_timers,
    .mark = cpu_mark,
    .elapsed_ms = cpu_elapsed,
    .ops = cpu_ops,
};

dw_status dw_backend_cpu_create(dw_ctx *ctx, dw_backend **out) {
    *out = NULL;
    if (dw_ctx_device(ctx) != DW_DEVICE_CPU)
        return dw_set_error(ctx, DW_ERR_INVALID, "cpu backend: the context's device is not the CPU");
    dw_backend *be = calloc(1, sizeof *be);
    dw_cpu_state *s = calloc(1, sizeof *s);
    if (!be || !s) {
        free(be), free(s);
        return dw_set_error(ctx, DW_ERR_NOMEM, "cpu backend: out of memory");
    }
    *be = (dw_backend){.i = &cpu_iface, .ctx = ctx, .device = DW_DEVICE_CPU, .sm = 0, .impl = s};
    *out = be;
    return DW_OK;
}

void dw_backend_free(dw_backend *be) {
    if (!be) return;
    be->i->destroy(be);
    free(be);
}
