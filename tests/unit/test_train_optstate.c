/* test_train_optstate.c — AdamW state over real dw_param arrays: steps, global grad norm, the
 * optimizer.safetensors round trip (continuing after a reload is bit-identical) and refusal of a
 * file that lacks a tensor or has another shape, with nothing changed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "testutil.h"
#include "train/optstate.h"

enum { NP = 5 };
static const char *names[NP] = {"transformer.wte.weight", "transformer.h.0.attn.c_attn.weight",
                                "transformer.h.0.attn.c_attn.bias", "transformer.h.0.ln_1.weight",
                                "lm_head.weight"};


static void make_params(dw_param *p, dw_param **ptrs, bool copy_from_first, const dw_param *src) {
    for (int i = 0; i < NP; i++) {
        if (copy_from_first) {
            p[i] = src[i];
        } else {
            memset(&p[i], 0, sizeof p[i]);
            p[i].name = names[i];
            p[i].ndim = (i == 2 || i == 3) ? 1 : 2;
            p[i].shape[0] = 1 + (int64_t)(dw_test_next(&dw_test_group_rng) % 17);
            p[i].shape[1] = p[i].ndim == 2 ? 1 + (int64_t)(dw_test_next(&dw_test_group_rng) % 13) : 0;
            p[i].numel = p[i].shape[0] * (p[i].ndim == 2 ? p[i].shape[1] : 1);
            p[i].decay = p[i].ndim == 2;
        }
        p[i].data = malloc((size_t)p[i].numel * 4);
        p[i].grad = malloc((size_t)p[i].numel * 4);
        for (int64_t k = 0; k < p[i].numel; k++)
            p[i].data[k] = copy_from_first ? src[i].data[k] : dw_test_normal(&dw_test_group_rng);
        ptrs[i] = &p[i];
    }
}

static void free_params(dw_param *p) {
    for (int i = 0; i < NP; i++) {
        free(p[i].data);
        free(p[i].grad);
    }
}

static void random_grads(dw_param *a, dw_param *b) {
    for (int i = 0; i < NP; i++)
        for (int64_t k = 0; k < a[i].numel; k++) a[i].grad[k] = b[i].grad[k] = dw_test_normal(&dw_test_group_rng);
}

static void test_round_trip_continues_bit_identical(void **state) {
    (void)state;
    dw_param a[NP], b[NP];
    dw_param *pa[NP], *pb[NP];
    make_params(a, pa, false, NULL);
    dw_optim *oa = NULL, *ob = NULL;
    assert_int_equal(dw_optim_create(dw_test_ctx, pa, NP, &oa), DW_OK);
    dw_adamw_hparams h = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    int64_t t = 1;
    for (; t <= 3; t++) {
        random_grads(a, a);
        double want = 0;
        for (int i = 0; i < NP; i++)
            for (int64_t k = 0; k < a[i].numel; k++) want += (double)a[i].grad[k] * a[i].grad[k];
        double norm = dw_optim_grad_norm(oa);
        assert_true(fabs(norm - sqrt(want)) <= 1e-12 * sqrt(want));
        dw_optim_step(oa, &h, t, dw_clip_factor(norm, 1.0));
    }
    char *dir = dw_test_tmpdir();
    char *path = dw_test_path(dir, "optimizer.safetensors");
    assert_int_equal(dw_optim_save(dw_test_ctx, oa, path), DW_OK);
    /* the file: two F32 tensors per parameter with HF names + suffixes and the parameter's shape */
    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open(dw_test_ctx, path, &f), DW_OK);
    assert_int_equal(dw_st_count(f), 2 * NP);
    for (int i = 0; i < NP; i++) {
        char n[128];
        snprintf(n, sizeof n, "%s.exp_avg_sq", names[i]);
        const dw_st_tensor *x = dw_st_find(f, n);
        assert_non_null(x);
        assert_int_equal(x->dtype, DW_DT_F32);
        assert_int_equal(x->ndim, a[i].ndim);
        assert_int_equal(x->shape[0], a[i].shape[0]);
    }
    assert_string_equal(dw_st_metadata(f, "deepwell.optimizer"), "adamw");
    dw_st_close(f);
    /* a second optimizer over copies of the parameters, loaded from the file */
    make_params(b, pb, true, a);
    assert_int_equal(dw_optim_create(dw_test_ctx, pb, NP, &ob), DW_OK);
    assert_int_equal(dw_optim_load(dw_test_ctx, ob, path), DW_OK);
    for (; t <= 6; t++) {
        random_grads(a, b);
        dw_optim_step(oa, &h, t, dw_clip_factor(dw_optim_grad_norm(oa), 1.0));
        dw_optim_step(ob, &h, t, dw_clip_factor(dw_optim_grad_norm(ob), 1.0));
    }
    for (int i = 0; i < NP; i++) assert_memory_equal(a[i].data, b[i].data, (size_t)a[i].numel * 4);
    /* a file saved for fewer parameters is refused, naming the missing tensor, and b is untouched */
    dw_optim *few = NULL;
    assert_int_equal(dw_optim_create(dw_test_ctx, pa, NP - 1, &few), DW_OK);
    assert_int_equal(dw_optim_save(dw_test_ctx, few, path), DW_OK);
    assert_int_equal(dw_optim_load(dw_test_ctx, ob, path), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), path));
    /* a shape mismatch is refused too */
    dw_param c[NP];
    dw_param *pc[NP];
    memcpy(c, a, sizeof c);
    c[NP - 1].shape[0] += 1;
    c[NP - 1].numel = c[NP - 1].shape[0] * c[NP - 1].shape[1];
    c[NP - 1].data = calloc((size_t)c[NP - 1].numel, 4);
    c[NP - 1].grad = NULL;
    for (int i = 0; i < NP; i++) pc[i] = &c[i];
    dw_optim *other = NULL;
    assert_int_equal(dw_optim_create(dw_test_ctx, pc, NP, &other), DW_OK);
    assert_int_equal(dw_optim_save(dw_test_ctx, other, path), DW_OK);
    assert_int_equal(dw_optim_load(dw_test_ctx, ob, path), DW_ERR_FORMAT);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "lm_head.weight"));
    /* nothing was changed by the refused loads: one more step keeps a and b identical */
    random_grads(a, b);
    dw_optim_step(oa, &h, t, 1.0);
    dw_optim_step(ob, &h, t, 1.0);
    for (int i = 0; i < NP; i++) assert_memory_equal(a[i].data, b[i].data, (size_t)a[i].numel * 4);
    free(c[NP - 1].data);
    dw_optim_free(other);
    dw_optim_free(few);
    dw_optim_free(oa);
    dw_optim_free(ob);
    free_params(a);
    free_params(b);
    free(path);
    dw_test_rmtree(dir);
    free(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_continues_bit_identical),
    };
    return cmocka_run_group_tests(tests, dw_test_group_setup, dw_test_group_teardown);
}
