// harness.cpp — runs quant_bulk.cu's two ring kernels under the host CUDA emulator
// (tests/common/cuda_emu, extended by run.sh) and compares every byte of codes, scales and swizzled
// scales with the CPU reference: transposed tiles and row-wise runs, mxfp8 / mxfp8_e5m2 /
// fp8_block, rceil and floor+pow2, specials, ragged last stages, ring depths 2..6, capped grids,
// the transposed kernel's five ways out for the codes (registers, staged + bulk copies, staged +
// 16-byte stores, staged + tensor stores over the ring buffer or from a staging buffer of its own;
// bulk and tensor stores left unwaited at the end of a launch fail the case), tiles loaded by
// row copies or by one tensor-map copy, tile orders in bands of 1..3 tile rows, units of 1, 2 or 4
// tiles square with their scales staged (partial units at the edges), x^T alone (the row-wise
// buffers must stay untouched); the kernels built to count (precision/quant_counts.cuh) against
// dw_qcounts_add_cpu on the CPU reference's codes, exactly (counters start at random values).
// Checks indexing, ring and barrier logic off the GPU; not the PTX instructions themselves (the
// shim stands in for them) and not speed. Fresh random data per run (DW_TEST_SEED replays).
#include "shim.h"
#include <stdio.h>
#include <stdlib.h>
#include <vector>
#include <random>
#include "kernels/cuda/quant_common.cuh"
extern "C" {
#include "testutil.h"
}
#include "precision/quant_counts.h"

int g_emu_sms = 2;
std::map<const void *, EmuBar> g_bars;
std::map<unsigned, std::vector<EmuPending>> g_pending;
int g_emu_bar_count = 0, g_emu_bar_gen = 0;

using namespace dwq;

static std::mt19937_64 rng;

static float sample(int kind, int64_t i, int64_t j) {
    std::normal_distribution<float> nd;
    float v = nd(rng) * ldexpf(1.0f, (int)(rng() % 24) - 12);
    if (kind == 1) {
        uint64_t u = rng() % 1000;
        if (u == 0) return NAN;
        if (u == 1) return INFINITY;
        if (u == 2) return -INFINITY;
        if (u < 20) return ldexpf(1.0f, -140) * (float)(u - 10);
        if (u < 40) return 0.0f;
        if (u < 45) return -0.0f;
        if ((i / 7 + j / 40) % 5 == 0) return 0.0f * v;
    }
    if (kind == 2) return ldexpf((float)((int)(rng() % 129) - 64), (int)(rng() % 9) - 6);
    return v;
}

static OutDesc desc(dw_recipe r, uint8_t *codes, void *scales, uint8_t *swz, int64_t R, int64_t C) {
    OutDesc d = {};
    int64_t sr, sc;
    dw_quant_scale_shape(r, R, C, &sr, &sc);
    d.codes = codes, d.scales = scales, d.swz = swz, d.tscale = nullptr;
    d.row_bytes = dw_quant_row_bytes(r, C);
    d.scols = sc;
    return d;
}

static int cmp(const char *what, const uint8_t *a, const uint8_t *b, size_t n, const char *label) {
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "MISMATCH %s %s byte %zu/%zu: emu %#x cpu %#x\n", label, what, i, n, a[i], b[i]);
            return 1;
        }
    return 0;
}

static int run(dw_recipe r, int64_t rows, int64_t cols, bool trans, bool tonly, bool swz, bool pow2, int kind,
               int store, int load, int group, int tblock, int stages, int cps, int maxc) {
    char label[240];
    snprintf(label, sizeof label,
             "%s [%lld,%lld]%s%s%s kind=%d store=%d load=%d group=%d tblock=%d stages=%d cps=%d max=%d",
             dw_recipe_name(r), (long long)rows, (long long)cols, tonly ? " T only" : trans ? " +T" : "",
             swz ? " swz" : "", pow2 ? " pow2/floor" : "", kind, store, load, group, tblock, stages, cps, maxc);
    const int64_t n = rows * cols;
    std::vector<uint16_t> xb(n);
    std::vector<float> xf(n);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            xb[i * cols + j] = dw_encode_bf16(sample(kind, i, j));
            xf[i * cols + j] = dw_decode_bf16(xb[i * cols + j]);
        }
    dw_quant_opts o = {};
    o.recipe = r;
    o.rounding = pow2 ? DW_SCALE_FLOOR : DW_SCALE_RCEIL;
    o.pow2 = pow2;
    size_t cn = dw_quant_codes_bytes(r, rows, cols), sn = dw_quant_scales_bytes(r, rows, cols);
    size_t ctn = dw_quant_codes_bytes(r, cols, rows), stn = dw_quant_scales_bytes(r, cols, rows);
    std::vector<uint8_t> qc(cn), qs(sn), qtc(ctn), qts(stn);
    dw_qtensor q = {}, qt = {};
    q.codes = qc.data(), q.scales = qs.data(), qt.codes = qtc.data(), qt.scales = qts.data();
    if (dw_quantize_cpu(NULL, &o, xf.data(), rows, cols, &q) != DW_OK) abort();
    if (trans && dw_quantize_transposed_cpu(NULL, &o, xf.data(), rows, cols, &qt) != DW_OK) abort();
    q.recipe = qt.recipe = r, q.rows = qt.cols = rows, q.cols = qt.rows = cols; /* (for dw_qcounts_add_cpu) */
    // device buffers (poisoned, 16-byte aligned)
    auto alloc = [](size_t b) { uint8_t *p = (uint8_t *)aligned_alloc(16, (b + 64 + 15) / 16 * 16); memset(p, 0xA5, b + 64); return p; };
    uint8_t *dc = alloc(cn), *ds = alloc(sn), *dtc = alloc(ctn), *dts = alloc(stn);
    int64_t sr, sc, tsr, tsc;
    dw_quant_scale_shape(r, rows, cols, &sr, &sc);
    dw_quant_scale_shape(r, cols, rows, &tsr, &tsc);
    size_t zn = swz ? dw_scale_swizzled_bytes(sr, sc) : 0, tzn = swz ? dw_scale_swizzled_bytes(tsr, tsc) : 0;
    uint8_t *dz = swz ? alloc(zn) : nullptr, *dtz = swz ? alloc(tzn) : nullptr;
    if (swz) memset(dz, 0, zn), memset(dtz, 0, tzn);
    uint16_t *dx = (uint16_t *)aligned_alloc(16, (n * 2 + 15) / 16 * 16);
    memcpy(dx, xb.data(), n * 2);
    Params p = {};
    p.rows = rows, p.cols = cols, p.tiles_c = (cols + TILE - 1) / TILE;
    p.vec_in = true, p.vec_out = true, p.pow2 = pow2, p.floor_rule = pow2;
    p.o = desc(r, dc, ds, dz, rows, cols);
    if (trans) p.t = desc(r, dtc, dts, dtz, cols, rows);
    if (tonly) p.o.codes = nullptr, p.o.scales = nullptr, p.o.swz = nullptr; /* x^T alone */
    /* counters: (overflow, underflow, elements) per copy from random starting values, a guard word after */
    unsigned long long cnt[2][DW_QC_WORDS + 1], base[2][DW_QC_WORDS];
    for (int k = 0; k < 2; k++) {
        for (int w = 0; w < DW_QC_WORDS; w++) base[k][w] = cnt[k][w] = rng() >> 8;
        cnt[k][DW_QC_WORDS] = 0xA5A5u;
    }
    if (!tonly) p.o.cnt = cnt[0];
    if (trans) p.t.cnt = cnt[1];
    if (!bulk_eligible(r, p, dx, trans)) { fprintf(stderr, "not eligible: %s\n", label); abort(); }
    bool counted = false;
    if (launch_bulk(NULL, r, dx, p, trans, BulkTune{store, load, group, tblock, stages, cps, maxc}, NULL, &counted) != DW_OK) { fprintf(stderr, "launch: %s\n", dw_errmsg(NULL)); abort(); }
    int bad = 0;
    /* the kernels built to count: exactly the CPU's counts of the reference codes; others leave them */
    const bool want_counted = !trans || (cps < 3 && (store == 1 || store == 5 || store == 0));
    if (counted != want_counted) { fprintf(stderr, "counted %d, expected %d: %s\n", counted, want_counted, label); bad++; }
    std::vector<float> yscratch(n);
    for (int k = 0; k < 2; k++) {
        if (k == 0 ? tonly : !trans) continue;
        uint64_t want[DW_QC_WORDS] = {0, 0, 0};
        if (counted) dw_qcounts_add_cpu(k ? &qt : &q, xf.data(), k == 1, yscratch.data(), want);
        bool same = cnt[k][DW_QC_WORDS] == 0xA5A5u;
        for (int w = 0; w < DW_QC_WORDS; w++) same &= cnt[k][w] - base[k][w] == want[w];
        if (!same) {
            fprintf(stderr, "COUNTS %s %s: kernel %llu / %llu / %llu, cpu %llu / %llu / %llu\n", label, k ? "T" : "rows",
                    cnt[k][0] - base[k][0], cnt[k][1] - base[k][1], cnt[k][2] - base[k][2], (unsigned long long)want[0],
                    (unsigned long long)want[1], (unsigned long long)want[2]);
            bad++;
        }
    }
    if (emu_bulk_pending()) { fprintf(stderr, "bulk stores not waited for: %s\n", label); bad++; g_pending.clear(); }
    if (tonly) { /* nothing written to the row-wise buffers */
        std::vector<uint8_t> poison(cn > sn ? cn : sn, 0xA5);
        bad += cmp("codes (none)", dc, poison.data(), cn, label);
        bad += cmp("scales (none)", ds, poison.data(), sn, label);
    } else {
        bad += cmp("codes", dc, qc.data(), cn, label);
        bad += cmp("scales", ds, qs.data(), sn, label);
    }
    for (int i = 0; i < 64; i++) if (dc[cn + i] != 0xA5 || ds[sn + i] != 0xA5) { fprintf(stderr, "overrun %s\n", label); bad++; break; }
    if (swz && !tonly) {
        std::vector<uint8_t> want(zn);
        dw_scale_swizzle_cpu(qs.data(), sr, sc, want.data());
        bad += cmp("swz", dz, want.data(), zn, label);
    }
    if (trans) {
        bad += cmp("T codes", dtc, qtc.data(), ctn, label);
        bad += cmp("T scales", dts, qts.data(), stn, label);
        for (int i = 0; i < 64; i++) if (dtc[ctn + i] != 0xA5 || dts[stn + i] != 0xA5) { fprintf(stderr, "T overrun %s\n", label); bad++; break; }
        if (swz) {
            std::vector<uint8_t> want(tzn);
            dw_scale_swizzle_cpu(qts.data(), tsr, tsc, want.data());
            bad += cmp("T swz", dtz, want.data(), tzn, label);
        }
    }
    fprintf(stderr, "%s %s\n", bad ? "FAIL" : "ok  ", label);
    free(dc), free(ds), free(dtc), free(dts), free(dz), free(dtz), free(dx);
    return bad;
}

int main() {
    rng.seed(dw_test_seed());
    const dw_recipe rs[] = {DW_RECIPE_MXFP8, DW_RECIPE_MXFP8_E5M2, DW_RECIPE_FP8_BLOCK};
    int bad = 0, cases = 0;
    const int64_t tshapes[][2] = {{128, 128}, {256, 384}, {384, 256}, {512, 640}};
    const int64_t rshapes[][2] = {{128, 128}, {300, 128}, {17, 1024}, {640, 384}, {5, 256}};
    for (dw_recipe r : rs)
        for (int v = 0; v < 4; v++) {
            for (auto &sh : tshapes) {
                bool swz = r != DW_RECIPE_FP8_BLOCK && (v & 1);
                for (int store = 1; store <= 5; store++) {
                    const int cps = (int)(rng() % 4); /* 3: the kernels built for 3 CTAs per SM */
                    const int tblock = (int[]){0, 1, 2, 4}[rng() % 4];
                    bad += run(r, sh[0], sh[1], true, rng() % 3 == 0, swz, v & 2, (v + (int)sh[0] / 128) % 3, store,
                               1 + (int)(rng() % 2), (int)(rng() % 4), tblock,
                               cps == 3 ? 2 : 2 + (int)(rng() % (store == 5 ? 4 : 5)), cps, /* 5: + 32 KiB */
                               (rng() % 2) ? 1 + (int)(rng() % 3) : 0);
                    cases++;
                }
            }
            for (auto &sh : rshapes) {
                bool swz = r != DW_RECIPE_FP8_BLOCK && (v & 1);
                bad += run(r, sh[0], sh[1], false, false, swz, v & 2, (v + (int)sh[0]) % 3, 0, 0, 0, 0, 2 + (int)(rng() % 5),
                           (int)(rng() % 3), (rng() % 2) ? 1 + (int)(rng() % 3) : 0);
                cases++;
            }
        }
    fprintf(stderr, "%d cases, %d bad\n", cases, bad);
    return bad != 0;
}
