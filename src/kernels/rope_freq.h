/* rope_freq.h — private: RoPE's per-dimension inverse frequencies and its attention factor for the
 * rope types of Hugging Face configs (default, linear, llama3, yarn), as inline functions shared
 * by the CPU reference (kernels/cpu/rope_cpu.c) and the CUDA kernels (kernels/cuda/ops_rope.cu),
 * so both compute the same table in double. The rope op carries a dw_rope_scaling in its
 * attributes (ir/ir.h); configs are parsed into it by capture/model_config.c.
 * Definitions (transformers' modeling_rope_utils, head dimension D, i in [0, D/2)):
 *   default  inv_i = theta^(-2i/D)
 *   linear   inv_i / factor
 *   llama3   wavelength w = 2 pi / inv_i against orig/high_freq_factor and orig/low_freq_factor:
 *            below the first inv_i, above the second inv_i / factor, between them the blend
 *            (1 - s) inv_i / factor + s inv_i with s = (orig / w - low) / (high - low)
 *   yarn     ramp r_i = clamp((i - lo) / (hi - lo), 0, 1) over the correction range
 *            lo, hi = D log(orig / (beta 2 pi)) / (2 log theta) for beta_fast, beta_slow (floored
 *            and ceiled unless truncate is false; lo >= 0, hi <= D - 1; hi += 0.001 when equal):
 *            inv_i (1 - r_i) + (inv_i / factor) r_i; cos and sin multiplied by attention_factor.
 * Not here: parsing (model_config.c) and the rotation itself (the kernels). */
#ifndef DW_KERNELS_ROPE_FREQ_H
#define DW_KERNELS_ROPE_FREQ_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DW_ROPE_FN static inline __host__ __device__
#else
#define DW_ROPE_FN static inline
#endif

typedef enum { DW_ROPE_DEFAULT = 0, DW_ROPE_LINEAR, DW_ROPE_LLAMA3, DW_ROPE_YARN, DW_ROPE_TYPE_COUNT } dw_rope_type;

/* A rope type's parameters (all zero: the default type). Fields a type does not use stay zero. */
typedef struct {
    int32_t type;                             /* dw_rope_type */
    double factor;                            /* linear, llama3, yarn: the context extension */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double original_max;                      /* llama3, yarn: original_max_position_embeddings */
    double beta_fast, beta_slow;              /* yarn (32, 1 when the config omits them) */
    double attention_factor;                  /* yarn: resolved from the config (mscale...); else 0 */
    bool truncate;                            /* yarn: the correction range rounded to whole dims */
} dw_rope_scaling;

#define DW_ROPE_TWO_PI 6.283185307179586476925286766559

/* Yarn's correction dimension for `rotations` full turns within the original positions. */
DW_ROPE_FN double dw_rope_yarn_dim(double rotations, double theta, int64_t D, double orig) {
    return (double)D * log(orig / (rotations * DW_ROPE_TWO_PI)) / (2.0 * log(theta));
}

/* inv_freq[i] of dimension pair i (0 <= i < D/2); s NULL: the default type. */
DW_ROPE_FN double dw_rope_inv_freq(const dw_rope_scaling *s, double theta, int64_t D, int64_t i) {
    const double inv = pow(theta, -2.0 * (double)i / (double)D);
    if (!s || s->type == DW_ROPE_DEFAULT) return inv;
    if (s->type == DW_ROPE_LINEAR) return inv / s->factor;
    if (s->type == DW_ROPE_LLAMA3) {
        const double w = DW_ROPE_TWO_PI / inv;
        if (w < s->original_max / s->high_freq_factor) return inv;
        if (w > s->original_max / s->low_freq_factor) return inv / s->factor;
        const double sm = (s->original_max / w - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
        return (1.0 - sm) * inv / s->factor + sm * inv;
    }
    /* yarn */
    double lo = dw_rope_yarn_dim(s->beta_fast, theta, D, s->original_max);
    double hi = dw_rope_yarn_dim(s->beta_slow, theta, D, s->original_max);
    if (s->truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > (double)(D - 1)) hi = (double)(D - 1);
    if (lo == hi) hi += 0.001;
    double r = ((double)i - lo) / (hi - lo);
    r = r < 0 ? 0 : r > 1 ? 1 : r;
    return inv * (1.0 - r) + inv / s->factor * r;
}

/* What cos and sin are multiplied by: yarn's attention factor, else 1. */
DW_ROPE_FN double dw_rope_attention(const dw_rope_scaling *s) {
    return s && s->type == DW_ROPE_YARN ? s->attention_factor : 1.0;
}

/* "default", "linear", "llama3", "yarn"; NULL for another value. */
static inline const char *dw_rope_type_name(int32_t type) {
    static const char *const names[DW_ROPE_TYPE_COUNT] = {"default", "linear", "llama3", "yarn"};
    return type >= 0 && type < DW_ROPE_TYPE_COUNT ? names[type] : 0;
}

/* NULL when s (NULL: default) can be used with theta, else what is wrong (static text naming the
 * config key), so that the frequencies above are finite and positive. */
static inline const char *dw_rope_scaling_problem(const dw_rope_scaling *s, double theta) {
    if (!s || s->type == DW_ROPE_DEFAULT) return 0;
    if (!dw_rope_type_name(s->type)) return "unknown rope type";
    if (!(s->factor > 0 && isfinite(s->factor))) return "'factor' must be a positive number";
    if (s->type == DW_ROPE_LINEAR) return 0;
    if (!(s->original_max >= 1 && isfinite(s->original_max)))
        return "'original_max_position_embeddings' must be a positive number";
    if (s->type == DW_ROPE_LLAMA3)
        return s->low_freq_factor > 0 && s->high_freq_factor > s->low_freq_factor && isfinite(s->high_freq_factor)
                   ? 0
                   : "need 0 < 'low_freq_factor' < 'high_freq_factor'";
    if (!(s->beta_fast > 0 && s->beta_slow > 0 && isfinite(s->beta_fast) && isfinite(s->beta_slow)))
        return "'beta_fast' and 'beta_slow' must be positive numbers";
    if (!(s->attention_factor > 0 && isfinite(s->attention_factor)))
        return "'attention_factor' must be a positive number";
    if (!(theta > 1)) return "yarn needs 'rope_theta' > 1";
    return 0;
}

#endif /* DW_KERNELS_ROPE_FREQ_H */
