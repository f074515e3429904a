/* rng.h — private: the trainer's deterministic random numbers (splitmix64). The whole state is
 * one uint64, so checkpoints save and restore it exactly. Not for cryptography. */
#ifndef DW_TRAIN_RNG_H
#define DW_TRAIN_RNG_H

#include <stdint.h>

typedef struct {
    uint64_t s;
} dw_rng;

static inline uint64_t dw_rng_next(dw_rng *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double dw_rng_uniform(dw_rng *r) {
    return (double)(dw_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Uniform integer in [0, n), n > 0 (rejection sampling: no modulo bias). */
static inline uint64_t dw_rng_below(dw_rng *r, uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = dw_rng_next(r);
    while (x >= limit);
    return x % n;
}

/* A seed derived from a base seed and two indices (epoch, shard ...): independent streams. */
static inline uint64_t dw_rng_derive(uint64_t seed, uint64_t a, uint64_t b) {
    dw_rng r = {seed ^ 0x6a09e667f3bcc909ull};
    r.s ^= dw_rng_next(&r) + a * 0x9E3779B97F4A7C15ull;
    r.s ^= dw_rng_next(&r) + b * 0xD1B54A32D192ED03ull;
    return dw_rng_next(&r);
}

#endif /* DW_TRAIN_RNG_H */
