/* gemm_cublaslt.c — the cuBLASLt backend: BF16 (any sm_80+), FP8 E4M3 with tensorwise, per-row
 * (outer vector), 1x128 (VEC128_32F) and 128x128 (BLK128x128_32F) scales on sm_90, and the
 * Blackwell block-scaled paths (MXFP8 VEC32_UE8M0, NVFP4 VEC16_UE4M3) on sm_100, which are
 * compiled and dispatched by compute capability but have never run here (no sm_100 GPU): they
 * are unverified on hardware. Row-major D = op(A) op(B) is issued as the column-major
 * D^T = op(B)^T op(A)^T, so cuBLASLt's A is our B and its B is our A. */
#include <stdlib.h>
#include <string.h>

#include "core/ctx.h"
#include "core/error.h"
#include "formats/formats.h"
#include "gemm/kernels.h"

/* ---- eligibility: host code in every build (the compiler plans with it on any machine) ---- */
static bool bf16_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    if ((a->epilogue & DW_EPI_GELU_AUX) && a->n % 8) return *why = "GELU_AUX needs n % 8 == 0", false;
    if ((a->epilogue & DW_EPI_DGELU) && a->n % 8) return *why = "DGELU needs n % 8 == 0 (aux rows)", false;
    return true;
}

/* block-scaled recipes on sm_80/sm_90 through exact BF16 dequantisation */
static bool is_blockscaled(int32_t r) {
    return r == DW_RECIPE_MXFP8 || r == DW_RECIPE_MXFP8_E5M2 || r == DW_RECIPE_MXFP4 || r == DW_RECIPE_NVFP4;
}

static bool dq_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    if (!is_blockscaled(a->a.recipe) || !is_blockscaled(a->b.recipe))
        return *why = "A and B must be mxfp8, mxfp8_e5m2, mxfp4 or nvfp4", false;
    return bf16_eligible(a, user, why);
}

static bool is_fp8_hopper(int32_t r) {
    return r == DW_RECIPE_FP8_TENSOR || r == DW_RECIPE_FP8_ROW || r == DW_RECIPE_FP8_BLOCK || r == DW_RECIPE_FP8_BLOCK2D;
}

static bool fp8_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    int32_t ra = a->a.recipe, rb = a->b.recipe;
    if (!is_fp8_hopper(ra) || !is_fp8_hopper(rb)) return *why = "A and B must be fp8_tensor/row/block/block2d", false;
    bool ok = (ra == DW_RECIPE_FP8_TENSOR && rb == DW_RECIPE_FP8_TENSOR) ||
              (ra == DW_RECIPE_FP8_ROW && rb == DW_RECIPE_FP8_ROW) ||
              ((ra == DW_RECIPE_FP8_BLOCK || ra == DW_RECIPE_FP8_BLOCK2D) &&
               (rb == DW_RECIPE_FP8_BLOCK || rb == DW_RECIPE_FP8_BLOCK2D) &&
               !(ra == DW_RECIPE_FP8_BLOCK2D && rb == DW_RECIPE_FP8_BLOCK2D));
    if (!ok) return *why = "cuBLASLt pairs: tensor x tensor, row x row, block x block/block2d", false;
    if (a->a.trans || !a->b.trans)
        return *why = "FP8 on Hopper is TN only: A stored [m,k] and B stored [n,k] (trans_b); use the "
                      "quantiser's transposed copy",
               false;
    if (a->k % 16) return *why = "FP8 needs k % 16 == 0 (16-byte rows)", false;
    if ((ra == DW_RECIPE_FP8_BLOCK || ra == DW_RECIPE_FP8_BLOCK2D) && (a->k % 128 || a->m % 16))
        return *why = "cuBLASLt block scaling needs k % 128 == 0 and m % 16 == 0 (no algorithm otherwise)", false;
    if ((a->n * (a->out_type == DW_GEMM_OUT_BF16 ? 2 : 4)) % 16)
        return *why = "FP8 needs 16-byte output rows (n % 8 for BF16, n % 4 for FP32)", false;
    if (a->epilogue & DW_EPI_BGRAD) return *why = "cuBLASLt has no FP8 bias-gradient epilogue", false;
    if (a->epilogue & (DW_EPI_GELU | DW_EPI_DGELU))
        return *why = "cuBLASLt has no FP8 GELU epilogue on sm_90 (measured)", false;
    if ((a->epilogue & DW_EPI_BIAS) && a->out_type == DW_GEMM_OUT_F32)
        return *why = "cuBLASLt FP8 with FP32 output takes only a BF16 bias; Deepwell's bias has the output type",
               false;
    if ((a->epilogue & DW_EPI_GELU_AUX) && a->n % 8) return *why = "GELU_AUX needs n % 8 == 0", false;
    return true;
}

static bool mx_eligible(const dw_gemm_args *a, void *user, const char **why) {
    (void)user;
    int32_t ra = a->a.recipe, rb = a->b.recipe;
    bool mx8 = (ra == DW_RECIPE_MXFP8 || ra == DW_RECIPE_MXFP8_E5M2) && (rb == DW_RECIPE_MXFP8 || rb == DW_RECIPE_MXFP8_E5M2);
    if (!mx8 && !(ra == DW_RECIPE_NVFP4 && rb == DW_RECIPE_NVFP4))
        return *why = "A and B must both be mxfp8(_e5m2) or both nvfp4", false;
    if (a->a.trans || !a->b.trans) return *why = "block-scaled FP8/FP4 is TN only: A [m,k], B [n,k] (trans_b)", false;
    if (a->k % 32) return *why = "k must be a multiple of 32", false;
    if (a->epilogue & (DW_EPI_BGRAD | DW_EPI_DGELU))
        return *why = "no block-scaled bias-gradient or GELU-gradient epilogue", false;
    return true;
}

#if DW_HAVE_CUDA
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-prototypes" /* cublasLt.h declares f() */
#include <cublasLt.h>
#pragma GCC diagnostic pop
#include <cuda_runtime_api.h>

#include "core/cuda_check.h"
#include "gemm/gemm_cuda.h"

#define LT_WORKSPACE (64u << 20)
#define LT_CACHE 64

typedef struct {
    int64_t m, n, k;
    int32_t ra, rb, out_type, epilogue;
    bool ta, tb, beta0, dev_alpha;
} algo_key;

typedef struct {
    cublasLtHandle_t h;
    void *ws;        /* cuBLASLt workspace, LT_WORKSPACE bytes */
    void *scratch;   /* re-laid-out scales for both operands */
    size_t scratch_bytes;
    void *dq;        /* BF16 copies of dequantised MX/NVFP4 operands (grow-only) */
    size_t dq_bytes;
    float *alpha_beta; /* device [alpha, beta] when NVFP4 tensor scales are read on the device */
    algo_key keys[LT_CACHE];
    cublasLtMatmulAlgo_t algos[LT_CACHE];
    int ncache;
} lt_state;

static void lt_destroy(void *p) {
    lt_state *s = p;
    if (!s) return;
    if (s->h) cublasLtDestroy(s->h);
    cudaFree(s->ws);
    cudaFree(s->scratch);
    cudaFree(s->dq);
    cudaFree(s->alpha_beta);
    free(s);
}

static dw_status lt_create(dw_ctx *ctx, void **out) {
    lt_state *s = calloc(1, sizeof *s);
    if (!s) return dw_set_error(ctx, DW_ERR_NOMEM, "cublaslt: out of host memory");
    if (cublasLtCreate(&s->h) != CUBLAS_STATUS_SUCCESS) {
        free(s);
        return dw_set_error(ctx, DW_ERR_CUDA, "cublasLtCreate failed");
    }
    if (cudaMalloc(&s->ws, LT_WORKSPACE) != cudaSuccess || cudaMalloc((void **)&s->alpha_beta, 2 * sizeof(float))) {
        lt_destroy(s);
        return dw_set_error(ctx, DW_ERR_NOMEM, "cublaslt: cannot allocate the %u MiB workspace", LT_WORKSPACE >> 20);
    }
    *out = s;
    return DW_OK;
}

#define LT_CHECK(ctx, stmt)                                                                              \
    do {                                                                                                 \
        cublasStatus_t st_ = (stmt);                                                                     \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                              \
            status = dw_set_error((ctx), DW_ERR_CUDA, "%s failed (%s:%d): %s", #stmt, __FILE__, __LINE__, \
                                  cublasLtGetStatusString(st_));                                         \
            goto done;                                                                                   \
        }                                                                                                \
    } while (0)

static cudaDataType elem_type(int32_t r) {
    switch (r) {
    case DW_RECIPE_BF16: return CUDA_R_16BF;
    case DW_RECIPE_MXFP8_E5M2: return CUDA_R_8F_E5M2;
    case DW_RECIPE_NVFP4:
    case DW_RECIPE_MXFP4: return CUDA_R_4F_E2M1;
    default: return CUDA_R_8F_E4M3;
    }
}

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* Scratch bytes operand x needs for its re-laid-out scales (0 when passed as is). */
static size_t scale_scratch(const dw_gemm_operand *x) {
    int64_t sr, sc;
    switch (x->recipe) {
    case DW_RECIPE_FP8_BLOCK:
    case DW_RECIPE_FP8_BLOCK2D:
        dw_quant_scale_shape((dw_recipe)x->recipe, x->rows, x->cols, &sr, &sc);
        return (size_t)(round_up(sc, 4) * round_up(sr, 4)) * 4;
    case DW_RECIPE_MXFP8:
    case DW_RECIPE_MXFP8_E5M2:
    case DW_RECIPE_NVFP4:
        dw_quant_scale_shape((dw_recipe)x->recipe, x->rows, x->cols, &sr, &sc);
        return dw_scale_swizzled_bytes(sr, sc);
    default: return 0;
    }
}

/* cuBLASLt's FP32 block-scale layouts on sm_90, for a K-major operand stored [rows, k], as
 * measured on the H200 (cuBLAS 13.1; other layouts give O(1) errors, tests/gpu/test_gemm_gpu.c):
 * VEC128 (1x128) wants the scales outer-dimension fastest, [k/128][rows] (rows padded to 4);
 * BLK128x128 wants them as stored, [rows/128][k/128], but with the k/128 dimension padded to a
 * multiple of 4. Both need k % 128 == 0, and m = 202 found no algorithm where m = 272 did: the
 * predicate asks m % 16 == 0. */
/* Sets the scale mode and pointer of cuBLASLt operand `which` (0 = its A, 1 = its B) from x,
 * re-laying the scales out into dst when cuBLASLt wants another layout. */
static dw_status set_scale(dw_ctx *ctx, cublasLtMatmulDesc_t desc, int which, const dw_gemm_operand *x,
                           void *dst, cudaStream_t stream) {
    if (x->recipe == DW_RECIPE_BF16) return DW_OK;
    int32_t mode;
    const void *ptr = x->scales;
    int64_t sr, sc;
    dw_quant_scale_shape((dw_recipe)x->recipe, x->rows, x->cols, &sr, &sc);
    switch (x->recipe) {
    case DW_RECIPE_FP8_TENSOR: mode = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F; break;
    case DW_RECIPE_FP8_ROW: mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F; break;
    case DW_RECIPE_FP8_BLOCK:
    case DW_RECIPE_FP8_BLOCK2D:
        mode = x->recipe == DW_RECIPE_FP8_BLOCK ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F
                                                : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
        if (x->recipe == DW_RECIPE_FP8_BLOCK)
            DW_CUDA_CHECK(ctx, (cudaError_t)dw_gemm_cuda_transpose_scales(x->scales, sr, sc, round_up(sr, 4), dst,
                                                                          stream));
        else
            DW_CUDA_CHECK(ctx, (cudaError_t)dw_gemm_cuda_pad_scales(x->scales, sr, sc, round_up(sc, 4), dst, stream));
        ptr = dst;
        break;
    case DW_RECIPE_MXFP8:
    case DW_RECIPE_MXFP8_E5M2:
    case DW_RECIPE_NVFP4:
        mode = x->recipe == DW_RECIPE_NVFP4 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3
                                            : CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
        DW_CUDA_CHECK(ctx, (cudaError_t)dw_gemm_cuda_tile_scales(x->scales, sr, sc, dst, stream));
        ptr = dst;
        break;
    default: return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cublaslt: recipe %s", dw_recipe_name((dw_recipe)x->recipe));
    }
    cublasLtMatmulDescAttributes_t am = which == 0 ? CUBLASLT_MATMUL_DESC_A_SCALE_MODE : CUBLASLT_MATMUL_DESC_B_SCALE_MODE;
    cublasLtMatmulDescAttributes_t ap =
        which == 0 ? CUBLASLT_MATMUL_DESC_A_SCALE_POINTER : CUBLASLT_MATMUL_DESC_B_SCALE_POINTER;
    if (cublasLtMatmulDescSetAttribute(desc, am, &mode, sizeof mode) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulDescSetAttribute(desc, ap, &ptr, sizeof ptr) != CUBLAS_STATUS_SUCCESS)
        return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "cublaslt: scale mode %d not accepted", (int)mode);
    return DW_OK;
}

/* NVFP4's tensor scale of operand x: the host value (*val) or, when it lives in memory, *ptr. */
static void nvfp4_ts(const dw_gemm_operand *x, const float **ptr, float *val) {
    bool nv = x && x->recipe == DW_RECIPE_NVFP4;
    *ptr = nv ? x->tensor_scale_ptr : NULL;
    *val = nv ? x->tensor_scale : 1.0f;
}

/* Runs the cuBLASLt GEMM of a; the NVFP4 tensor scales come from ts_a / ts_b (the original
 * operands: the BF16 route passes its quantised inputs here), folded into alpha on the host or,
 * when one lives in device memory, on the device (pointer mode DEVICE: nothing is read back). */
static dw_status lt_run_scaled(dw_ctx *ctx, const dw_gemm_args *a, const dw_gemm_operand *ts_a,
                               const dw_gemm_operand *ts_b) {
    void *sp = NULL, *hp = NULL;
    DW_TRY(dw_ctx_stream(ctx, &sp));
    DW_TRY(dw_ctx_handle(ctx, DW_HANDLE_CUBLASLT, lt_create, lt_destroy, &hp));
    cudaStream_t stream = sp;
    lt_state *s = hp;
    dw_status status = DW_OK;
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;

    /* scratch for re-laid-out scales: [cuBLASLt A = our B | cuBLASLt B = our A] */
    size_t s0 = round_up((int64_t)scale_scratch(&a->b), 256), s1 = scale_scratch(&a->a);
    if (s0 + s1 > s->scratch_bytes) {
        cudaFree(s->scratch);
        s->scratch = NULL;
        s->scratch_bytes = 0;
        DW_CUDA_CHECK(ctx, cudaMalloc(&s->scratch, s0 + s1));
        s->scratch_bytes = s0 + s1;
    }
    cudaDataType dt = a->out_type == DW_GEMM_OUT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    LT_CHECK(ctx, cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = a->b.trans ? CUBLAS_OP_T : CUBLAS_OP_N, tb = a->a.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if ((status = set_scale(ctx, desc, 0, &a->b, s->scratch, stream)) != DW_OK) goto done;
    if ((status = set_scale(ctx, desc, 1, &a->a, (char *)s->scratch + s0, stream)) != DW_OK) goto done;

    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    int e = a->epilogue;
    if (e & DW_EPI_BGRAD) epi = CUBLASLT_EPILOGUE_BGRADB;
    else if (e & DW_EPI_DGELU) epi = CUBLASLT_EPILOGUE_DGELU;
    else if (e & DW_EPI_GELU_AUX) epi = (e & DW_EPI_BIAS) ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
    else if (e & DW_EPI_GELU) epi = (e & DW_EPI_BIAS) ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    else if (e & DW_EPI_BIAS) epi = CUBLASLT_EPILOGUE_BIAS;
    LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (e & (DW_EPI_BIAS | DW_EPI_BGRAD)) {
        const void *bp = (e & DW_EPI_BGRAD) ? a->bgrad : a->bias;
        int32_t bt = (int32_t)dt;
        LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
        LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    if (e & (DW_EPI_GELU_AUX | DW_EPI_DGELU)) { /* saved (GELU_AUX) or read (DGELU) pre-activation */
        int64_t ld = a->n;
        int32_t at = (int32_t)dt;
        LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &a->aux,
                                                     sizeof a->aux));
        LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
        LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at,
                                                     sizeof at));
    }
    /* cuBLASLt A = our B stored [rows, cols] row-major = column-major [cols, rows], ld cols. */
    LT_CHECK(ctx, cublasLtMatrixLayoutCreate(&la, elem_type(a->b.recipe), (uint64_t)a->b.cols, (uint64_t)a->b.rows,
                                             a->b.cols));
    LT_CHECK(ctx, cublasLtMatrixLayoutCreate(&lb, elem_type(a->a.recipe), (uint64_t)a->a.cols, (uint64_t)a->a.rows,
                                             a->a.cols));
    LT_CHECK(ctx, cublasLtMatrixLayoutCreate(&lc, dt, (uint64_t)a->n, (uint64_t)a->m, a->n));

    float alpha = a->alpha, beta = a->beta, va, vb;
    const float *pa, *pb;
    nvfp4_ts(ts_a, &pa, &va);
    nvfp4_ts(ts_b, &pb, &vb);
    bool dev_alpha = pa || pb;
    if (dev_alpha) {
        cublasLtPointerMode_t pm = CUBLASLT_POINTER_MODE_DEVICE;
        LT_CHECK(ctx, cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm));
        int ce = dw_gemm_cuda_alpha_beta(alpha, beta, pa, va, pb, vb, s->alpha_beta, stream);
        if (ce) {
            status = dw_set_error(ctx, DW_ERR_CUDA, "gemm: launch of the alpha kernel failed: %s",
                                  cudaGetErrorString((cudaError_t)ce));
            goto done;
        }
    } else {
        alpha = alpha * va * vb; /* the order of the device path */
    }

    algo_key key; /* compared with memcmp: zeroed first, then set member by member (assigning a compound
                   * literal may copy its unspecified padding over the zeros) */
    memset(&key, 0, sizeof key);
    key.m = a->m, key.n = a->n, key.k = a->k;
    key.ra = a->a.recipe, key.rb = a->b.recipe, key.out_type = a->out_type, key.epilogue = a->epilogue;
    key.ta = a->a.trans, key.tb = a->b.trans, key.beta0 = a->beta == 0.0f, key.dev_alpha = dev_alpha;
    int hit = -1;
    for (int i = 0; i < s->ncache; i++)
        if (!memcmp(&s->keys[i], &key, sizeof key)) hit = i;
    if (hit < 0) {
        cublasLtMatmulHeuristicResult_t res;
        int nres = 0;
        size_t wsb = LT_WORKSPACE;
        LT_CHECK(ctx, cublasLtMatmulPreferenceCreate(&pref));
        LT_CHECK(ctx, cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb,
                                                           sizeof wsb));
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(s->h, desc, la, lb, lc, lc, pref, 1, &res, &nres);
        if (hs != CUBLAS_STATUS_SUCCESS || nres == 0) {
            status = dw_set_error(ctx, DW_ERR_UNSUPPORTED,
                                  "cuBLASLt has no algorithm for A=%s%s B=%s%s epilogue 0x%x (%s)",
                                  dw_recipe_name((dw_recipe)a->a.recipe), a->a.trans ? "^T" : "",
                                  dw_recipe_name((dw_recipe)a->b.recipe), a->b.trans ? "^T" : "",
                                  (unsigned)a->epilogue, cublasLtGetStatusString(hs));
            goto done;
        }
        hit = s->ncache < LT_CACHE ? s->ncache++ : (int)(key.m % LT_CACHE);
        s->keys[hit] = key;
        s->algos[hit] = res.algo;
    }
    const void *cptr = a->beta != 0.0f ? a->c : a->d;
    const void *alpha_p = dev_alpha ? (const void *)s->alpha_beta : &alpha;
    const void *beta_p = dev_alpha ? (const void *)(s->alpha_beta + 1) : &beta;
    LT_CHECK(ctx, cublasLtMatmul(s->h, desc, alpha_p, a->b.data, la, a->a.data, lb, beta_p, cptr, lc, a->d, lc,
                                 &s->algos[hit], s->ws, LT_WORKSPACE, stream));
done:
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
    return status;
}

static dw_status lt_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)user;
    return lt_run_scaled(ctx, a, &a->a, &a->b);
}




/* Dequantises x into a BF16 copy at dst (device) and describes it in out. */
static dw_status dq_operand(dw_ctx *ctx, const dw_gemm_operand *x, uint16_t *dst, void *stream, dw_gemm_operand *out) {
    int64_t sr, sc;
    dw_quant_scale_shape((dw_recipe)x->recipe, x->rows, x->cols, &sr, &sc);
    int ek = x->recipe == DW_RECIPE_MXFP8_E5M2 ? 1 : (x->recipe == DW_RECIPE_MXFP4 || x->recipe == DW_RECIPE_NVFP4) ? 2 : 0;
    int sk = x->recipe == DW_RECIPE_NVFP4 ? 1 : 0;
    DW_CUDA_CHECK(ctx, (cudaError_t)dw_gemm_cuda_dequant_bf16(ek, sk, x->data, x->scales, x->rows, x->cols,
                                                             dw_quant_row_bytes((dw_recipe)x->recipe, x->cols), sc,
                                                             dst, stream));
    *out = *x;
    out->recipe = DW_RECIPE_BF16;
    out->data = dst;
    out->scales = NULL;
    return DW_OK;
}

static dw_status dq_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    void *sp = NULL;
    DW_TRY(dw_ctx_stream(ctx, &sp));
    cudaStream_t stream = sp;
    void *hp = NULL;
    DW_TRY(dw_ctx_handle(ctx, DW_HANDLE_CUBLASLT, lt_create, lt_destroy, &hp));
    lt_state *st = hp;
    size_t na = (size_t)(a->a.rows * a->a.cols), nb = (size_t)(a->b.rows * a->b.cols);
    /* The BF16 copies live in one grow-only buffer, so a training step allocates nothing once the
     * first (eager) step has seen its largest GEMM; growing while a CUDA graph is being captured
     * would break the capture, so that is refused with a message instead. */
    if ((na + nb) * 2 > st->dq_bytes) {
        enum cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
        if (cudaStreamIsCapturing(stream, &cap) == cudaSuccess && cap != cudaStreamCaptureStatusNone)
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "gemm: the MX/NVFP4 dequantisation buffer must grow to %zu bytes during "
                                "CUDA graph capture; run the step once eagerly first",
                                (na + nb) * 2);
        DW_CUDA_CHECK(ctx, cudaStreamSynchronize(stream)); /* the old buffer may still be in use */
        cudaFree(st->dq);
        st->dq = NULL;
        st->dq_bytes = 0;
        DW_CUDA_CHECK(ctx, cudaMalloc(&st->dq, (na + nb) * 2));
        st->dq_bytes = (na + nb) * 2;
    }
    uint16_t *buf = st->dq;
    dw_gemm_args g = *a;
    dw_status s = dq_operand(ctx, &a->a, buf, stream, &g.a);
    if (s == DW_OK) s = dq_operand(ctx, &a->b, buf + na, stream, &g.b);
    (void)user;
    if (s == DW_OK) s = lt_run_scaled(ctx, &g, &a->a, &a->b);
    return s;
}




#else
static dw_status no_cuda_run(dw_ctx *ctx, const dw_gemm_args *a, void *user) {
    (void)a, (void)user;
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "gemm: this build has no CUDA");
}
#define lt_run no_cuda_run
#define dq_run no_cuda_run
#endif /* DW_HAVE_CUDA */

/* The same entries in every build, so a CPU-only build plans CUDA programs with the same rules;
 * their run functions exist only with CUDA (a CPU context never selects them). */
static const dw_kernel_desc lt_kernels[] = {
    {.name = "cublaslt_bf16", .op = DW_KOP_GEMM, .recipe_a = DW_RECIPE_BF16, .recipe_b = DW_RECIPE_BF16,
     .device = DW_DEVICE_CUDA, .sm_min = 80, .sm_max = 129, .priority = 10, .eligible = bf16_eligible, .run = lt_run},
    {.name = "cublaslt_fp8_sm90", .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1,
     .device = DW_DEVICE_CUDA, .sm_min = 90, .sm_max = 90, .priority = 10, .eligible = fp8_eligible, .run = lt_run},
    /* Hopper (and Ampere): MX / NVFP4 numerics exactly through BF16 tensor cores; preferred on sm_90
     * over Deepwell's FP8-wgmma MXFP8 kernel, which is slower and whose FP8 accumulation keeps
     * only ~2^-13 relative precision per 32-chunk (docs/gemm.md has the measurements). */
    {.name = "deepwell_mx_dequant_bf16", .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1,
     .device = DW_DEVICE_CUDA, .sm_min = 80, .sm_max = 99, .priority = 40, .eligible = dq_eligible, .run = dq_run},
    /* Blackwell block scaling: compiled and selected on sm_100 only; never run on this project's
     * H200s, so unverified on hardware (the 128x4 scale tiling is unit-tested on the CPU). */
    {.name = "cublaslt_blockscaled_sm100", .op = DW_KOP_GEMM, .recipe_a = -1, .recipe_b = -1,
     .device = DW_DEVICE_CUDA, .sm_min = 100, .sm_max = 109, .priority = 20, .eligible = mx_eligible, .run = lt_run},
};

dw_kernel_table dw_gemm_cublaslt_kernels(void) {
    return (dw_kernel_table){lt_kernels, (int)(sizeof lt_kernels / sizeof lt_kernels[0])};
}
