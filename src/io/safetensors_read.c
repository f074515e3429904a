/* safetensors_read.c — the safetensors reader: maps the file read-only (tensor data stays in the
 * mapping, zero-copy) and validates the whole header against hostile input before handing out
 * anything. Format: u64 little-endian header length N, N bytes of JSON, then the byte buffer.
 * Not the writer (safetensors_write.c) nor the dtype table (safetensors_dtype.c). */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "io/safetensors.h"
#include "io/safetensors_priv.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors is little-endian");

struct dw_st_file {
    char *path;
    const unsigned char *base; /* the whole file: mapping or borrowed buffer */
    size_t size;
    bool mapped;
    json_t *root;       /* names and metadata strings point into it */
    int n;
    dw_st_tensor *t;    /* [n], sorted by data offset */
    dw_st_tensor **by_name; /* [n] pointers into t, sorted by name */
    int n_meta;
    const char **meta;  /* [2 * n_meta]: key, value pairs sorted by key */
};

/* "PATH: tensor 'NAME': MSG" (tensor == NULL: "PATH: MSG"). */
static dw_status bad(dw_ctx *ctx, const dw_st_file *f, const char *tensor, const char *msg) {
    if (tensor) return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': %s", f->path, tensor, msg);
    return dw_set_error(ctx, DW_ERR_FORMAT, "%s: %s", f->path, msg);
}

/* A non-negative JSON integer no larger than `max`. */
static bool get_uint(const json_t *v, uint64_t max, uint64_t *out) {
    if (!json_is_integer(v)) return false;
    json_int_t i = json_integer_value(v);
    if (i < 0 || (uint64_t)i > max) return false;
    *out = (uint64_t)i;
    return true;
}

static dw_status parse_shape(dw_ctx *ctx, const dw_st_file *f, const char *tn, const json_t *v,
                             dw_st_tensor *t, uint64_t *numel) {
    if (!json_is_array(v))
        return bad(ctx, f, tn, "field 'shape': expected an array of non-negative integers");
    size_t nd = json_array_size(v);
    if (nd > DW_ST_MAX_DIMS) {
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': field 'shape': %zu dimensions, at most %d supported",
                            f->path, tn, nd, DW_ST_MAX_DIMS);
    }
    t->ndim = (int)nd;
    /* The product of the non-zero dimensions must fit in 63 bits, so that callers can multiply
     * any subset of the dimensions in int64 without overflow. */
    uint64_t prod = 1, nonzero = 1;
    for (size_t d = 0; d < nd; d++) {
        uint64_t dim;
        if (!get_uint(json_array_get(v, d), (uint64_t)INT64_MAX, &dim))
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: tensor '%s': field 'shape': dimension %zu is not a non-negative integer",
                                f->path, tn, d);
        t->shape[d] = (int64_t)dim;
        if (dim != 0 && __builtin_mul_overflow(nonzero, dim, &nonzero))
            nonzero = UINT64_MAX;
        if (nonzero > (uint64_t)INT64_MAX)
            return bad(ctx, f, tn, "field 'shape': the product of the dimensions overflows 64 bits");
        prod = dim == 0 ? 0 : prod * dim; /* prod <= nonzero: no overflow */
    }
    *numel = prod;
    return DW_OK;
}

static dw_status parse_tensor(dw_ctx *ctx, const dw_st_file *f, const char *key, size_t klen,
                              const json_t *v, uint64_t data_size, dw_st_tensor *t, uint64_t *begin) {
    char tn_buf[DW_ST_SHOWN_NAME + 8];
    const char *tn = dw_st_show_name(tn_buf, sizeof tn_buf, key, klen);
    const char *why = NULL;
    if (!dw_st_name_ok(key, klen, &why))
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': %s", f->path, tn, why);
    if (!json_is_object(v)) return bad(ctx, f, tn, "entry is not a JSON object");
    const char *fk;
    size_t fklen;
    json_t *fv;
    json_object_keylen_foreach((json_t *)v, fk, fklen, fv) {
        if (strcmp(fk, "dtype") && strcmp(fk, "shape") && strcmp(fk, "data_offsets")) {
            char sb[DW_ST_SHOWN_NAME + 8];
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: tensor '%s': unknown field '%s' (expected dtype, shape, data_offsets)",
                                f->path, tn, dw_st_show_name(sb, sizeof sb, fk, fklen));
        }
    }
    const json_t *dt = json_object_get(v, "dtype");
    const json_t *sh = json_object_get(v, "shape");
    const json_t *off = json_object_get(v, "data_offsets");
    if (!dt) return bad(ctx, f, tn, "missing field 'dtype'");
    if (!sh) return bad(ctx, f, tn, "missing field 'shape'");
    if (!off) return bad(ctx, f, tn, "missing field 'data_offsets'");
    if (!json_is_string(dt)) return bad(ctx, f, tn, "field 'dtype': expected a string");
    if (!dw_dtype_parse(json_string_value(dt), &t->dtype)) {
        char sb[64];
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: tensor '%s': field 'dtype': unknown dtype '%s'",
                            f->path, tn,
                            dw_st_show_name(sb, sizeof sb, json_string_value(dt), json_string_length(dt)));
    }
    uint64_t numel = 0;
    DW_TRY(parse_shape(ctx, f, tn, sh, t, &numel));
    uint64_t b, e;
    if (!json_is_array(off) || json_array_size(off) != 2)
        return bad(ctx, f, tn, "field 'data_offsets': expected [begin, end]");
    if (!get_uint(json_array_get(off, 0), UINT64_MAX, &b) ||
        !get_uint(json_array_get(off, 1), UINT64_MAX, &e))
        return bad(ctx, f, tn, "field 'data_offsets': expected two non-negative integers");
    if (b > e)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: tensor '%s': field 'data_offsets': begin %llu is after end %llu",
                            f->path, tn, (unsigned long long)b, (unsigned long long)e);
    if (e > data_size)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: tensor '%s': field 'data_offsets': end %llu is beyond the %llu-byte data buffer",
                            f->path, tn, (unsigned long long)e, (unsigned long long)data_size);
    uint64_t want;
    if (__builtin_mul_overflow(numel, (uint64_t)dw_dtype_size(t->dtype), &want) || want != e - b)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: tensor '%s': shape x dtype %s needs %llu elements x %zu bytes, but "
                            "data_offsets [%llu, %llu] hold %llu bytes",
                            f->path, tn, dw_dtype_name(t->dtype), (unsigned long long)numel,
                            dw_dtype_size(t->dtype), (unsigned long long)b, (unsigned long long)e,
                            (unsigned long long)(e - b));
    t->name = key;
    t->nbytes = (size_t)(e - b);
    *begin = b;
    return DW_OK;
}

static dw_status parse_metadata(dw_ctx *ctx, dw_st_file *f, json_t *v) {
    if (!json_is_object(v))
        return bad(ctx, f, NULL, "'__metadata__' is not an object of strings");
    size_t n = json_object_size(v);
    f->meta = calloc(2 * n + 1, sizeof *f->meta);
    if (!f->meta) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", f->path);
    const char *k;
    size_t klen;
    json_t *mv;
    json_object_keylen_foreach(v, k, klen, mv) {
        char sb[DW_ST_SHOWN_NAME + 8];
        if (!json_is_string(mv))
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: '__metadata__': field '%s': expected a string value",
                                f->path, dw_st_show_name(sb, sizeof sb, k, klen));
        f->meta[2 * f->n_meta] = k;
        f->meta[2 * f->n_meta + 1] = json_string_value(mv);
        f->n_meta++;
    }
    return DW_OK;
}

/* qsort comparators: tensors by (begin, end, name); name indices; metadata pairs by key. */
typedef struct {
    uint64_t begin;
    dw_st_tensor t;
} placed;

static int cmp_placed(const void *a, const void *b) {
    const placed *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->t.nbytes != y->t.nbytes) return x->t.nbytes < y->t.nbytes ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

static int cmp_by_name(const void *a, const void *b) {
    return strcmp((*(dw_st_tensor *const *)a)->name, (*(dw_st_tensor *const *)b)->name);
}

static int cmp_meta(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static dw_status parse(dw_ctx *ctx, dw_st_file *f) {
    if (f->size < 8)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: file is %zu bytes, shorter than the 8-byte header length", f->path,
                            f->size);
    uint64_t hlen;
    memcpy(&hlen, f->base, 8);
    if (hlen > DW_ST_MAX_HEADER)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: header length %llu exceeds the %llu-byte limit (not a safetensors file?)",
                            f->path, (unsigned long long)hlen, (unsigned long long)DW_ST_MAX_HEADER);
    if (hlen > f->size - 8)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: header length %llu runs past the end of the %zu-byte file", f->path,
                            (unsigned long long)hlen, f->size);
    if (hlen == 0 || f->base[8] != '{')
        return bad(ctx, f, NULL, "header does not start with '{' (not a safetensors file?)");
    json_error_t je;
    f->root = json_loadb((const char *)f->base + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &je);
    if (!f->root)
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: header:%d:%d: invalid JSON: %s", f->path,
                            je.line, je.column, je.text);
    if (!json_is_object(f->root)) return bad(ctx, f, NULL, "header is not a JSON object");
    uint64_t data_size = f->size - 8 - hlen;

    size_t nkeys = json_object_size(f->root);
    placed *pl = calloc(nkeys + 1, sizeof *pl);
    if (!pl) return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", f->path);
    dw_status s = DW_OK;
    int n = 0;
    const char *key;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(f->root, key, klen, v) {
        if (klen == 12 && !memcmp(key, "__metadata__", 12)) s = parse_metadata(ctx, f, v);
        else if ((s = parse_tensor(ctx, f, key, klen, v, data_size, &pl[n].t, &pl[n].begin)) == DW_OK) n++;
        if (s != DW_OK) break;
    }
    if (s == DW_OK) {
        /* The tensors must tile the byte buffer exactly: sorted by offset, each begins where the
         * previous ended, the first at 0 and the last at the buffer's end (no overlap, no hole,
         * no trailing bytes). */
        qsort(pl, (size_t)n, sizeof *pl, cmp_placed);
        uint64_t at = 0;
        for (int i = 0; i < n && s == DW_OK; i++) {
            char msg[160];
            if (pl[i].begin < at) {
                snprintf(msg, sizeof msg, "data_offsets [%llu, %llu] overlap the previous tensor's bytes (which end at %llu)",
                         (unsigned long long)pl[i].begin, (unsigned long long)(pl[i].begin + pl[i].t.nbytes),
                         (unsigned long long)at);
                s = bad(ctx, f, pl[i].t.name, msg);
            } else if (pl[i].begin > at) {
                snprintf(msg, sizeof msg, "data_offsets begin at %llu, leaving bytes [%llu, %llu) of the data buffer unused",
                         (unsigned long long)pl[i].begin, (unsigned long long)at, (unsigned long long)pl[i].begin);
                s = bad(ctx, f, pl[i].t.name, msg);
            }
            at = pl[i].begin + pl[i].t.nbytes;
        }
        if (s == DW_OK && at != data_size)
            s = dw_set_error(ctx, DW_ERR_FORMAT,
                             "%s: the tensors cover %llu bytes but the data buffer holds %llu (trailing bytes)",
                             f->path, (unsigned long long)at, (unsigned long long)data_size);
    }
    if (s == DW_OK) {
        f->n = n;
        f->t = calloc((size_t)n + 1, sizeof *f->t);
        f->by_name = calloc((size_t)n + 1, sizeof *f->by_name);
        if (!f->t || !f->by_name) s = dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", f->path);
    }
    if (s == DW_OK) {
        const unsigned char *data = f->base + 8 + hlen;
        for (int i = 0; i < n; i++) {
            f->t[i] = pl[i].t;
            f->t[i].data = data + pl[i].begin;
            f->by_name[i] = &f->t[i];
        }
        qsort(f->by_name, (size_t)n, sizeof *f->by_name, cmp_by_name);
        if (f->n_meta > 0) qsort(f->meta, (size_t)f->n_meta, 2 * sizeof *f->meta, cmp_meta);
    }
    free(pl);
    return s;
}

static dw_status finish_open(dw_ctx *ctx, dw_st_file *f, dw_st_file **out) {
    dw_status s = parse(ctx, f);
    if (s != DW_OK) {
        dw_st_close(f);
        return s;
    }
    *out = f;
    return DW_OK;
}

dw_status dw_st_open_memory(dw_ctx *ctx, const void *buf, size_t len, const char *name,
                            dw_st_file **out) {
    *out = NULL;
    dw_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(name ? name : "<memory>"))) {
        free(f);
        return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", name ? name : "<memory>");
    }
    f->base = buf;
    f->size = len;
    return finish_open(ctx, f, out);
}

dw_status dw_st_open(dw_ctx *ctx, const char *path, dw_st_file **out) {
    *out = NULL;
    int fd;
    size_t size;
    DW_TRY(dw_open_regular(ctx, path, &fd, &size)); /* a FIFO or device refused by name, never waited on */
    dw_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        close(fd);
        return dw_set_error(ctx, DW_ERR_NOMEM, "%s: out of memory", path);
    }
    f->size = size;
    if (f->size > 0) { /* mmap of length 0 fails; parse() reports the short file */
        void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            dw_status s = dw_set_error(ctx, DW_ERR_IO, "%s: cannot map %zu bytes: %s", path,
                                       f->size, strerror(errno));
            close(fd);
            dw_st_close(f);
            return s;
        }
        f->base = m;
        f->mapped = true;
    }
    close(fd); /* the mapping keeps the file referenced */
    return finish_open(ctx, f, out);
}

void dw_st_close(dw_st_file *f) {
    if (!f) return;
    if (f->mapped) munmap((void *)f->base, f->size);
    json_decref(f->root);
    free(f->t);
    free(f->by_name);
    free(f->meta);
    free(f->path);
    free(f);
}

const char *dw_st_path(const dw_st_file *f) { return f->path; }
int dw_st_count(const dw_st_file *f) { return f->n; }

const dw_st_tensor *dw_st_get(const dw_st_file *f, int i) {
    DW_ASSERT(i >= 0 && i < f->n);
    return &f->t[i];
}

const dw_st_tensor *dw_st_find(const dw_st_file *f, const char *name) {
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const dw_st_tensor *t = f->by_name[mid];
        int c = strcmp(name, t->name);
        if (c == 0) return t;
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return NULL;
}

const char *dw_st_metadata(const dw_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (!strcmp(f->meta[2 * i], key)) return f->meta[2 * i + 1];
    return NULL;
}

int dw_st_metadata_count(const dw_st_file *f) { return f->n_meta; }

void dw_st_metadata_at(const dw_st_file *f, int i, const char **key, const char **value) {
    DW_ASSERT(i >= 0 && i < f->n_meta);
    *key = f->meta[2 * i];
    *value = f->meta[2 * i + 1];
}
