// tile_move_bench.cu — the data movement of the transposing quantiser alone, against cudaMemcpy in
// the same run: how fast can a kernel read a BF16 [R, C] tensor in TR x TC tiles and write
//   tile copy     the same tile back (tile shapes 128x128 .. 8x2048: the read geometry);
//   split         one byte per element to each of two [R, C]-sized outputs, the second at the same
//                 place or at the transposed tile's place in a [C, R] array (tile rows kept), i.e.
//                 the quantiser's three streams without the transpose inside the tile;
//   quant move2   one byte per element row-wise [R, C] and truly transposed [C, R] (each thread an
//                 8x8 piece, transposed with byte permutes and through shared memory; checked on
//                 the host), at 1..8 CTAs per SM — what `deepwell quantize` with the column-wise
//                 copy writes, less the scales and the arithmetic per element.
//   ring move     quant move2's stores fed through a producer warp's ring of bulk row copies.
// Tells how much of the quantiser's ~0.82 of copy bandwidth (issue 3) the data movement costs.
// Build: part of every CUDA build (target tile_move_bench), or alone:
//        nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o tile_move_bench bench/tile_move_bench.cu
// Run:   ./tile_move_bench [R C]   (default 8192 8192); prints us, GB/s (bytes read + written), ratio
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "../src/core/async_copy.cuh" /* mbarriers, bulk copies: the quantiser's own */

#define CK(x)                                                                                      \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

constexpr int THREADS = 256;

// Every kernel below: each CTA loops over TR x TC tiles (BF16) by grid stride; thread i of a tile
// holds its uint4 number i + THREADS k (k < V, 8 elements each, element e = 8 (i + THREADS k) at row
// e / TC, column e % TC), all loaded before any store; `body` stores them.
template <int TR, int TC, class Body> __device__ __forceinline__ void for_tiles(const uint16_t *x, int R, int C, Body body) {
    constexpr int V = TR * TC / 8 / THREADS; // uint4 per thread
    const int tiles_c = C / TC, tiles = (R / TR) * tiles_c;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int r0 = t / tiles_c * TR, c0 = t % tiles_c * TC;
        uint4 v[V];
#pragma unroll
        for (int i = 0; i < V; i++) {
            const int e = (i * THREADS + threadIdx.x) * 8, r = e / TC, c = e % TC;
            v[i] = *reinterpret_cast<const uint4 *>(x + (size_t)(r0 + r) * C + c0 + c);
        }
#pragma unroll
        for (int i = 0; i < V; i++) {
            const int e = (i * THREADS + threadIdx.x) * 8;
            body(v[i], r0, c0, e / TC, e % TC);
        }
    }
}

// Tiled copy: 16-byte loads and stores.
template <int TR, int TC> __global__ void __launch_bounds__(THREADS) tile_copy(const uint16_t *x, uint16_t *y, int R, int C) {
    for_tiles<TR, TC>(x, R, C, [&](const uint4 &v, int r0, int c0, int r, int c) {
        *reinterpret_cast<uint4 *>(y + (size_t)(r0 + r) * C + c0 + c) = v;
    });
}

// Three streams without a transpose inside the tile: the high bytes row-wise to q [R, C], the low
// bytes to q2 — at the same place ([R, C], PLACE_T false) or at the transposed tile's place in a
// [C, R] array (tile (r0, c0) -> rows c0.., columns r0.., its rows kept as they are; TR == TC),
// which is where the transposing quantiser's column-wise codes land.
template <int TR, int TC, bool PLACE_T>
__global__ void __launch_bounds__(THREADS) tile_split(const uint16_t *x, uint8_t *q, uint8_t *q2, int R, int C) {
    static_assert(!PLACE_T || TR == TC, "transposed placement of square tiles only");
    for_tiles<TR, TC>(x, R, C, [&](const uint4 &v, int r0, int c0, int r, int c) {
        const uint2 hi = make_uint2(__byte_perm(v.x, v.y, 0x7531), __byte_perm(v.z, v.w, 0x7531));
        const uint2 lo = make_uint2(__byte_perm(v.x, v.y, 0x6420), __byte_perm(v.z, v.w, 0x6420));
        __stcs(reinterpret_cast<uint2 *>(q + (size_t)(r0 + r) * C + c0 + c), hi);
        uint8_t *d = PLACE_T ? q2 + (size_t)(c0 + r) * R + r0 + c : q2 + (size_t)(r0 + r) * C + c0 + c;
        __stcs(reinterpret_cast<uint2 *>(d), lo);
    });
}

// The transposing quantiser's data movement done the register way: 128 x 128 tiles, each thread an
// 8 x 8 piece (16 x 16 pieces; a warp's load instruction reads 2 rows of 256 bytes), row-wise bytes
// stored from registers (8 bytes per row), the piece's bytes transposed in registers (byte
// permutes) and passed through shared memory so that the transposed rows leave as 16-byte stores.
__device__ __forceinline__ void transpose8x8(uint32_t (&lo)[8], uint32_t (&hi)[8]) {
    // rows i: bytes lo[i] (cols 0-3), hi[i] (cols 4-7) -> rows become columns
    uint32_t a[8], b[8];
#pragma unroll
    for (int i = 0; i < 8; i += 2) { // 2x2 blocks of bytes
        a[i] = __byte_perm(lo[i], lo[i + 1], 0x6240), a[i + 1] = __byte_perm(lo[i], lo[i + 1], 0x7351);
        b[i] = __byte_perm(hi[i], hi[i + 1], 0x6240), b[i + 1] = __byte_perm(hi[i], hi[i + 1], 0x7351);
    }
#pragma unroll
    for (int i = 0; i < 8; i += 4)
#pragma unroll
        for (int k = 0; k < 2; k++) { // 4x4 blocks: 16-bit halves
            uint32_t x = a[i + k], y = a[i + k + 2], z = b[i + k], w = b[i + k + 2];
            a[i + k] = __byte_perm(x, y, 0x5410), a[i + k + 2] = __byte_perm(x, y, 0x7632);
            b[i + k] = __byte_perm(z, w, 0x5410), b[i + k + 2] = __byte_perm(z, w, 0x7632);
        }
#pragma unroll
    for (int i = 0; i < 4; i++) { // 8x8: swap the 4x4 off-diagonal blocks
        lo[i] = a[i], hi[i] = a[i + 4], lo[i + 4] = b[i], hi[i + 4] = b[i + 4];
    }
}

// One tile's stores from its pieces v (this thread's 8x8 at rows 8 pr.., columns 8 pc..): the high
// bytes row-wise from registers, transposed through the staging st; SYNC is the CTA's (or the
// consumers') barrier.
template <class Sync>
__device__ __forceinline__ void move_tile(const uint4 (&v)[8], uint8_t *q, uint8_t *qt, uint8_t (*st)[128 + 16], int R, int C,
                                          int r0, int c0, int pr, int pc, int tid, Sync sync) {
    uint32_t lo[8], hi[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        lo[j] = __byte_perm(v[j].x, v[j].y, 0x7531), hi[j] = __byte_perm(v[j].z, v[j].w, 0x7531);
        __stcs(reinterpret_cast<uint2 *>(q + (size_t)(r0 + 8 * pr + j) * C + c0 + 8 * pc), make_uint2(lo[j], hi[j]));
    }
    transpose8x8(lo, hi);
#pragma unroll
    for (int i = 0; i < 8; i++) *reinterpret_cast<uint2 *>(&st[8 * pc + i][8 * pr]) = make_uint2(lo[i], hi[i]);
    sync();
#pragma unroll
    for (int k = 0; k < 4; k++) { // 128 rows x 8 chunks of 16 bytes
        const int p = k * THREADS + tid, row = p / 8, ch = p % 8;
        __stcs(reinterpret_cast<uint4 *>(qt + (size_t)(c0 + row) * R + r0 + 16 * ch),
               *reinterpret_cast<const uint4 *>(&st[row][16 * ch]));
    }
    sync();
}

template <int MINB>
__global__ void __launch_bounds__(THREADS, MINB) tile_quant_move2(const uint16_t *x, uint8_t *q, uint8_t *qt, int R, int C) {
    __shared__ __align__(16) uint8_t st[128][128 + 16];
    const int tiles_c = C / 128, tiles = (R / 128) * tiles_c;
    const int pr = threadIdx.x / 16, pc = threadIdx.x % 16;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int r0 = t / tiles_c * 128, c0 = t % tiles_c * 128;
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = *reinterpret_cast<const uint4 *>(x + (size_t)(r0 + 8 * pr + j) * C + c0 + 8 * pc);
        move_tile(v, q, qt, st, R, C, r0, c0, pr, pc, threadIdx.x, [] { __syncthreads(); });
    }
}

// quant move2's consumers fed by a producer warp through a ring of S shared-memory tiles (each
// tile as 128 bulk row copies completing on an mbarrier; a buffer goes back to the producer as soon
// as every consumer warp has its piece in registers), the transposed bytes staged in shared memory
// of their own: the transposing quantiser's ring, with quant move2's stores.
constexpr int RING_TILE = 128 * 256, RING_STAGE_T = 128 * (128 + 16);
template <int MINB>
__global__ void __launch_bounds__(THREADS + 32, MINB) ring_quant_move(const uint16_t *x, uint8_t *q, uint8_t *qt, int R, int C,
                                                                      int S) {
    extern __shared__ __align__(128) unsigned char sm[];
    uint8_t(*st)[128 + 16] = reinterpret_cast<uint8_t(*)[128 + 16]>(sm + (size_t)S * RING_TILE);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + (size_t)S * RING_TILE + RING_STAGE_T), *empty = full + S;
    if (threadIdx.x == 0) {
        for (int i = 0; i < S; i++) mbar_init(&full[i], 1), mbar_init(&empty[i], THREADS / 32);
        mbar_init_fence();
    }
    __syncthreads();
    const int tiles_c = C / 128, tiles = (R / 128) * tiles_c, lane = threadIdx.x & 31;
    if (threadIdx.x >= THREADS) { // producer warp: lane j copies rows j, j + 32, ...
        int s = 0, n = 0;
        uint32_t ph = 0;
        for (int t = blockIdx.x; t < tiles; t += gridDim.x, n++) {
            if (n >= S) mbar_wait(&empty[s], ph ^ 1u);
            if (lane == 0) mbar_expect_tx(&full[s], RING_TILE);
            __syncwarp();
            const int r0 = t / tiles_c * 128, c0 = t % tiles_c * 128;
            for (int rr = lane; rr < 128; rr += 32)
                bulk_g2s(sm + (size_t)s * RING_TILE + rr * 256, x + (size_t)(r0 + rr) * C + c0, 256, &full[s]);
            if (++s == S) s = 0, ph ^= 1u;
        }
        return;
    }
    const int pr = threadIdx.x / 16, pc = threadIdx.x % 16;
    int s = 0;
    uint32_t ph = 0;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        const int r0 = t / tiles_c * 128, c0 = t % tiles_c * 128;
        mbar_wait(&full[s], ph);
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; j++) v[j] = *reinterpret_cast<const uint4 *>(sm + (size_t)s * RING_TILE + (8 * pr + j) * 256 + 16 * pc);
        __syncwarp();
        if (lane == 0) mbar_arrive(&empty[s]);
        if (++s == S) s = 0, ph ^= 1u;
        move_tile(v, q, qt, st, R, C, r0, c0, pr, pc, threadIdx.x, [] { asm volatile("bar.sync 1, %0;" ::"n"(THREADS) : "memory"); });
    }
}

__global__ void fill(uint16_t *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = (uint16_t)((i * 2654435761u) >> 7);
}

template <class F> static float time_us(F f, int iters = 50, int batch = 10) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 5 * batch; i++) f();
    CK(cudaDeviceSynchronize());
    float best[64];
    int n = iters < 64 ? iters : 64;
    for (int it = 0; it < n; it++) {
        CK(cudaEventRecord(a));
        for (int i = 0; i < batch; i++) f();
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, b));
        best[it] = ms * 1000.0f / batch;
    }
    for (int i = 1; i < n; i++) // insertion sort, median
        for (int j = i; j > 0 && best[j] < best[j - 1]; j--) {
            float t = best[j];
            best[j] = best[j - 1], best[j - 1] = t;
        }
    return best[n / 2];
}

int main(int argc, char **argv) {
    const int R = argc > 2 ? atoi(argv[1]) : 8192, C = argc > 2 ? atoi(argv[2]) : 8192;
    if (R % 512 || C % 512) {
        fprintf(stderr, "R and C must be multiples of 512\n");
        return 1;
    }
    const size_t n = (size_t)R * C;
    uint16_t *x, *y;
    uint8_t *q, *qt;
    CK(cudaMalloc(&x, n * 2));
    CK(cudaMalloc(&y, n * 2));
    CK(cudaMalloc(&q, n));
    CK(cudaMalloc(&qt, n));
    CK(cudaMemset(x, 0x3c, n * 2));
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int grid = sms * 8;
    const double copy_bytes = 4.0 * n, qbytes = 2.0 * n + 2.0 * n;
    const float tc = time_us([&] { CK(cudaMemcpyAsync(y, x, n * 2, cudaMemcpyDeviceToDevice)); });
    const double copy_gbs = copy_bytes / tc / 1e3;
    printf("%-28s %8s %8s %6s\n", "case", "us", "GB/s", "ratio");
    printf("%-28s %8.1f %8.1f %6.3f\n", "cudaMemcpy D2D", tc, copy_gbs, 1.0);
    auto row = [&](const char *name, float us, double bytes) {
        printf("%-28s %8.1f %8.1f %6.3f\n", name, us, bytes / us / 1e3, bytes / us / 1e3 / copy_gbs);
    };
    row("tile copy 128x128", time_us([&] { tile_copy<128, 128><<<grid, THREADS>>>(x, y, R, C); }), copy_bytes);
    row("tile copy 64x256", time_us([&] { tile_copy<64, 256><<<grid, THREADS>>>(x, y, R, C); }), copy_bytes);
    row("tile copy 32x512", time_us([&] { tile_copy<32, 512><<<grid, THREADS>>>(x, y, R, C); }), copy_bytes);
    row("tile copy 8x2048", time_us([&] { tile_copy<8, 2048><<<grid, THREADS>>>(x, y, R, C); }), copy_bytes);
    row("split, same place 128x128", time_us([&] { tile_split<128, 128, false><<<grid, THREADS>>>(x, q, qt, R, C); }), qbytes);
    row("split, T place 128x128", time_us([&] { tile_split<128, 128, true><<<grid, THREADS>>>(x, q, qt, R, C); }), qbytes);
    row("split, T place 64x64", time_us([&] { tile_split<64, 64, true><<<grid, THREADS>>>(x, q, qt, R, C); }), qbytes);
    for (int g : {1, 2, 4, 8}) {
        char name[64];
        snprintf(name, sizeof name, "split, T place, %d CTA/SM", g);
        row(name, time_us([&] { tile_split<128, 128, true><<<sms * g, THREADS>>>(x, q, qt, R, C); }), qbytes);
        snprintf(name, sizeof name, "quant move2, %d CTA/SM", g);
        if (g <= 2) row(name, time_us([&] { tile_quant_move2<2><<<sms * g, THREADS>>>(x, q, qt, R, C); }), qbytes);
        else row(name, time_us([&] { tile_quant_move2<4><<<sms * g, THREADS>>>(x, q, qt, R, C); }), qbytes);
    }
    for (int S = 2; S <= 5; S++) {
        const size_t smem = (size_t)S * RING_TILE + RING_STAGE_T + 16 * S;
        CK(cudaFuncSetAttribute(ring_quant_move<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CK(cudaFuncSetAttribute(ring_quant_move<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        for (int g = 1; g <= 2; g++) {
            int fit = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, ring_quant_move<2>, THREADS + 32, smem));
            if (fit < g) continue;
            char name[64];
            snprintf(name, sizeof name, "ring move, %d stages, %d CTA/SM", S, g);
            if (g == 1) row(name, time_us([&] { ring_quant_move<1><<<sms, THREADS + 32, smem>>>(x, q, qt, R, C, S); }), qbytes);
            else row(name, time_us([&] { ring_quant_move<2><<<sms * 2, THREADS + 32, smem>>>(x, q, qt, R, C, S); }), qbytes);
        }
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    // check quant move2 on a pattern: q = high bytes of x, qt = their transpose
    fill<<<1024, 256>>>(x, n);
    const bool ring = argc > 3 && argv[3][0] == 'r'; // check the ring kernel instead
    CK(cudaMemset(q, 0, n));
    CK(cudaMemset(qt, 0, n));
    if (ring) ring_quant_move<2><<<sms * 2, THREADS + 32, 3 * RING_TILE + RING_STAGE_T + 48>>>(x, q, qt, R, C, 3);
    else tile_quant_move2<2><<<sms * 2, THREADS>>>(x, q, qt, R, C);
    CK(cudaDeviceSynchronize());
    uint16_t *hx = (uint16_t *)malloc(n * 2);
    uint8_t *hq = (uint8_t *)malloc(n), *hqt = (uint8_t *)malloc(n);
    CK(cudaMemcpy(hx, x, n * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hq, q, n, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hqt, qt, n, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t r = 0; r < (size_t)R; r++)
        for (size_t c = 0; c < (size_t)C; c++) {
            const uint8_t h = (uint8_t)(hx[r * C + c] >> 8);
            bad += hq[r * C + c] != h || hqt[c * R + r] != h;
        }
    printf("%s check: %zu mismatching elements\n", ring ? "ring move" : "quant move2", bad);
    return bad ? 1 : 0;
}
