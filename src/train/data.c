/* data.c — token shards, raw text and the built-in set as shuffled windows (see data.h).
 * Files are memory-mapped read-only and validated completely when opened. Assumes a
 * little-endian host (as llm.c's files do). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "train/data.h"
#include "train/data_callback.h"
#include "train/rng.h"

typedef struct {
    char *path;
    void *map;          /* mmap'd file (NULL for builtin) */
    size_t map_len;
    unsigned char *own; /* builtin: malloc'd text */
    const unsigned char *tok; /* first token */
    int es;             /* bytes per token: 1 (text), 2, 4 */
    int64_t ntok;
    int64_t nwin;
} dw_source;

struct dw_data {
    dw_data_kind kind;
    dw_source *src;
    int nsrc;
    int64_t T;
    bool shuffle;
    uint64_t seed;
    int64_t total_windows;
    int64_t total_tokens;
    uint64_t pos;
    /* cache of the current epoch's order and the current shard's window permutation */
    int64_t epoch;      /* -1: nothing cached */
    int *order;         /* (nsrc) shard order of this epoch */
    int cur_k;          /* index into order; -1: none */
    int64_t cur_base;   /* first window (within the epoch) of order[cur_k] */
    int64_t *perm;      /* (nwin of order[cur_k]) */
};

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static uint32_t rd_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint32_t token_at(const dw_source *s, int64_t i) {
    const unsigned char *p = s->tok + i * s->es;
    if (s->es == 1) return p[0];
    if (s->es == 2) {
        uint16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    return rd_u32(p);
}

static dw_status map_file(dw_ctx *ctx, dw_source *s) {
    int fd;
    size_t size;
    DW_TRY(dw_open_regular(ctx, s->path, &fd, &size)); /* a FIFO would block open() */
    if (size == 0) {
        close(fd);
        return dw_set_error(ctx, DW_ERR_FORMAT, "%s: empty file", s->path);
    }
    void *m = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return dw_set_error(ctx, DW_ERR_IO, "%s: mmap failed: %s", s->path, strerror(errno));
    s->map = m;
    s->map_len = size;
    return DW_OK;
}

/* Validates an llm.c shard's header and size; sets tok, es, ntok. */
static dw_status check_shard(dw_ctx *ctx, dw_source *s) {
    const size_t hdr = DW_SHARD_HEADER_INTS * 4;
    const unsigned char *b = s->map;
    if (s->map_len < 12)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: truncated at byte offset %zu: not an llm.c token shard (header is %zu bytes)",
                            s->path, s->map_len, hdr);
    uint32_t magic = rd_u32(b), version = rd_u32(b + 4), n = rd_u32(b + 8);
    if (magic == DW_SHARD_MAGIC_U16) {
        if (version != DW_SHARD_VERSION_U16)
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: byte offset 4: version %u, expected %d for magic %d (uint16 tokens)",
                                s->path, version, DW_SHARD_VERSION_U16, DW_SHARD_MAGIC_U16);
        s->es = 2;
    } else if (magic == DW_SHARD_MAGIC_U32) {
        if (version != DW_SHARD_VERSION_U32)
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: byte offset 4: version %u, expected %d for magic %d (uint32 tokens)",
                                s->path, version, DW_SHARD_VERSION_U32, DW_SHARD_MAGIC_U32);
        s->es = 4;
    } else {
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: byte offset 0: bad magic %u (an llm.c token shard starts with %d or %d)",
                            s->path, magic, DW_SHARD_MAGIC_U16, DW_SHARD_MAGIC_U32);
    }
    size_t want = hdr + (size_t)n * (size_t)s->es;
    if (s->map_len < want)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: truncated at byte offset %zu: the header promises %u tokens (%zu bytes)",
                            s->path, s->map_len, n, want);
    if (s->map_len > want)
        return dw_set_error(ctx, DW_ERR_FORMAT,
                            "%s: %zu unexpected bytes from byte offset %zu after the %u tokens the header promises",
                            s->path, s->map_len - want, want, n);
    s->tok = b + hdr;
    s->ntok = n;
    return DW_OK;
}

static dw_status check_tokens(dw_ctx *ctx, const dw_source *s, int64_t vocab) {
    for (int64_t i = 0; i < s->ntok; i++) {
        uint32_t t = token_at(s, i);
        if ((int64_t)t >= vocab) {
            long long off = (long long)((s->tok - (const unsigned char *)(s->map ? s->map : s->own)) + i * s->es);
            return dw_set_error(ctx, DW_ERR_FORMAT,
                                "%s: byte offset %lld: token %u is >= the model's vocab_size %lld",
                                s->path, off, t, (long long)vocab);
        }
    }
    return DW_OK;
}

static dw_status open_builtin(dw_ctx *ctx, dw_data *d, bool val) {
    d->kind = DW_DATA_BUILTIN;
    d->src = calloc(1, sizeof *d->src);
    if (!d->src) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    d->nsrc = 1;
    dw_source *s = &d->src[0];
    s->path = strdup(val ? "builtin (val split)" : "builtin");
    int64_t len = 0;
    s->own = (unsigned char *)dw_synth_text(val, &len);
    if (!s->path || !s->own) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    s->tok = s->own;
    s->es = 1;
    s->ntok = len;
    return DW_OK;
}

static dw_status open_files(dw_ctx *ctx, dw_data *d, const char *pattern) {
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return dw_set_error(ctx, DW_ERR_IO, "%s: no file matches this path or pattern", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return dw_set_error(ctx, DW_ERR_IO, "%s: glob failed (code %d)", pattern, rc);
    }
    int nbin = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) nbin += ends_with(g.gl_pathv[i], ".bin");
    if (nbin != 0 && (size_t)nbin != g.gl_pathc) {
        globfree(&g);
        return dw_set_error(ctx, DW_ERR_INVALID,
                            "%s: matches both .bin token shards and other (text) files; use one kind",
                            pattern);
    }
    d->kind = nbin ? DW_DATA_SHARDS : DW_DATA_TEXT;
    d->src = calloc(g.gl_pathc, sizeof *d->src);
    if (!d->src) {
        globfree(&g);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    d->nsrc = (int)g.gl_pathc;
    dw_status st = DW_OK;
    for (int i = 0; i < d->nsrc && st == DW_OK; i++) {
        dw_source *s = &d->src[i];
        s->path = strdup(g.gl_pathv[i]);
        if (!s->path) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
        if (st == DW_OK) st = map_file(ctx, s);
        if (st != DW_OK) break;
        if (d->kind == DW_DATA_SHARDS) {
            st = check_shard(ctx, s);
        } else {
            s->tok = s->map;
            s->es = 1;
            s->ntok = (int64_t)s->map_len;
        }
    }
    globfree(&g);
    return st;
}

dw_status dw_data_open(dw_ctx *ctx, const dw_data_opts *o, dw_data **out) {
    *out = NULL;
    if (!o->pattern || !*o->pattern) return dw_set_error(ctx, DW_ERR_INVALID, "no data given");
    if (!strcmp(o->pattern, DW_DATA_CALLBACK)) /* a checkpoint's record of the caller's data */
        return dw_set_error(ctx, DW_ERR_INVALID, "%s: that run's data came from the caller (dw_train_opts.next_batch: "
                            "dw.Trainer over a Python iterable), not from files: resume it the same way",
                            DW_DATA_CALLBACK);
    if (o->T < 1) return dw_set_error(ctx, DW_ERR_INVALID, "sequence length %lld must be >= 1", (long long)o->T);
    dw_data *d = calloc(1, sizeof *d);
    if (!d) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    d->T = o->T;
    d->shuffle = o->shuffle;
    d->seed = o->seed;
    d->epoch = -1;
    d->cur_k = -1;
    dw_status st = !strcmp(o->pattern, "builtin") ? open_builtin(ctx, d, o->val_split)
                                                   : open_files(ctx, d, o->pattern);
    if (st == DW_OK && d->kind == DW_DATA_TEXT && o->vocab_size < 256)
        st = dw_set_error(ctx, DW_ERR_INVALID,
                          "%s: raw text is read as bytes (vocab 256) but the model's vocab_size is %lld",
                          d->src[0].path, (long long)o->vocab_size);
    for (int i = 0; st == DW_OK && i < d->nsrc; i++) {
        dw_source *s = &d->src[i];
        if (d->kind != DW_DATA_TEXT) st = check_tokens(ctx, s, o->vocab_size);
        s->nwin = s->ntok >= d->T + 1 ? (s->ntok - 1) / d->T : 0;
        d->total_windows += s->nwin;
        d->total_tokens += s->ntok;
    }
    if (st == DW_OK && d->total_windows == 0)
        st = dw_set_error(ctx, DW_ERR_INVALID,
                          "%s: %lld tokens in %d file(s): no file holds one window of --seq %lld + 1 tokens",
                          o->pattern, (long long)d->total_tokens, d->nsrc, (long long)d->T);
    if (st == DW_OK) {
        d->order = malloc((size_t)d->nsrc * sizeof *d->order);
        if (!d->order) st = dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    if (st != DW_OK) {
        dw_data_free(d);
        return st;
    }
    *out = d;
    return DW_OK;
}

dw_status dw_data_open_pattern(dw_ctx *ctx, const char *pattern, int64_t seq, int64_t vocab, dw_data **out) {
    dw_data_opts o = {.pattern = pattern, .T = seq, .vocab_size = vocab, .shuffle = false};
    return dw_data_open(ctx, &o, out);
}

void dw_data_free(dw_data *d) {
    if (!d) return;
    for (int i = 0; i < d->nsrc; i++) {
        if (d->src[i].map) munmap(d->src[i].map, d->src[i].map_len);
        free(d->src[i].own);
        free(d->src[i].path);
    }
    free(d->src);
    free(d->order);
    free(d->perm);
    free(d);
}

dw_data_kind dw_data_get_kind(const dw_data *d) { return d->kind; }
int dw_data_file_count(const dw_data *d) { return d->nsrc; }
int64_t dw_data_tokens(const dw_data *d) { return d->total_tokens; }
int64_t dw_data_windows(const dw_data *d) { return d->total_windows; }
uint64_t dw_data_position(const dw_data *d) { return d->pos; }
void dw_data_seek(dw_data *d, uint64_t position) { d->pos = position; }

/* Fisher-Yates from a derived seed. */
static void shuffle_ints(int64_t *a, int64_t n, uint64_t seed) {
    dw_rng r = {seed};
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)dw_rng_below(&r, (uint64_t)i + 1);
        int64_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static void set_epoch(dw_data *d, int64_t e) {
    int64_t *tmp = malloc((size_t)d->nsrc * sizeof *tmp);
    DW_ASSERT(tmp);
    for (int i = 0; i < d->nsrc; i++) tmp[i] = i;
    if (d->shuffle) shuffle_ints(tmp, d->nsrc, dw_rng_derive(d->seed, (uint64_t)e, UINT64_MAX));
    for (int i = 0; i < d->nsrc; i++) d->order[i] = (int)tmp[i];
    free(tmp);
    d->epoch = e;
    d->cur_k = -1;
}

static void set_shard(dw_data *d, int k, int64_t base) {
    d->cur_k = k;
    d->cur_base = base;
    free(d->perm);
    d->perm = NULL;
    if (!d->shuffle) return;
    const dw_source *s = &d->src[d->order[k]];
    d->perm = malloc((size_t)s->nwin * sizeof *d->perm);
    DW_ASSERT(d->perm);
    for (int64_t i = 0; i < s->nwin; i++) d->perm[i] = i;
    shuffle_ints(d->perm, s->nwin, dw_rng_derive(d->seed, (uint64_t)d->epoch, (uint64_t)d->order[k]));
}

/* The source and first token of window number `pos` (counted since the start). */
static const dw_source *locate(dw_data *d, uint64_t pos, int64_t *first) {
    int64_t N = d->total_windows;
    int64_t e = (int64_t)(pos / (uint64_t)N), r = (int64_t)(pos % (uint64_t)N);
    if (e != d->epoch) set_epoch(d, e);
    if (d->cur_k < 0 || r < d->cur_base || r >= d->cur_base + d->src[d->order[d->cur_k]].nwin) {
        int64_t base = 0;
        int k = 0;
        while (r >= base + d->src[d->order[k]].nwin) base += d->src[d->order[k++]].nwin;
        set_shard(d, k, base);
    }
    const dw_source *s = &d->src[d->order[d->cur_k]];
    int64_t w = r - d->cur_base;
    *first = (d->shuffle ? d->perm[w] : w) * d->T;
    return s;
}

void dw_data_next(dw_data *d, int64_t B, int32_t *tokens, int32_t *targets) {
    const int64_t T = d->T;
    for (int64_t b = 0; b < B; b++) {
        int64_t first = 0;
        const dw_source *s = locate(d, d->pos++, &first);
        for (int64_t t = 0; t < T; t++) {
            tokens[b * T + t] = (int32_t)token_at(s, first + t);
            targets[b * T + t] = (int32_t)token_at(s, first + t + 1);
        }
    }
}

void dw_data_next_rank(dw_data *d, int64_t B, int rank, int world, int32_t *tokens, int32_t *targets) {
    const uint64_t start = d->pos;
    d->pos = start + (uint64_t)rank * (uint64_t)B;
    dw_data_next(d, B, tokens, targets);
    d->pos = start + (uint64_t)world * (uint64_t)B;
}
