/* safetensors_write.c — the safetensors writer: collects tensors (borrowing their data) and
 * metadata, then writes header + data to a temporary file, fsyncs and renames (core/fileio.h).
 * Layout it produces: tensors ordered by decreasing element size (add order within a size), so
 * every tensor starts at a multiple of its element size; the JSON header ("__metadata__" first,
 * then the tensors in offset order) is padded with spaces so the data starts at a multiple of 8. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "io/safetensors.h"
#include "io/safetensors_priv.h"

typedef struct {
    char *name;
    dw_dtype dtype;
    int ndim;
    int64_t shape[DW_ST_MAX_DIMS];
    const void *data; /* borrowed until commit */
    size_t nbytes;
    int order;        /* position in add order */
} wtensor;

struct dw_st_writer {
    wtensor *t;
    int n, cap;
    json_t *names; /* set of names added (values unused): duplicate detection */
    json_t *meta;  /* string -> string */
};

dw_status dw_st_writer_create(dw_ctx *ctx, dw_st_writer **out) {
    *out = NULL;
    dw_st_writer *w = calloc(1, sizeof *w);
    if (!w || !(w->names = json_object()) || !(w->meta = json_object())) {
        dw_st_writer_free(w);
        return dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
    }
    *out = w;
    return DW_OK;
}

void dw_st_writer_free(dw_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    json_decref(w->names);
    json_decref(w->meta);
    free(w);
}

dw_status dw_st_writer_add(dw_ctx *ctx, dw_st_writer *w, const char *name, dw_dtype dtype, int ndim,
                           const int64_t *shape, const void *data, size_t nbytes) {
    const char *why = NULL;
    if (!name || !dw_st_name_ok(name, strlen(name), &why)) {
        char sb[DW_ST_SHOWN_NAME + 8];
        return dw_set_error(ctx, DW_ERR_INVALID, "safetensors writer: tensor '%s': %s",
                            name ? dw_st_show_name(sb, sizeof sb, name, strlen(name)) : "(null)",
                            name ? why : "no name");
    }
    if ((int)dtype < 0 || dtype >= DW_DT_COUNT)
        return dw_set_error(ctx, DW_ERR_INVALID, "safetensors writer: tensor '%s': invalid dtype %d",
                            name, (int)dtype);
    if (ndim < 0 || ndim > DW_ST_MAX_DIMS)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "safetensors writer: tensor '%s': %d dimensions, at most %d supported", name,
                            ndim, DW_ST_MAX_DIMS);
    uint64_t numel = 1, nonzero = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "safetensors writer: tensor '%s': negative dimension %lld", name,
                                (long long)shape[d]);
        if (shape[d] != 0 && (__builtin_mul_overflow(nonzero, (uint64_t)shape[d], &nonzero) ||
                              nonzero > (uint64_t)INT64_MAX))
            return dw_set_error(ctx, DW_ERR_INVALID,
                                "safetensors writer: tensor '%s': shape overflows 64 bits", name);
        numel = shape[d] == 0 ? 0 : numel * (uint64_t)shape[d];
    }
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)dw_dtype_size(dtype), &want) || want != nbytes)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "safetensors writer: tensor '%s': %zu bytes given, shape x %s needs %llu",
                            name, nbytes, dw_dtype_name(dtype), (unsigned long long)want);
    if (nbytes > 0 && !data)
        return dw_set_error(ctx, DW_ERR_INVALID, "safetensors writer: tensor '%s': no data", name);
    if (json_object_get(w->names, name))
        return dw_set_error(ctx, DW_ERR_INVALID, "safetensors writer: tensor '%s' added twice", name);
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 16;
        wtensor *nt = realloc(w->t, (size_t)cap * sizeof *nt);
        if (!nt) return dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
        w->t = nt;
        w->cap = cap;
    }
    wtensor *t = &w->t[w->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name)) || json_object_set_new(w->names, name, json_true()) != 0) {
        free(t->name);
        return dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
    }
    t->dtype = dtype;
    t->ndim = ndim;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d];
    t->data = data;
    t->nbytes = nbytes;
    t->order = w->n++;
    return DW_OK;
}

dw_status dw_st_writer_set_metadata(dw_ctx *ctx, dw_st_writer *w, const char *key, const char *value) {
    json_t *v = value ? json_string(value) : NULL; /* NULL when not valid UTF-8 */
    if (!key || !v || json_object_set_new(w->meta, key, v) != 0)
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "safetensors writer: metadata '%s': key and value must be UTF-8 strings",
                            key ? key : "(null)");
    return DW_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Decreasing element size, then add order: keeps every tensor aligned to its element size. */
static int cmp_layout(const void *a, const void *b) {
    const wtensor *x = *(const wtensor *const *)a, *y = *(const wtensor *const *)b;
    size_t sx = dw_dtype_size(x->dtype), sy = dw_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return x->order - y->order;
}

/* Lays the tensors out and renders the padded header. *order_out: [n] tensors in file order. */
static dw_status build_header(dw_ctx *ctx, dw_st_writer *w, wtensor ***order_out, char **hdr_out,
                              size_t *hlen_out, uint64_t *data_size_out) {
    *order_out = NULL;
    *hdr_out = NULL;
    wtensor **order = calloc((size_t)w->n + 1, sizeof *order);
    json_t *root = json_object();
    char *text = NULL;
    dw_status s = DW_OK;
    if (!order || !root) {
        s = dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
        goto done;
    }
    for (int i = 0; i < w->n; i++) order[i] = &w->t[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_layout);
    if (json_object_size(w->meta) > 0) {
        /* keys sorted so the bytes do not depend on the order set_metadata was called in */
        json_t *m = json_object();
        size_t nk = json_object_size(w->meta), k = 0;
        const char **keys = calloc(nk, sizeof *keys);
        const char *key;
        json_t *v;
        if (!m || !keys) {
            json_decref(m);
            free(keys);
            s = dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
            goto done;
        }
        json_object_foreach(w->meta, key, v) keys[k++] = key;
        qsort(keys, nk, sizeof *keys, cmp_str);
        for (k = 0; k < nk; k++) json_object_set(m, keys[k], json_object_get(w->meta, keys[k]));
        free(keys);
        json_object_set_new(root, "__metadata__", m);
    }
    uint64_t at = 0;
    for (int i = 0; i < w->n; i++) {
        const wtensor *t = order[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_t *e = json_pack("{s:s, s:o, s:[I, I]}", "dtype", dw_dtype_name(t->dtype), "shape",
                              shape, "data_offsets", (json_int_t)at, (json_int_t)(at + t->nbytes));
        if (!e || json_object_set_new(root, t->name, e) != 0) {
            s = dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
            goto done;
        }
        at += t->nbytes;
    }
    text = json_dumps(root, JSON_COMPACT);
    if (!text) {
        s = dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
        goto done;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    if (padded > DW_ST_MAX_HEADER) {
        s = dw_set_error(ctx, DW_ERR_INVALID,
                         "safetensors writer: header of %zu bytes exceeds the %llu-byte limit", padded,
                         (unsigned long long)DW_ST_MAX_HEADER);
        goto done;
    }
    char *hdr = malloc(8 + padded);
    if (!hdr) {
        s = dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
        goto done;
    }
    uint64_t n64 = padded;
    memcpy(hdr, &n64, 8); /* little-endian host (checked in safetensors_read.c) */
    memcpy(hdr + 8, text, len);
    memset(hdr + 8 + len, ' ', padded - len);
    *hdr_out = hdr;
    *hlen_out = 8 + padded;
    *data_size_out = at;
    *order_out = order;
    order = NULL;
done:
    free(text);
    free(order);
    json_decref(root);
    return s;
}

dw_status dw_st_writer_commit(dw_ctx *ctx, dw_st_writer *w, const char *path) {
    wtensor **order;
    char *hdr;
    size_t hlen;
    uint64_t data_size;
    dw_status s = build_header(ctx, w, &order, &hdr, &hlen, &data_size);
    if (s != DW_OK) return dw_prefix_error(ctx, s, "%s", path);
    dw_atomic_file af;
    s = dw_atomic_open(ctx, &af, path);
    if (s == DW_OK) {
        s = dw_atomic_write(ctx, &af, hdr, hlen);
        for (int i = 0; i < w->n && s == DW_OK; i++)
            if (order[i]->nbytes > 0) s = dw_atomic_write(ctx, &af, order[i]->data, order[i]->nbytes);
        if (s == DW_OK) s = dw_atomic_commit(ctx, &af); /* cleans up the temporary on failure */
        else dw_atomic_abort(&af);
    }
    free(order);
    free(hdr);
    return s;
}

dw_status dw_st_writer_serialize(dw_ctx *ctx, dw_st_writer *w, void **buf_out, size_t *len_out) {
    *buf_out = NULL;
    *len_out = 0;
    wtensor **order;
    char *hdr;
    size_t hlen;
    uint64_t data_size;
    DW_TRY(build_header(ctx, w, &order, &hdr, &hlen, &data_size));
    unsigned char *buf = realloc(hdr, hlen + (size_t)data_size + 1);
    if (!buf) {
        free(hdr);
        free(order);
        return dw_set_error(ctx, DW_ERR_NOMEM, "safetensors writer: out of memory");
    }
    size_t at = hlen;
    for (int i = 0; i < w->n; i++) {
        if (order[i]->nbytes > 0) memcpy(buf + at, order[i]->data, order[i]->nbytes);
        at += order[i]->nbytes;
    }
    free(order);
    *buf_out = buf;
    *len_out = at;
    return DW_OK;
}
