/* test_safetensors.c — safetensors reader and writer: round trips of random tensors of every
 * dtype, alignment and FP32 conversion, one hand-crafted file per validation error (each message
 * must name the file and the tensor/field), random header corruption, and atomic commits that
 * leave neither a file nor a temporary behind when they fail. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "deepwell.h"
#include "testutil.h"

static dw_ctx *new_ctx(void) {
    dw_ctx *ctx = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_CPU};
    assert_int_equal(dw_ctx_create(&o, &ctx), DW_OK);
    return ctx;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static void test_dtype_table(void **state) {
    (void)state;
    static const struct { const char *name; size_t size; bool fl; } want[] = {
        {"F64", 8, true},  {"F32", 4, true},  {"F16", 2, true},  {"BF16", 2, true},
        {"F8_E4M3", 1, true}, {"F8_E5M2", 1, true}, {"I64", 8, false}, {"I32", 4, false},
        {"I16", 2, false}, {"I8", 1, false},  {"U64", 8, false}, {"U32", 4, false},
        {"U16", 2, false}, {"U8", 1, false},  {"BOOL", 1, false}};
    assert_int_equal(sizeof want / sizeof want[0], DW_DT_COUNT);
    for (int i = 0; i < DW_DT_COUNT; i++) {
        dw_dtype t;
        assert_true(dw_dtype_parse(want[i].name, &t));
        assert_string_equal(dw_dtype_name(t), want[i].name);
        assert_int_equal(dw_dtype_size(t), want[i].size);
        assert_int_equal(dw_dtype_is_float(t), want[i].fl);
    }
    dw_dtype t;
    assert_false(dw_dtype_parse("f32", &t));
    assert_false(dw_dtype_parse("F8_E4M3FN", &t));
    assert_false(dw_dtype_parse("", &t));
}

/* ---- round trips ------------------------------------------------------------------------ */

typedef struct {
    char name[48];
    dw_dtype dtype;
    int ndim;
    int64_t shape[DW_ST_MAX_DIMS];
    unsigned char *data;
    size_t nbytes;
} ref_tensor;

static void random_tensor(dw_test_rng *r, ref_tensor *t, int idx) {
    t->dtype = (dw_dtype)(dw_test_next(r) % DW_DT_COUNT);
    t->ndim = (int)(dw_test_next(r) % 5); /* 0..4; scalars included */
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        t->shape[d] = (int64_t)(dw_test_next(r) % 7); /* zero-size dimensions included */
        numel *= (size_t)t->shape[d];
    }
    /* names with dots, slashes, quotes and backslashes (JSON escaping) */
    static const char *const parts[] = {"model.layers", "w\"q", "a\\b", "x/y", "lm_head", " sp"};
    snprintf(t->name, sizeof t->name, "%s.%d.%s", parts[dw_test_next(r) % 6], idx,
             dw_dtype_name(t->dtype));
    t->nbytes = numel * dw_dtype_size(t->dtype);
    t->data = malloc(t->nbytes + 1);
    for (size_t i = 0; i < t->nbytes; i++) t->data[i] = (unsigned char)dw_test_next(r);
}

static void check_file_matches(const dw_st_file *f, const ref_tensor *ref, int n) {
    assert_int_equal(dw_st_count(f), n);
    for (int i = 0; i < n; i++) {
        const dw_st_tensor *t = dw_st_find(f, ref[i].name);
        assert_non_null(t);
        assert_string_equal(t->name, ref[i].name);
        assert_int_equal(t->dtype, ref[i].dtype);
        assert_int_equal(t->ndim, ref[i].ndim);
        for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], ref[i].shape[d]);
        assert_int_equal(t->nbytes, ref[i].nbytes);
        assert_int_equal(dw_st_numel(t) * (int64_t)dw_dtype_size(t->dtype), (int64_t)t->nbytes);
        if (t->nbytes) assert_memory_equal(t->data, ref[i].data, t->nbytes);
        /* the writer's layout keeps every tensor aligned to its element size */
        assert_true(dw_st_is_aligned(t));
    }
    /* offset order: consecutive, tiling the buffer */
    for (int i = 1; i < n; i++) {
        const dw_st_tensor *a = dw_st_get(f, i - 1), *b = dw_st_get(f, i);
        assert_ptr_equal((const unsigned char *)a->data + a->nbytes, b->data);
    }
    assert_null(dw_st_find(f, "no.such.tensor"));
}

static void test_round_trip_random(void **state) {
    (void)state;
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 0x5afe);
    dw_ctx *ctx = new_ctx();
    char *dir = dw_test_tmpdir();
    char *path = dw_test_path(dir, "m.safetensors");
    for (int round = 0; round < 20; round++) {
        int n = (int)(dw_test_next(&r) % 40);
        ref_tensor *ref = calloc((size_t)n + 1, sizeof *ref);
        dw_st_writer *w = NULL;
        assert_int_equal(dw_st_writer_create(ctx, &w), DW_OK);
        for (int i = 0; i < n; i++) {
            random_tensor(&r, &ref[i], i);
            assert_int_equal(dw_st_writer_add(ctx, w, ref[i].name, ref[i].dtype, ref[i].ndim,
                                              ref[i].shape, ref[i].data, ref[i].nbytes),
                             DW_OK);
        }
        int nmeta = (int)(dw_test_next(&r) % 4);
        char keys[4][32], vals[4][32];
        for (int m = 0; m < nmeta; m++) {
            snprintf(keys[m], sizeof keys[m], "key%d-%llu", m, (unsigned long long)(dw_test_next(&r) % 1000));
            snprintf(vals[m], sizeof vals[m], "v\"al\\%d \xc3\xa9", m); /* UTF-8 é */
            assert_int_equal(dw_st_writer_set_metadata(ctx, w, keys[m], vals[m]), DW_OK);
        }
        assert_int_equal(dw_st_writer_commit(ctx, w, path), DW_OK);
        void *mem = NULL;
        size_t memlen = 0;
        assert_int_equal(dw_st_writer_serialize(ctx, w, &mem, &memlen), DW_OK);
        dw_st_writer_free(w);

        dw_st_file *f = NULL;
        assert_int_equal(dw_st_open(ctx, path, &f), DW_OK);
        check_file_matches(f, ref, n);
        assert_int_equal(dw_st_metadata_count(f), nmeta);
        for (int m = 0; m < nmeta; m++) assert_string_equal(dw_st_metadata(f, keys[m]), vals[m]);
        for (int m = 1; m < nmeta; m++) { /* sorted by key */
            const char *k0, *v0, *k1, *v1;
            dw_st_metadata_at(f, m - 1, &k0, &v0);
            dw_st_metadata_at(f, m, &k1, &v1);
            assert_true(strcmp(k0, k1) < 0);
        }
        assert_null(dw_st_metadata(f, "absent"));
        assert_string_equal(dw_st_path(f), path);
        dw_st_close(f);

        /* the file's bytes: the serialised buffer; header padded with spaces to 8 bytes */
        char *disk = NULL;
        FILE *fp = fopen(path, "rb");
        assert_non_null(fp);
        disk = malloc(memlen + 1);
        assert_int_equal(fread(disk, 1, memlen + 1, fp), memlen);
        fclose(fp);
        assert_memory_equal(disk, mem, memlen);
        uint64_t hlen;
        memcpy(&hlen, mem, 8);
        assert_int_equal(hlen % 8, 0);
        assert_int_equal(((char *)mem)[8], '{');
        free(disk);
        assert_int_equal(dw_st_open_memory(ctx, mem, memlen, "mem", &f), DW_OK);
        check_file_matches(f, ref, n);
        dw_st_close(f);
        free(mem);
        for (int i = 0; i < n; i++) free(ref[i].data);
        free(ref);
        assert_int_equal(count_entries(dir), 1); /* no temporary left behind */
    }
    free(path);
    dw_test_rmtree(dir);
    free(dir);
    dw_ctx_free(ctx);
}

/* ---- hand-crafted files -------------------------------------------------------------------- */

/* Writes u64 header length, the header text, then `data_len` bytes of data. */
static void craft(const char *path, uint64_t hlen_field, const char *header, size_t data_len) {
    size_t h = strlen(header);
    unsigned char *buf = calloc(1, 8 + h + data_len + 1);
    memcpy(buf, &hlen_field, 8);
    memcpy(buf + 8, header, h);
    for (size_t i = 0; i < data_len; i++) buf[8 + h + i] = (unsigned char)(i * 7 + 1);
    assert_int_equal(dw_test_write(path, buf, 8 + h + data_len), 0);
    free(buf);
}

/* Opens path expecting DW_ERR_FORMAT and every needle (NULL-terminated list) in the message. */
static void expect_bad(dw_ctx *ctx, const char *path, const char *what, ...) {
    dw_st_file *f = (dw_st_file *)1;
    dw_status s = dw_st_open(ctx, path, &f);
    if (s != DW_ERR_FORMAT) fail_msg("%s: expected DW_ERR_FORMAT, got %s (%s)", what, dw_status_name(s), dw_errmsg(ctx));
    assert_null(f);
    const char *msg = dw_errmsg(ctx);
    if (!strstr(msg, path)) fail_msg("%s: message does not name the file: %s", what, msg);
    va_list ap;
    va_start(ap, what);
    for (const char *needle; (needle = va_arg(ap, const char *));)
        if (!strstr(msg, needle)) fail_msg("%s: message lacks '%s': %s", what, needle, msg);
    va_end(ap);
}

typedef struct {
    const char *what;
    const char *header;
    size_t data_len;
    const char *needle1, *needle2;
} bad_case;

static const bad_case bad_cases[] = {
    {"invalid JSON", "{\"a\": {", 0, "invalid JSON", NULL},
    {"trailing garbage", "{} x", 0, "invalid JSON", NULL},
    {"not an object", "[1, 2]", 0, "does not start with '{'", NULL},
    {"duplicate names", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                        "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2, "duplicate", "w"},
    {"unknown dtype", "{\"w.x\":{\"dtype\":\"F12\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "w.x", "unknown dtype 'F12'"},
    {"dtype not a string", "{\"w.x\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "w.x", "'dtype'"},
    {"missing dtype", "{\"w.x\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "w.x", "missing field 'dtype'"},
    {"missing shape", "{\"w.x\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "w.x", "missing field 'shape'"},
    {"missing offsets", "{\"w.x\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "w.x", "missing field 'data_offsets'"},
    {"unknown field", "{\"w.x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, "w.x", "unknown field 'extra'"},
    {"entry not object", "{\"w.x\":[1]}", 0, "w.x", "not a JSON object"},
    {"negative dim", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,0]}}", 0, "w.x", "dimension 1"},
    {"real dim", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1.5],\"data_offsets\":[0,0]}}", 0, "w.x", "dimension 0"},
    {"string dim", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[\"3\"],\"data_offsets\":[0,3]}}", 3, "w.x", "'shape'"},
    {"shape not array", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", 3, "w.x", "'shape'"},
    {"too many dims", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, "w.x", "9 dimensions"},
    {"shape overflow", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, "w.x", "overflows"},
    {"zero-size overflow", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[0,4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, "w.x", "overflows"},
    {"bytes x size overflow", "{\"w.x\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0, "w.x", "needs"},
    {"size mismatch", "{\"w.x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, "w.x", "hold 20 bytes"},
    {"offsets out of bounds", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4, "w.x", "beyond the 4-byte data buffer"},
    {"offsets reversed", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "w.x", "begin 4 is after end 0"},
    {"offsets negative", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 4, "w.x", "'data_offsets'"},
    {"offsets one number", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1]}}", 4, "w.x", "'data_offsets'"},
    {"offsets too big for JSON", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[18446744073709551615,0]}}", 4, "invalid JSON", "too big"},
    {"offsets huge", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9223372036854775807]}}", 4, "w.x", "beyond the 4-byte"},
    {"offsets huge reversed", "{\"w.x\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[9223372036854775807,1]}}", 4, "w.x", "is after end"},
    {"overlap", "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
                "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6, "'b'", "overlap"},
    {"hole", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
             "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 5, "'b'", "unused"},
    {"not starting at 0", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3, "'a'", "[0, 1)"},
    {"trailing bytes", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 3, "cover 2 bytes", "holds 3"},
    {"empty name", "{\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "empty tensor name", NULL},
    {"non-ASCII name", "{\"caf\xc3\xa9\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "caf\\xC3\\xA9", "printable ASCII"},
    {"control char name", "{\"a\\nb\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "a\\x0Ab", "printable ASCII"},
    {"NUL in name", "{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "invalid JSON", NULL},
    {"invalid UTF-8", "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "invalid JSON", NULL},
    {"metadata not object", "{\"__metadata__\":\"x\"}", 0, "'__metadata__' is not an object", NULL},
    {"metadata non-string", "{\"__metadata__\":{\"format\":\"pt\",\"step\":3}}", 0, "'__metadata__'", "'step'"},
    {"metadata nested", "{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0, "'__metadata__'", "'a'"},
};

static void test_validation_errors(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    char *dir = dw_test_tmpdir();
    char *path = dw_test_path(dir, "bad.safetensors");
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        craft(path, strlen(c->header), c->header, c->data_len);
        expect_bad(ctx, path, c->what, c->needle1, c->needle2, (const char *)NULL);
    }
    /* length-field errors */
    assert_int_equal(dw_test_write(path, "", 0), 0);
    expect_bad(ctx, path, "empty file", "0 bytes, shorter than the 8-byte", (const char *)NULL);
    assert_int_equal(dw_test_write(path, "\x02\0\0\0\0\0\0", 7), 0);
    expect_bad(ctx, path, "7 bytes", "7 bytes, shorter", (const char *)NULL);
    craft(path, 100, "{}", 0);
    expect_bad(ctx, path, "header past the end", "header length 100 runs past the end of the 10-byte file", (const char *)NULL);
    craft(path, (uint64_t)1 << 40, "{}", 0);
    expect_bad(ctx, path, "absurd header", "1099511627776 exceeds", (const char *)NULL);
    craft(path, UINT64_MAX, "{}", 0);
    expect_bad(ctx, path, "header length 2^64-1", "exceeds", (const char *)NULL);
    craft(path, 0, "", 0);
    expect_bad(ctx, path, "zero header", "does not start with '{'", (const char *)NULL);
    /* header length shorter than the JSON: truncated JSON */
    craft(path, 5, "{\"a\":{}}", 0);
    expect_bad(ctx, path, "short header length", "invalid JSON", (const char *)NULL);

    /* valid edge cases: empty file body, padding, scalars and zero-size tensors */
    dw_st_file *f = NULL;
    craft(path, 2, "{}", 0);
    assert_int_equal(dw_st_open(ctx, path, &f), DW_OK);
    assert_int_equal(dw_st_count(f), 0);
    assert_int_equal(dw_st_metadata_count(f), 0);
    dw_st_close(f);
    const char *ok = "{\"__metadata__\":{\"format\":\"pt\"},\"z\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[4,4]},"
                     "\"s\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                     "\"e\":{\"dtype\":\"BF16\",\"shape\":[0],\"data_offsets\":[0,0]}}   \n\t ";
    craft(path, strlen(ok), ok, 4);
    assert_int_equal(dw_st_open(ctx, path, &f), DW_OK);
    assert_int_equal(dw_st_count(f), 3);
    assert_string_equal(dw_st_get(f, 0)->name, "e"); /* offset order: (0,0), (0,4), (4,4) */
    assert_string_equal(dw_st_get(f, 1)->name, "s");
    assert_string_equal(dw_st_get(f, 2)->name, "z");
    assert_int_equal(dw_st_get(f, 1)->ndim, 0);
    assert_int_equal(dw_st_numel(dw_st_get(f, 1)), 1);
    assert_int_equal(dw_st_numel(dw_st_get(f, 2)), 0);
    assert_string_equal(dw_st_metadata(f, "format"), "pt");
    dw_st_close(f);

    /* I/O errors name the file */
    char *missing = dw_test_path(dir, "missing.safetensors");
    f = (dw_st_file *)1;
    assert_int_equal(dw_st_open(ctx, missing, &f), DW_ERR_IO);
    assert_null(f);
    assert_non_null(strstr(dw_errmsg(ctx), missing));
    assert_int_equal(dw_st_open(ctx, dir, &f), DW_ERR_INVALID); /* a directory is bad input, refused before open */
    assert_non_null(strstr(dw_errmsg(ctx), "not a regular file"));
    free(missing);
    free(path);
    dw_test_rmtree(dir);
    free(dir);
    dw_ctx_free(ctx);
}

/* ---- alignment and FP32 conversion ---------------------------------------------------------- */

static float half_oracle(uint16_t h) {
#ifdef __FLT16_MAX__
    __extension__ _Float16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#else
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? m * pow(2, -24) : e == 31 ? (m ? NAN : INFINITY) : (1 + m / 1024.0) * pow(2, e - 15);
    return (float)((h & 0x8000) ? -v : v);
#endif
}

static void test_unaligned_and_f32(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 0xa11);
    /* A file from another writer: even header length not a multiple of 8 and a 1-byte tensor
     * first, so every wider tensor after it starts at an odd address. */
    enum { NH = 65536 };
    char hdr[512];
    size_t off16 = 1, off_bf = off16 + 2 * NH, off32 = off_bf + 2 * 64, off64 = off32 + 4 * 5, end = off64 + 8 * 3;
    snprintf(hdr, sizeof hdr,
             "{\"u\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
             "\"h\":{\"dtype\":\"F16\",\"shape\":[%d],\"data_offsets\":[%zu,%zu]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[8,8],\"data_offsets\":[%zu,%zu]},"
             "\"f\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[%zu,%zu]},"
             "\"d\":{\"dtype\":\"F64\",\"shape\":[3],\"data_offsets\":[%zu,%zu]}}",
             NH, off16, off_bf, off_bf, off32, off32, off64, off64, end);
    size_t hlen = (strlen(hdr) + 1) & ~(size_t)1;
    if (hlen % 8 == 0) hlen += 2;
    unsigned char *buf = malloc(8 + hlen + end + 8);
    uint64_t h64 = hlen;
    memcpy(buf, &h64, 8);
    memset(buf + 8, ' ', hlen);
    memcpy(buf + 8, hdr, strlen(hdr));
    unsigned char *data = buf + 8 + hlen;
    data[0] = 0x5a;
    for (int i = 0; i < NH; i++) memcpy(data + off16 + 2 * i, &(uint16_t){(uint16_t)i}, 2);
    uint16_t bf[64];
    for (int i = 0; i < 64; i++) bf[i] = (uint16_t)dw_test_next(&r);
    memcpy(data + off_bf, bf, sizeof bf);
    float f32[5];
    for (int i = 0; i < 5; i++) f32[i] = dw_test_normal(&r);
    memcpy(data + off32, f32, sizeof f32);
    double f64[3] = {dw_test_normal(&r), 1e300, -0.1};
    memcpy(data + off64, f64, sizeof f64);

    dw_st_file *f = NULL;
    assert_int_equal(dw_st_open_memory(ctx, buf, 8 + hlen + end, "crafted", &f), DW_OK);
    const dw_st_tensor *th = dw_st_find(f, "h"), *tb = dw_st_find(f, "b"), *tf = dw_st_find(f, "f"),
                       *td = dw_st_find(f, "d"), *tu = dw_st_find(f, "u");
    assert_true(((uintptr_t)buf & 7) == 0);
    assert_false(dw_st_is_aligned(th)); /* 8 + even + 1: odd address */
    assert_false(dw_st_is_aligned(tf));
    assert_true(dw_st_is_aligned(tu));
    float *out = malloc(NH * sizeof *out);
    assert_int_equal(dw_st_read_f32(ctx, f, th, out), DW_OK);
    for (int i = 0; i < NH; i++) {
        float want = half_oracle((uint16_t)i);
        if (isnan(want)) assert_true(isnan(out[i]));
        else assert_memory_equal(&out[i], &want, 4);
    }
    assert_int_equal(dw_st_read_f32(ctx, f, tb, out), DW_OK);
    for (int i = 0; i < 64; i++) {
        uint32_t bits;
        memcpy(&bits, &out[i], 4);
        assert_int_equal(bits, (uint32_t)bf[i] << 16);
    }
    assert_int_equal(dw_st_read_f32(ctx, f, tf, out), DW_OK);
    assert_memory_equal(out, f32, sizeof f32);
    assert_int_equal(dw_st_read_f32(ctx, f, td, out), DW_OK);
    for (int i = 0; i < 3; i++) assert_true(out[i] == (float)f64[i]);
    assert_int_equal(dw_st_read_f32(ctx, f, tu, out), DW_ERR_UNSUPPORTED);
    assert_non_null(strstr(dw_errmsg(ctx), "crafted: tensor 'u'"));
    dw_st_close(f);
    free(out);
    free(buf);
    dw_ctx_free(ctx);
}

/* ---- random corruption: never crash, errors name the file; accepted files are consistent -- */

static void test_random_corruption(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    dw_test_rng r;
    dw_test_rng_init(&r, dw_test_seed() ^ 0xc0ffee);
    dw_st_writer *w = NULL;
    assert_int_equal(dw_st_writer_create(ctx, &w), DW_OK);
    ref_tensor ref[6];
    for (int i = 0; i < 6; i++) {
        random_tensor(&r, &ref[i], i);
        assert_int_equal(dw_st_writer_add(ctx, w, ref[i].name, ref[i].dtype, ref[i].ndim, ref[i].shape,
                                          ref[i].data, ref[i].nbytes), DW_OK);
    }
    assert_int_equal(dw_st_writer_set_metadata(ctx, w, "format", "pt"), DW_OK);
    void *good = NULL;
    size_t len = 0;
    assert_int_equal(dw_st_writer_serialize(ctx, w, &good, &len), DW_OK);
    dw_st_writer_free(w);
    uint64_t hlen;
    memcpy(&hlen, good, 8);
    unsigned char *buf = malloc(len);
    int accepted = 0;
    static const char alphabet[] = "{}[]\",:0123456789-.e \\u_aFUIB8E";
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, good, len);
        int nflip = 1 + (int)(dw_test_next(&r) % 4);
        for (int k = 0; k < nflip; k++) {
            size_t at = (size_t)(dw_test_next(&r) % (8 + hlen));
            buf[at] = (dw_test_next(&r) & 1) ? (unsigned char)alphabet[dw_test_next(&r) % (sizeof alphabet - 1)]
                                              : (unsigned char)dw_test_next(&r);
        }
        size_t cut = (dw_test_next(&r) % 8 == 0) ? (size_t)(dw_test_next(&r) % (len + 1)) : len;
        dw_st_file *f = NULL;
        dw_status s = dw_st_open_memory(ctx, buf, cut, "fuzzed", &f);
        if (s == DW_OK) {
            accepted++;
            size_t total = 0;
            for (int i = 0; i < dw_st_count(f); i++) {
                const dw_st_tensor *t = dw_st_get(f, i);
                assert_true((const unsigned char *)t->data >= buf &&
                            (const unsigned char *)t->data + t->nbytes <= buf + cut);
                assert_int_equal(dw_st_numel(t) * (int64_t)dw_dtype_size(t->dtype), (int64_t)t->nbytes);
                assert_ptr_equal(dw_st_find(f, t->name), t);
                total += t->nbytes;
            }
            uint64_t h2;
            memcpy(&h2, buf, 8);
            assert_int_equal(total, cut - 8 - h2);
            dw_st_close(f);
        } else {
            assert_int_equal(s, DW_ERR_FORMAT);
            assert_null(f);
            assert_true(strncmp(dw_errmsg(ctx), "fuzzed: ", 8) == 0);
        }
    }
    print_message("corruption: %d of 3000 mutated files accepted\n", accepted);
    free(buf);
    free(good);
    for (int i = 0; i < 6; i++) free(ref[i].data);
    dw_ctx_free(ctx);
}

/* ---- writer errors and atomicity ---------------------------------------------------------- */

static void test_writer_rejects(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    dw_st_writer *w = NULL;
    assert_int_equal(dw_st_writer_create(ctx, &w), DW_OK);
    int64_t shape[2] = {2, 3};
    float x[6] = {0};
    assert_int_equal(dw_st_writer_add(ctx, w, "a", DW_DT_F32, 2, shape, x, sizeof x), DW_OK);
    assert_int_equal(dw_st_writer_add(ctx, w, "a", DW_DT_F32, 2, shape, x, sizeof x), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "'a' added twice"));
    assert_int_equal(dw_st_writer_add(ctx, w, "b", DW_DT_F32, 2, shape, x, 20), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(ctx), "'b'"));
    assert_int_equal(dw_st_writer_add(ctx, w, "", DW_DT_F32, 2, shape, x, sizeof x), DW_ERR_INVALID);
    assert_int_equal(dw_st_writer_add(ctx, w, "__metadata__", DW_DT_F32, 2, shape, x, sizeof x), DW_ERR_INVALID);
    assert_int_equal(dw_st_writer_add(ctx, w, "caf\xc3\xa9", DW_DT_F32, 2, shape, x, sizeof x), DW_ERR_INVALID);
    int64_t neg[2] = {2, -3};
    assert_int_equal(dw_st_writer_add(ctx, w, "c", DW_DT_F32, 2, neg, x, sizeof x), DW_ERR_INVALID);
    assert_int_equal(dw_st_writer_add(ctx, w, "c", DW_DT_F32, 9, shape, x, sizeof x), DW_ERR_INVALID);
    assert_int_equal(dw_st_writer_add(ctx, w, "c", DW_DT_COUNT, 2, shape, x, sizeof x), DW_ERR_INVALID);
    assert_int_equal(dw_st_writer_set_metadata(ctx, w, "k", "bad\xff"), DW_ERR_INVALID);
    assert_int_equal(dw_st_writer_set_metadata(ctx, w, "k", "v1"), DW_OK);
    assert_int_equal(dw_st_writer_set_metadata(ctx, w, "k", "v2"), DW_OK); /* last one wins */
    void *mem;
    size_t len;
    assert_int_equal(dw_st_writer_serialize(ctx, w, &mem, &len), DW_OK);
    dw_st_file *f;
    assert_int_equal(dw_st_open_memory(ctx, mem, len, "w", &f), DW_OK);
    assert_int_equal(dw_st_count(f), 1);
    assert_string_equal(dw_st_metadata(f, "k"), "v2");
    dw_st_close(f);
    free(mem);
    dw_st_writer_free(w);
    dw_st_writer_free(NULL);
    dw_st_close(NULL);
    dw_ctx_free(ctx);
}

static void test_failed_commit_leaves_nothing(void **state) {
    (void)state;
    dw_ctx *ctx = new_ctx();
    char *dir = dw_test_tmpdir();
    char *path = dw_test_path(dir, "out.safetensors");
    enum { N = 1 << 16 };
    unsigned char *big = calloc(N, 1);
    int64_t shape[1] = {N};
    dw_st_writer *w = NULL;
    assert_int_equal(dw_st_writer_create(ctx, &w), DW_OK);
    assert_int_equal(dw_st_writer_add(ctx, w, "big", DW_DT_U8, 1, shape, big, N), DW_OK);

    /* 1. the disk "fills up" mid-write (file size limit): no file, no temporary */
    struct rlimit old, lim;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 4096;
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    dw_status s = dw_st_writer_commit(ctx, w, path);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(s, DW_ERR_IO);
    assert_non_null(strstr(dw_errmsg(ctx), path));
    assert_int_equal(count_entries(dir), 0);

    /* 2. same with an existing file: it keeps its old content */
    assert_int_equal(dw_test_write(path, "old", 3), 0);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
    signal(SIGXFSZ, SIG_IGN);
    s = dw_st_writer_commit(ctx, w, path);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    assert_int_equal(s, DW_ERR_IO);
    assert_int_equal(count_entries(dir), 1);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 3);

    /* 3. the rename fails (a directory is in the way): the temporary is removed */
    char *sub = dw_test_path(dir, "sub");
    assert_int_equal(mkdir(sub, 0755), 0);
    char *inner = dw_test_path(sub, "x");
    assert_int_equal(mkdir(inner, 0755), 0);
    assert_int_not_equal(dw_st_writer_commit(ctx, w, inner), DW_OK);
    assert_int_equal(count_entries(sub), 1);
    /* 4. a directory that does not exist */
    char *nodir = dw_test_path(dir, "nope/out.safetensors");
    assert_int_equal(dw_st_writer_commit(ctx, w, nodir), DW_ERR_IO);
    assert_non_null(strstr(dw_errmsg(ctx), nodir));
    assert_int_equal(count_entries(dir), 2);

    /* and without the limit it works, replacing the old file */
    assert_int_equal(dw_st_writer_commit(ctx, w, path), DW_OK);
    assert_int_equal(stat(path, &st), 0);
    assert_true(st.st_size > N);
    assert_int_equal(count_entries(dir), 2);
    dw_st_writer_free(w);
    free(big);
    free(nodir);
    free(inner);
    free(sub);
    free(path);
    dw_test_rmtree(dir);
    free(dir);
    dw_ctx_free(ctx);
}

int main(void) {
    dw_test_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dtype_table),
        cmocka_unit_test(test_round_trip_random),
        cmocka_unit_test(test_validation_errors),
        cmocka_unit_test(test_unaligned_and_f32),
        cmocka_unit_test(test_random_corruption),
        cmocka_unit_test(test_writer_rejects),
        cmocka_unit_test(test_failed_commit_leaves_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
