/* fuzz_safetensors.c — libFuzzer target for the safetensors reader (dw_st_open_memory, the same
 * parser dw_st_open runs over its mapping). For any input: no crash, no out-of-bounds read, no
 * leak; a rejected file gets a message naming it; an accepted file is consistent (tensors inside
 * the buffer, tiling it, findable by name) and survives a write → read round trip unchanged.
 * Two input modes: raw file bytes, or 'J' + u16 little-endian data length + header JSON, which the
 * target frames (length prefix, then that many data bytes) so mutations explore the header's
 * semantics instead of breaking its length field. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/safetensors.h"
#include "deepwell.h"

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "fuzz_safetensors: check failed: %s (line %d)\n", #cond, __LINE__); \
            abort();                                                                        \
        }                                                                                   \
    } while (0)

static dw_ctx *ctx;

static void check_accepted(const dw_st_file *f, const unsigned char *buf, size_t size) {
    uint64_t hlen;
    memcpy(&hlen, buf, 8);
    const unsigned char *at = buf + 8 + hlen;
    unsigned sum = 0;
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *t = dw_st_get(f, i);
        CHECK((const unsigned char *)t->data == at); /* offset order, no holes */
        CHECK(dw_st_numel(t) * (int64_t)dw_dtype_size(t->dtype) == (int64_t)t->nbytes);
        CHECK(dw_st_find(f, t->name) == t);
        for (size_t k = 0; k < t->nbytes; k++) sum += ((const unsigned char *)t->data)[k];
        if (dw_dtype_is_float(t->dtype) && dw_dtype_size(t->dtype) >= 2) {
            float *out = malloc((size_t)dw_st_numel(t) * sizeof *out + 1);
            CHECK(dw_st_read_f32(ctx, f, t, out) == DW_OK);
            free(out);
        }
        at += t->nbytes;
    }
    CHECK(at == buf + size);
    for (int i = 0; i < dw_st_metadata_count(f); i++) {
        const char *k, *v;
        dw_st_metadata_at(f, i, &k, &v);
        CHECK(dw_st_metadata(f, k) == v);
    }
    (void)sum;
}

/* Writes the accepted file again and reads it back: same tensors, bytes and metadata. */
static void check_round_trip(const dw_st_file *f) {
    dw_st_writer *w = NULL;
    CHECK(dw_st_writer_create(ctx, &w) == DW_OK);
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *t = dw_st_get(f, i);
        CHECK(dw_st_writer_add(ctx, w, t->name, t->dtype, t->ndim, t->shape, t->data, t->nbytes) == DW_OK);
    }
    for (int i = 0; i < dw_st_metadata_count(f); i++) {
        const char *k, *v;
        dw_st_metadata_at(f, i, &k, &v);
        CHECK(dw_st_writer_set_metadata(ctx, w, k, v) == DW_OK);
    }
    void *mem = NULL;
    size_t len = 0;
    CHECK(dw_st_writer_serialize(ctx, w, &mem, &len) == DW_OK);
    dw_st_writer_free(w);
    dw_st_file *g = NULL;
    if (dw_st_open_memory(ctx, mem, len, "roundtrip", &g) != DW_OK) {
        fprintf(stderr, "round trip rejected: %s\n", dw_errmsg(ctx));
        abort();
    }
    CHECK(dw_st_count(g) == dw_st_count(f));
    CHECK(dw_st_metadata_count(g) == dw_st_metadata_count(f));
    for (int i = 0; i < dw_st_count(f); i++) {
        const dw_st_tensor *a = dw_st_get(f, i), *b = dw_st_find(g, a->name);
        CHECK(b && b->dtype == a->dtype && b->ndim == a->ndim && b->nbytes == a->nbytes);
        CHECK(!memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]));
        CHECK(a->nbytes == 0 || !memcmp(a->data, b->data, a->nbytes));
        CHECK(dw_st_is_aligned(b));
    }
    for (int i = 0; i < dw_st_metadata_count(f); i++) {
        const char *k, *v, *v2;
        dw_st_metadata_at(f, i, &k, &v);
        CHECK((v2 = dw_st_metadata(g, k)) && !strcmp(v, v2));
    }
    dw_st_close(g);
    free(mem);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);
int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    if (!ctx) {
        dw_ctx_opts o = {.device = DW_DEVICE_CPU};
        CHECK(dw_ctx_create(&o, &ctx) == DW_OK);
        dw_log_set_level(DW_LOG_OFF);
    }
    /* an exact-size copy, so that ASan sees any read past the end */
    unsigned char *buf;
    if (size >= 3 && data[0] == 'J') {
        uint64_t hlen = size - 3;
        size_t dlen = (size_t)data[1] | (size_t)data[2] << 8;
        size = 8 + hlen + dlen;
        buf = malloc(size);
        memcpy(buf, &hlen, 8);
        memcpy(buf + 8, data + 3, hlen);
        for (size_t i = 0; i < dlen; i++) buf[8 + hlen + i] = (unsigned char)(i * 31 + 7);
    } else {
        buf = malloc(size ? size : 1);
        if (size) memcpy(buf, data, size);
    }
    dw_st_file *f = NULL;
    dw_status s = dw_st_open_memory(ctx, buf, size, "fuzz-input", &f);
    if (s == DW_OK) {
        check_accepted(f, buf, size);
        check_round_trip(f);
        dw_st_close(f);
    } else {
        CHECK(f == NULL);
        CHECK(s == DW_ERR_FORMAT);
        CHECK(!strncmp(dw_errmsg(ctx), "fuzz-input: ", 12));
    }
    free(buf);
    return 0;
}
