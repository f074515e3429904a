/* tokenizer_load.c — dw_hf_tokenizer_open/free (deepwell.h): a Hugging Face tokenizer.json (or a
 * directory holding one) read with Jansson into io/tokenizer.h's tables. BPE models only; the
 * normalizers, pre-tokenizers and decoders listed in tokenizer.h; any other type is refused with
 * the file, the field and the type named. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/json.h"
#include "io/tokenizer.h"
#include "io/tokenizer_text.h"

static dw_status nomem(dw_ctx *ctx) { return dw_set_error(ctx, DW_ERR_NOMEM, "tokenizer: out of memory"); }

static dw_status bad(dw_ctx *ctx, const dw_hf_tokenizer *t, const char *fmt, const char *a, const char *b) {
    char msg[512];
    snprintf(msg, sizeof msg, fmt, a, b);
    return dw_set_error(ctx, DW_ERR_FORMAT, "tokenizer %s: %s", t->path, msg);
}

static dw_status unsupported(dw_ctx *ctx, const dw_hf_tokenizer *t, const char *what, const char *type,
                             const char *known) {
    return dw_set_error(ctx, DW_ERR_UNSUPPORTED, "tokenizer %s: %s type '%s' is not supported (%s)", t->path, what,
                        type, known);
}

static const char *type_of(const json_t *o) {
    const json_t *v = json_object_get(o, "type");
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static const char *str_field(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool bool_field(const json_t *o, const char *key, bool dflt) {
    const json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* {"String": s} or {"Regex": r}: the text and whether it is a regex; NULL when neither. */
static const char *pattern_of(const json_t *o, bool *regex) {
    const json_t *p = json_object_get(o, "pattern");
    const char *s = str_field(p, "String");
    *regex = !s;
    return s ? s : str_field(p, "Regex");
}

static dw_status prepend_scheme(dw_ctx *ctx, const dw_hf_tokenizer *t, const json_t *o, dw_prepend_scheme *out) {
    const char *s = str_field(o, "prepend_scheme");
    if (!s) *out = bool_field(o, "add_prefix_space", true) ? DW_PREPEND_ALWAYS : DW_PREPEND_NEVER;
    else if (!strcmp(s, "always")) *out = DW_PREPEND_ALWAYS;
    else if (!strcmp(s, "first")) *out = DW_PREPEND_FIRST;
    else if (!strcmp(s, "never")) *out = DW_PREPEND_NEVER;
    else return bad(ctx, t, "Metaspace prepend_scheme '%s' (always, first or never)", s, NULL);
    return DW_OK;
}

/* A Sequence's members (key), or the object itself as a list of one. */
static const json_t *members(const json_t *o, const char *key, size_t *n) {
    const char *ty = type_of(o);
    if (ty && !strcmp(ty, "Sequence")) {
        const json_t *a = json_object_get(o, key);
        *n = json_is_array(a) ? json_array_size(a) : 0;
        return a;
    }
    *n = 1;
    return NULL;
}

static const json_t *member(const json_t *seq, const json_t *o, size_t i) { return seq ? json_array_get(seq, i) : o; }

/* The normalizers without arguments, by their type name. */
static bool norm_plain(const char *ty, dw_tok_norm_kind *kind) {
    static const struct { const char *name; dw_tok_norm_kind kind; } plain[] = {
        {"NFC", DW_TOKN_NFC}, {"NFD", DW_TOKN_NFD}, {"NFKC", DW_TOKN_NFKC}, {"NFKD", DW_TOKN_NFKD},
        {"Lowercase", DW_TOKN_LOWERCASE}, {"StripAccents", DW_TOKN_STRIP_ACCENTS}};
    for (size_t i = 0; i < sizeof plain / sizeof *plain; i++)
        if (!strcmp(ty, plain[i].name)) return *kind = plain[i].kind, true;
    return false;
}

static dw_status load_normalizer(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *o) {
    if (!o || json_is_null(o)) return DW_OK;
    size_t n;
    const json_t *seq = members(o, "normalizers", &n);
    if (!(t->norm = calloc(n ? n : 1, sizeof *t->norm))) return nomem(ctx);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = member(seq, o, i);
        const char *ty = type_of(m);
        dw_tok_norm *d = &t->norm[t->n_norm];
        bool regex = false;
        if (ty && !strcmp(ty, "Prepend") && str_field(m, "prepend")) {
            d->kind = DW_TOKN_PREPEND;
            d->a = strdup(str_field(m, "prepend"));
        } else if (ty && !strcmp(ty, "Replace") && pattern_of(m, &regex) && str_field(m, "content")) {
            if (regex) return unsupported(ctx, t, "normalizer Replace with a pattern", "Regex", "String patterns are");
            d->kind = DW_TOKN_REPLACE;
            d->a = strdup(pattern_of(m, &regex)), d->b = strdup(str_field(m, "content"));
        } else if (ty && norm_plain(ty, &d->kind)) {
            /* no arguments */
        } else {
            return unsupported(ctx, t, "normalizer", ty ? ty : "(none)",
                               "NFC, NFD, NFKC, NFKD, Lowercase, StripAccents, Prepend, Replace and Sequence are");
        }
        t->n_norm++;
        const bool args = d->kind == DW_TOKN_PREPEND || d->kind == DW_TOKN_REPLACE;
        if ((args && !d->a) || (d->kind == DW_TOKN_REPLACE && !d->b)) return nomem(ctx);
    }
    return DW_OK;
}

static const char *const BEHAVIORS[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};

/* GPT-2's pre-tokenization pattern (ByteLevel with use_regex). */
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static dw_status compile(dw_ctx *ctx, const dw_hf_tokenizer *t, dw_tok_pre *d, const char *pattern, bool literal) {
    char err[256];
    if (!(d->re = dw_tok_regex_compile(pattern, literal, err, sizeof err)))
        return dw_set_error(ctx, DW_ERR_FORMAT, "tokenizer %s: pre-tokenizer pattern '%.80s': %s", t->path, pattern, err);
    return DW_OK;
}

static dw_status load_pre(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *m) {
    const char *ty = type_of(m);
    dw_tok_pre *d = &t->pre[t->n_pre++];
    bool regex = false;
    if (ty && !strcmp(ty, "ByteLevel")) {
        d->kind = DW_TOKP_BYTELEVEL;
        d->add_prefix_space = bool_field(m, "add_prefix_space", true);
        d->use_regex = bool_field(m, "use_regex", true);
        if (d->use_regex) DW_TRY(compile(ctx, t, d, GPT2_PATTERN, false));
    } else if (ty && !strcmp(ty, "Split") && pattern_of(m, &regex)) {
        d->kind = DW_TOKP_SPLIT;
        d->invert = bool_field(m, "invert", false);
        const char *b = str_field(m, "behavior");
        int k = 0;
        while (b && k < 5 && strcmp(b, BEHAVIORS[k])) k++;
        if (!b || k == 5) return bad(ctx, t, "Split behavior '%s' (Removed, Isolated, MergedWithPrevious, "
                                     "MergedWithNext or Contiguous)", b ? b : "(none)", NULL);
        d->behavior = (dw_split_behavior)k;
        DW_TRY(compile(ctx, t, d, pattern_of(m, &regex), !regex));
    } else if (ty && !strcmp(ty, "Metaspace")) {
        const char *r = str_field(m, "replacement");
        size_t len = 0;
        if (!r || !*r || (dw_utf8_at(r, &len), r[len])) return bad(ctx, t, "Metaspace replacement '%s' is not one character", r ? r : "(none)", NULL);
        d->kind = DW_TOKP_METASPACE;
        d->split = bool_field(m, "split", true);
        DW_TRY(prepend_scheme(ctx, t, m, &d->scheme));
        if (!(d->replacement = strdup(r))) return nomem(ctx);
        if (d->split) DW_TRY(compile(ctx, t, d, r, true));
    } else if (ty && !strcmp(ty, "Digits")) {
        d->kind = DW_TOKP_DIGITS;
        d->individual_digits = bool_field(m, "individual_digits", false);
        DW_TRY(compile(ctx, t, d, d->individual_digits ? "\\p{N}" : "\\p{N}+", false));
    } else {
        return unsupported(ctx, t, "pre-tokenizer", ty ? ty : "(none)", "ByteLevel, Split, Metaspace, Digits and Sequence are");
    }
    return DW_OK;
}

static dw_status load_pretokenizer(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *o) {
    if (!o || json_is_null(o)) return DW_OK;
    size_t n;
    const json_t *seq = members(o, "pretokenizers", &n);
    if (!(t->pre = calloc(n ? n : 1, sizeof *t->pre))) return nomem(ctx);
    for (size_t i = 0; i < n; i++) DW_TRY(load_pre(ctx, t, member(seq, o, i)));
    return DW_OK;
}

static dw_status load_decoder(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *o) {
    if (!o || json_is_null(o)) return DW_OK;
    t->has_decoder = true;
    size_t n;
    const json_t *seq = members(o, "decoders", &n);
    if (!(t->dec = calloc(n ? n : 1, sizeof *t->dec))) return nomem(ctx);
    for (size_t i = 0; i < n; i++) {
        const json_t *m = member(seq, o, i);
        const char *ty = type_of(m);
        dw_tok_dec *d = &t->dec[t->n_dec++];
        bool regex = false;
        if (ty && !strcmp(ty, "ByteLevel")) d->kind = DW_TOKD_BYTELEVEL;
        else if (ty && !strcmp(ty, "ByteFallback")) d->kind = DW_TOKD_BYTEFALLBACK;
        else if (ty && !strcmp(ty, "Fuse")) d->kind = DW_TOKD_FUSE;
        else if (ty && !strcmp(ty, "Replace") && pattern_of(m, &regex) && str_field(m, "content")) {
            if (regex) return unsupported(ctx, t, "decoder Replace with a pattern", "Regex", "String patterns are");
            d->kind = DW_TOKD_REPLACE;
            if (!(d->a = strdup(pattern_of(m, &regex))) || !(d->b = strdup(str_field(m, "content")))) return nomem(ctx);
        } else if (ty && !strcmp(ty, "Strip") && str_field(m, "content")) {
            const json_t *s = json_object_get(m, "start"), *e = json_object_get(m, "stop");
            d->kind = DW_TOKD_STRIP;
            d->start = json_is_integer(s) ? json_integer_value(s) : 0;
            d->stop = json_is_integer(e) ? json_integer_value(e) : 0;
            if (!(d->a = strdup(str_field(m, "content")))) return nomem(ctx);
        } else if (ty && !strcmp(ty, "Metaspace") && str_field(m, "replacement")) {
            d->kind = DW_TOKD_METASPACE;
            DW_TRY(prepend_scheme(ctx, t, m, &d->scheme));
            if (!(d->a = strdup(str_field(m, "replacement")))) return nomem(ctx);
        } else {
            return unsupported(ctx, t, "decoder", ty ? ty : "(none)",
                               "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence are");
        }
    }
    return DW_OK;
}

static dw_status load_vocab(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *vocab) {
    if (!json_is_object(vocab)) return bad(ctx, t, "model.vocab is not an object of token -> id%s", "", NULL);
    const char *key;
    json_t *v;
    int64_t max = -1;
    json_object_foreach((json_t *)vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= INT32_MAX)
            return bad(ctx, t, "model.vocab['%.60s']: %s", key, "expected an id in [0, 2^31 - 1)");
        if (json_integer_value(v) > max) max = json_integer_value(v);
    }
    t->n_vocab = max + 1;
    if (max >= 0 && !(t->vocab_token = calloc((size_t)t->n_vocab, sizeof *t->vocab_token))) return nomem(ctx);
    json_object_foreach((json_t *)vocab, key, v) {
        const int64_t id = json_integer_value(v);
        free(t->vocab_token[id]);
        if (!(t->vocab_token[id] = strdup(key))) return nomem(ctx);
    }
    /* the map borrows vocab_token's strings */
    for (int64_t id = 0; id < t->n_vocab; id++)
        if (t->vocab_token[id] && !dw_tok_map_put(&t->vocab, t->vocab_token[id], strlen(t->vocab_token[id]), (int32_t)id))
            return nomem(ctx);
    return DW_OK;
}

static dw_status load_merges(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *merges) {
    if (!json_is_array(merges)) return bad(ctx, t, "model.merges is not an array%s", "", NULL);
    char *buf = NULL;
    size_t cap = 0;
    dw_status st = DW_OK;
    for (size_t r = 0; r < json_array_size(merges) && st == DW_OK; r++) {
        const json_t *m = json_array_get(merges, r);
        const char *a = NULL, *b = NULL;
        size_t na = 0, nb = 0;
        if (json_is_string(m)) { /* "a b": exactly one space, as the package requires */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (sp && !strchr(sp + 1, ' ')) na = (size_t)(sp - a), b = sp + 1, nb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)), b = json_string_value(json_array_get(m, 1));
            na = strlen(a), nb = strlen(b);
        }
        char where[48];
        snprintf(where, sizeof where, "%zu", r);
        if (!b) {
            st = bad(ctx, t, "model.merges[%s] is not \"LEFT RIGHT\" nor [LEFT, RIGHT]%s", where, "");
            break;
        }
        const int32_t ia = dw_tok_map_get(&t->vocab, a, na), ib = dw_tok_map_get(&t->vocab, b, nb);
        if (na + nb + 1 > cap) {
            char *p = realloc(buf, cap = 2 * (na + nb + 1));
            if (!p) {
                st = nomem(ctx);
                break;
            }
            buf = p;
        }
        memcpy(buf, a, na), memcpy(buf + na, b, nb), buf[na + nb] = '\0';
        const int32_t id = dw_tok_map_get(&t->vocab, buf, na + nb);
        if (ia < 0 || ib < 0 || id < 0) {
            char tok[128];
            snprintf(tok, sizeof tok, "'%.*s'", (int)((ia < 0 ? na : ib < 0 ? nb : na + nb) > 100 ? 100 : (ia < 0 ? na : ib < 0 ? nb : na + nb)),
                     ia < 0 ? a : ib < 0 ? b : buf);
            st = bad(ctx, t, "model.merges[%s]: the token %s is not in the vocabulary", where, tok);
        } else if (!dw_tok_pairs_put(&t->merges, ia, ib, (int32_t)r, id)) {
            st = nomem(ctx);
        }
    }
    free(buf);
    return st;
}

static dw_status load_model(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *m) {
    if (!json_is_object(m)) return bad(ctx, t, "no \"model\" object%s", "", NULL);
    const char *ty = type_of(m);
    if (ty ? strcmp(ty, "BPE") != 0 : !json_object_get(m, "merges"))
        return unsupported(ctx, t, "model", ty ? ty : "(none)", "BPE is");
    const char *pre = str_field(m, "continuing_subword_prefix"), *suf = str_field(m, "end_of_word_suffix");
    if ((pre && *pre) || (suf && *suf))
        return unsupported(ctx, t, "BPE option", pre && *pre ? "continuing_subword_prefix" : "end_of_word_suffix",
                           "BPE without subword prefixes or word suffixes is");
    const json_t *dropout = json_object_get(m, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return unsupported(ctx, t, "BPE option", "dropout", "deterministic BPE is");
    t->byte_fallback = bool_field(m, "byte_fallback", false);
    t->ignore_merges = bool_field(m, "ignore_merges", false);
    t->fuse_unk = bool_field(m, "fuse_unk", false);
    DW_TRY(load_vocab(ctx, t, json_object_get(m, "vocab")));
    DW_TRY(load_merges(ctx, t, json_object_get(m, "merges")));
    const char *unk = str_field(m, "unk_token");
    t->unk = unk ? dw_tok_map_get(&t->vocab, unk, strlen(unk)) : -1;
    if (unk && t->unk < 0) return bad(ctx, t, "model.unk_token '%.60s' is not in the vocabulary%s", unk, "");
    return DW_OK;
}

static dw_status load_added(dw_ctx *ctx, dw_hf_tokenizer *t, const json_t *a) {
    if (!a || json_is_null(a)) return DW_OK;
    if (!json_is_array(a)) return bad(ctx, t, "added_tokens is not an array%s", "", NULL);
    if (!(t->added = calloc(json_array_size(a) + 1, sizeof *t->added))) return nomem(ctx);
    for (size_t i = 0; i < json_array_size(a); i++) {
        const json_t *o = json_array_get(a, i), *id = json_object_get(o, "id");
        const char *c = str_field(o, "content");
        char where[32];
        snprintf(where, sizeof where, "%zu", i);
        if (!c || !*c || !json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= INT32_MAX)
            return bad(ctx, t, "added_tokens[%s]: expected a non-empty \"content\" and an \"id\" in [0, 2^31 - 1)%s",
                       where, "");
        dw_tok_added *d = &t->added[t->n_added++];
        d->id = (int32_t)json_integer_value(id);
        d->special = bool_field(o, "special", false), d->lstrip = bool_field(o, "lstrip", false);
        d->rstrip = bool_field(o, "rstrip", false), d->single_word = bool_field(o, "single_word", false);
        d->is_normalized = bool_field(o, "normalized", !d->special);
        if (!(d->content = strdup(c))) return nomem(ctx);
        if (d->is_normalized && !(d->normalized = dw_tok_normalize(t, c, strlen(c), &(size_t){0}, NULL))) return nomem(ctx);
    }
    return DW_OK;
}

void dw_hf_tokenizer_free(dw_hf_tokenizer *t) {
    if (!t) return;
    for (int64_t i = 0; i < t->n_vocab; i++) free(t->vocab_token[i]);
    free(t->vocab_token);
    free(t->id_token);
    dw_tok_map_free(&t->vocab);
    dw_tok_pairs_free(&t->merges);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].normalized);
    free(t->added);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    free(t->norm);
    for (int i = 0; i < t->n_pre; i++) dw_tok_regex_free(t->pre[i].re), free(t->pre[i].replacement);
    free(t->pre);
    for (int i = 0; i < t->n_dec; i++) free(t->dec[i].a), free(t->dec[i].b);
    free(t->dec);
    free(t->path);
    free(t);
}

/* id -> token: the vocabulary's, the added tokens' texts taking their ids (the package looks them
 * up first). */
static dw_status index_ids(dw_ctx *ctx, dw_hf_tokenizer *t) {
    t->n_ids = t->n_vocab;
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id >= t->n_ids) t->n_ids = t->added[i].id + 1;
    if (t->n_ids && !(t->id_token = calloc((size_t)t->n_ids, sizeof *t->id_token))) return nomem(ctx);
    for (int64_t i = 0; i < t->n_vocab; i++) t->id_token[i] = t->vocab_token[i];
    for (int i = 0; i < t->n_added; i++) t->id_token[t->added[i].id] = t->added[i].content;
    return DW_OK;
}

dw_status dw_hf_tokenizer_open(dw_ctx *ctx, const char *path, dw_hf_tokenizer **out) {
    *out = NULL;
    if (!path || !*path) return dw_set_error(ctx, DW_ERR_INVALID, "tokenizer: no path given");
    struct stat sb;
    const bool dir = stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
    dw_hf_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return nomem(ctx);
    const size_t n = strlen(path) + sizeof "/tokenizer.json";
    if (!(t->path = malloc(n))) return dw_hf_tokenizer_free(t), nomem(ctx);
    snprintf(t->path, n, dir ? "%s/tokenizer.json" : "%s", path);
    json_t *j = NULL;
    dw_status st = dw_json_load_file(ctx, t->path, &j);
    if (st == DW_OK && !json_is_object(j)) st = bad(ctx, t, "not a JSON object%s", "", NULL);
    /* the vocabulary first (the merges and unk_token refer to it), the normalizer before the added
     * tokens (normalized ones are matched in their normalized form), the added tokens' texts last */
    if (st == DW_OK) st = load_model(ctx, t, json_object_get(j, "model"));
    if (st == DW_OK) st = load_normalizer(ctx, t, json_object_get(j, "normalizer"));
    if (st == DW_OK) st = load_pretokenizer(ctx, t, json_object_get(j, "pre_tokenizer"));
    if (st == DW_OK) st = load_decoder(ctx, t, json_object_get(j, "decoder"));
    if (st == DW_OK) st = load_added(ctx, t, json_object_get(j, "added_tokens"));
    if (st == DW_OK) st = index_ids(ctx, t);
    if (st == DW_OK && t->n_ids == 0) st = bad(ctx, t, "an empty vocabulary%s", "", NULL);
    json_decref(j);
    if (st != DW_OK) {
        dw_hf_tokenizer_free(t);
        return st;
    }
    *out = t;
    return DW_OK;
}

int64_t dw_hf_tokenizer_vocab(const dw_hf_tokenizer *t) { return t ? t->n_ids : 0; }

const char *dw_hf_tokenizer_path(const dw_hf_tokenizer *t) { return t ? t->path : NULL; }

const char *dw_hf_tokenizer_token(const dw_hf_tokenizer *t, int64_t id) {
    return id >= 0 && id < t->n_ids && t->id_token[id] ? t->id_token[id] : "";
}
