/* rope_freq.h — private: RoPE's per-dimension inverse frequencies, its attention factor and its
 * rotary width for the rope types of Hugging Face configs (default, linear, llama3, yarn,
 * longrope), as inline functions shared by the CPU reference (kernels/cpu/rope_cpu.c) and the CUDA
 * kernels (kernels/cuda/ops_rope.cu), so both compute the same table in double. The rope op carries
 * a dw_rope_scaling in its attributes (ir/ir.h); configs are parsed into it by
 * capture/model_config_rope.c.
 * Rotary width R (partial_rotary_factor): only the first R dimensions of each head of D rotate
 * (rotate-half over those R), the other D - R pass through unchanged; R = D unless set.
 * Definitions (transformers' modeling_rope_utils, over R, i in [0, R/2)):
 *   default  inv_i = theta^(-2i/R)
 *   linear   inv_i / factor
 *   llama3   wavelength w = 2 pi / inv_i against orig/high_freq_factor and orig/low_freq_factor:
 *            below the first inv_i, above the second inv_i / factor, between them the blend
 *            (1 - s) inv_i / factor + s inv_i with s = (orig / w - low) / (high - low)
 *   yarn     ramp r_i = clamp((i - lo) / (hi - lo), 0, 1) over the correction range
 *            lo, hi = R log(orig / (beta 2 pi)) / (2 log theta) for beta_fast, beta_slow (floored
 *            and ceiled unless truncate is false; lo >= 0, hi <= R - 1; hi += 0.001 when equal):
 *            inv_i (1 - r_i) + (inv_i / factor) r_i; cos and sin multiplied by attention_factor.
 *   longrope inv_i / long_factor[i] when the run's sequence (its positions 0..seq-1: transformers'
 *            max(position_ids) + 1) is longer than orig, else inv_i / short_factor[i]: one table
 *            for every position of the run; cos and sin multiplied by attention_factor.
 * Not here: parsing (model_config_rope.c) and the rotation itself (the kernels). */
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

typedef enum {
    DW_ROPE_DEFAULT = 0, DW_ROPE_LINEAR, DW_ROPE_LLAMA3, DW_ROPE_YARN, DW_ROPE_LONGROPE, DW_ROPE_TYPE_COUNT
} dw_rope_type;

/* longrope's factor lists: R/2 entries each, R up to 256 (Phi-3: 48, Phi-3.5-MoE: 64). The struct
 * travels by value into the CUDA kernels: 2 x 128 doubles keep it near 2 KB, under the 4 KB of
 * kernel parameters. */
#define DW_ROPE_MAX_FACTORS 128

/* A rope's parameters (all zero: the default type over the whole head). Fields a type does not use
 * stay zero. */
typedef struct {
    int32_t type;                             /* dw_rope_type */
    int32_t rotary_dim;                       /* R: the leading dims of each head that rotate (even);
                                                 0: the whole head */
    double factor;                            /* linear, llama3, yarn: the context extension */
    double low_freq_factor, high_freq_factor; /* llama3 */
    double original_max;                      /* llama3, yarn, longrope: original_max_position_embeddings */
    double beta_fast, beta_slow;              /* yarn (32, 1 when the config omits them) */
    double attention_factor;                  /* yarn, longrope: resolved from the config; else 0 */
    bool truncate;                            /* yarn: the correction range rounded to whole dims */
    int32_t n_factors;                        /* longrope: entries of each list below (R/2) */
    double short_factor[DW_ROPE_MAX_FACTORS]; /* longrope: runs of at most original_max positions */
    double long_factor[DW_ROPE_MAX_FACTORS];  /* longrope: longer runs */
} dw_rope_scaling;

#define DW_ROPE_TWO_PI 6.283185307179586476925286766559

/* R, the rotating dims of a head of D (s NULL: the whole head). */
DW_ROPE_FN int64_t dw_rope_dim(const dw_rope_scaling *s, int64_t D) { return s && s->rotary_dim ? s->rotary_dim : D; }

/* Whether a run of seq positions takes longrope's long factors. */
DW_ROPE_FN bool dw_rope_long(const dw_rope_scaling *s, int64_t seq) {
    return s && s->type == DW_ROPE_LONGROPE && (double)seq > s->original_max;
}

/* Yarn's correction dimension for `rotations` full turns within the original positions. */
DW_ROPE_FN double dw_rope_yarn_dim(double rotations, double theta, int64_t R, double orig) {
    return (double)R * log(orig / (rotations * DW_ROPE_TWO_PI)) / (2.0 * log(theta));
}

/* inv_freq[i] of dimension pair i (0 <= i < R/2, R = dw_rope_dim) in a run of seq positions (longrope
 * only reads it); s NULL: the default type. */
DW_ROPE_FN double dw_rope_inv_freq(const dw_rope_scaling *s, double theta, int64_t R, int64_t i, int64_t seq) {
    const double inv = pow(theta, -2.0 * (double)i / (double)R);
    if (!s || s->type == DW_ROPE_DEFAULT) return inv;
    if (s->type == DW_ROPE_LINEAR) return inv / s->factor;
    if (s->type == DW_ROPE_LONGROPE) return inv / (dw_rope_long(s, seq) ? s->long_factor[i] : s->short_factor[i]);
    if (s->type == DW_ROPE_LLAMA3) {
        const double w = DW_ROPE_TWO_PI / inv;
        if (w < s->original_max / s->high_freq_factor) return inv;
        if (w > s->original_max / s->low_freq_factor) return inv / s->factor;
        const double sm = (s->original_max / w - s->low_freq_factor) / (s->high_freq_factor - s->low_freq_factor);
        return (1.0 - sm) * inv / s->factor + sm * inv;
    }
    /* yarn */
    double lo = dw_rope_yarn_dim(s->beta_fast, theta, R, s->original_max);
    double hi = dw_rope_yarn_dim(s->beta_slow, theta, R, s->original_max);
    if (s->truncate) lo = floor(lo), hi = ceil(hi);
    if (lo < 0) lo = 0;
    if (hi > (double)(R - 1)) hi = (double)(R - 1);
    if (lo == hi) hi += 0.001;
    double r = ((double)i - lo) / (hi - lo);
    r = r < 0 ? 0 : r > 1 ? 1 : r;
    return inv * (1.0 - r) + inv / s->factor * r;
}

/* What cos and sin are multiplied by: yarn's and longrope's attention factor, else 1. */
DW_ROPE_FN double dw_rope_attention(const dw_rope_scaling *s) {
    return s && (s->type == DW_ROPE_YARN || s->type == DW_ROPE_LONGROPE) ? s->attention_factor : 1.0;
}

/* "default", "linear", "llama3", "yarn", "longrope"; NULL for another value. */
static inline const char *dw_rope_type_name(int32_t type) {
    static const char *const names[DW_ROPE_TYPE_COUNT] = {"default", "linear", "llama3", "yarn", "longrope"};
    return type >= 0 && type < DW_ROPE_TYPE_COUNT ? names[type] : 0;
}

/* longrope's list entries: positive and finite. */
static inline bool dw_rope_factors_ok(const double *f, int32_t n) {
    for (int32_t i = 0; i < n; i++)
        if (!(f[i] > 0 && isfinite(f[i]))) return false;
    return true;
}

/* NULL when s (NULL: default) can be used with theta on heads of D dims, else what is wrong (static
 * text naming the config key), so that the frequencies above are finite and positive. */
static inline const char *dw_rope_scaling_problem(const dw_rope_scaling *s, double theta, int64_t D) {
    if (!s) return 0;
    if (s->rotary_dim && !(s->rotary_dim >= 2 && s->rotary_dim % 2 == 0 && s->rotary_dim <= D))
        return "'partial_rotary_factor' must leave an even rotary dimension of 2 to head_dim";
    if (s->type == DW_ROPE_DEFAULT) return 0;
    if (!dw_rope_type_name(s->type)) return "unknown rope type";
    if (s->type == DW_ROPE_LONGROPE) {
        if (!(s->original_max >= 1 && isfinite(s->original_max)))
            return "'original_max_position_embeddings' must be a positive number";
        if (!(s->attention_factor > 0 && isfinite(s->attention_factor)))
            return "'attention_factor' must be a positive number";
        if (s->n_factors != dw_rope_dim(s, D) / 2 || s->n_factors > DW_ROPE_MAX_FACTORS)
            return "'short_factor' and 'long_factor' need one entry per rotary dimension pair (rotary dim / 2, "
                   "at most 128)";
        if (!dw_rope_factors_ok(s->short_factor, s->n_factors) || !dw_rope_factors_ok(s->long_factor, s->n_factors))
            return "'short_factor' and 'long_factor' entries must be positive numbers";
        return 0;
    }
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
