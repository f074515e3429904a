/* shard.c — ZeRO's cut of the flat parameter pools over the ranks and the bytes per rank it
 * leaves (shard.h). Pure arithmetic: no program pass, no device. */
#include "compile/shard.h"

void dw_shard_range(int64_t floats, int world, int rank, int64_t *lo, int64_t *hi) {
    const int64_t block = floats / ((int64_t)world * DW_SHARD_ALIGN) * DW_SHARD_ALIGN;
    *lo = (int64_t)rank * block;
    *hi = rank == world - 1 ? floats : *lo + block;
}

int64_t dw_shard_max_floats(int64_t floats, int world) {
    int64_t lo, hi;
    dw_shard_range(floats, world, world - 1, &lo, &hi);
    return hi - lo;
}

void dw_shard_pool_bytes(const int64_t whole[DW_POOL_COUNT], int64_t param_floats, int world, int zero,
                         int64_t out[DW_POOL_COUNT]) {
    for (int k = 0; k < DW_POOL_COUNT; k++) out[k] = whole[k];
    if (world <= 1 || zero < 1) return;
    out[DW_POOL_OPTIM] = dw_shard_max_floats(param_floats, world) * 2 * (int64_t)sizeof(float);
    if (zero >= 2) out[DW_POOL_GRADS] = dw_shard_max_floats(param_floats, world) * (int64_t)sizeof(float);
}
