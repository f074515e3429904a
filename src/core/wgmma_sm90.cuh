// wgmma_sm90.cuh — the sm_90a warpgroup building blocks every Deepwell wgmma kernel uses (the own
// GEMMs of gemm/, the grouped expert GEMM of kernels/cuda/moe_gemm_sm90.cu): the shared-memory
// descriptors of K-major and MN-major 128-byte-swizzled tiles, wgmma fences, commit and wait, register
// reallocation between warpgroups, the ring of pipeline slots and the tile raster. Device code is
// compiled for sm_90a only (DW_SM90_BODY); the sm_100a pass sees none of it. CUDA C++, private.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "core/async_copy.cuh"

namespace {

// Device code exists for sm_90a only; the sm_100a pass sees empty kernels (never selected there).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ == 900
#define DW_SM90_BODY 1

// 1024-byte aligned (128B swizzle) by an offset into the shared array, so that the compiler keeps
// knowing these are shared-memory addresses (LDS; a round trip through uintptr_t makes generic loads)
__device__ __forceinline__ uint8_t *smem_align_1024(uint8_t *raw) {
    return raw + ((1024u - (smem_u32(raw) & 1023u)) & 1023u);
}

// threadIdx.x / 128, broadcast from lane 0 so that the compiler knows it is warp-uniform: values
// derived from it (a warpgroup's wgmma descriptors, its rows' addresses) then live in uniform
// registers instead of being computed per thread and moved over with R2UR before every wgmma.
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, (int)(threadIdx.x / 128), 0); }

// A position in a ring of shared-memory slots: slot and the parity of its current round (the
// mbarrier phase to wait for), advanced by counting, without a division per K tile.
struct Ring {
    int slot = 0;
    uint32_t phase = 0;
    template <int ST> __device__ __forceinline__ void next() {
        if (++slot == ST) slot = 0, phase ^= 1;
    }
};

// wgmma shared-memory descriptor: K-major tile, rows of 128 bytes, 128-byte swizzle, 8-row atoms
// 1024 bytes apart.
__device__ __forceinline__ uint64_t make_desc(const void *p) {
    uint64_t a = smem_u32(p);
    return ((a & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
// The same for an MN-major (transposed) 16-bit operand: panels of 64 M (or N) values by the tile's
// K lines, each line 128 bytes, 8-line atoms 1024 bytes apart (SBO), panels `panel_bytes` apart
// (LBO); wgmma reads it with its transpose bit set.
__device__ __forceinline__ uint64_t make_desc_mn(const void *p, uint32_t panel_bytes) {
    uint64_t a = smem_u32(p);
    return ((a & 0x3FFFF) >> 4) | ((uint64_t)(panel_bytes >> 4) << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Ties the accumulator registers to this point of the program (no reads move above a wait).
__device__ __forceinline__ void reg_fence(float *d) {
    asm volatile("" : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) :: "memory");
}

// Register reallocation between warpgroups (needs a register cap at entry: __launch_bounds__(n, 1)).
template <int N> __device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

// Tile t of a tiles_m x tiles_n grid in GROUP_M-tall column bands, so that the CTAs running at
// once share their B tiles (and A tiles) in L2.
__device__ __forceinline__ void tile_coords(int64_t t, int64_t tiles_m, int64_t tiles_n, int group_m, int64_t *tm,
                                            int64_t *tn) {
    const int64_t per_group = (int64_t)group_m * tiles_n, first_m = (t / per_group) * group_m;
    const int64_t gm = min((int64_t)group_m, tiles_m - first_m);
    *tm = first_m + (t % per_group) % gm;
    *tn = (t % per_group) / gm;
}


#endif // DW_SM90_BODY

} // namespace
