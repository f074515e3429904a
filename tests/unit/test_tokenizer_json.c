/* test_tokenizer_json.c — the library's tokenizer.json reader (io/tokenizer.h) without Python, so
 * the sanitizer build covers it: two hand-written BPE files (GPT-2 byte level with an added special
 * token; SentencePiece style with Prepend + Replace, byte fallback and the Llama 2 decoder chain)
 * encode and decode known strings to hand-worked ids and text, fresh random UTF-8 strings round-trip
 * exactly, a <0x00> token decodes with its length, ids outside the vocabulary decode as U+FFFD,
 * the normalizers (NFC, NFD, NFKC, NFKD, Lowercase, StripAccents) give hand-worked results,
 * dw_tokenize / dw_detokenize take the path, and bad files are refused naming the file.
 * (tests/python/test_api_tokenizer_c.py compares with the `tokenizers` package itself.) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/tokenizer.h"
#include "io/tokenizer_text.h"
#include "testutil.h"

static char *tmp;

/* Writes text to tmp/name; returns the path (free()). */
static char *write_file(const char *name, const char *text) {
    char *p = dw_test_path(tmp, name);
    assert_int_equal(dw_test_write(p, text, strlen(text)), 0);
    return p;
}

/* The GPT-2 style file: the 256 byte characters as ids 0..255 (id = byte), then "Ġt" 256, "he"
 * 257, "Ġthe" 258, and the special <|endoftext|> 259. */
static char *gpt2_file(void) {
    dw_tok_buf b = {0};
    const char *head = "{\"added_tokens\": [{\"id\": 259, \"content\": \"<|endoftext|>\", \"special\": true}],"
                       "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
                       "\"decoder\": {\"type\": \"ByteLevel\"},"
                       "\"model\": {\"type\": \"BPE\", \"merges\": [\"\xC4\xA0 t\", \"h e\", [\"\xC4\xA0t\", \"he\"]],"
                       "\"vocab\": {";
    dw_tok_buf_add(&b, head, strlen(head));
    for (int i = 0; i < 256; i++) { /* "c": i, with '"' and '\\' escaped */
        const uint32_t c = dw_bytelevel_char((uint8_t)i);
        dw_tok_buf_add(&b, c == '"' || c == '\\' ? "\"\\" : "\"", c == '"' || c == '\\' ? 2 : 1);
        dw_tok_buf_addc(&b, c);
        char id[24];
        snprintf(id, sizeof id, "\": %d, ", i);
        dw_tok_buf_add(&b, id, strlen(id));
    }
    const char *tail = "\"\xC4\xA0t\": 256, \"he\": 257, \"\xC4\xA0the\": 258}}}";
    dw_tok_buf_add(&b, tail, strlen(tail));
    assert_false(b.oom);
    char *p = write_file("gpt2.json", b.s);
    free(b.s);
    return p;
}

/* The SentencePiece style file: <unk> 0, <0x00>..<0xFF> 1..256, "▁" 257, "a" 258, "b" 259, "▁a"
 * 260, "ab" 261; merges "▁ a", "a b". */
static char *sp_file(void) {
    dw_tok_buf b = {0};
    const char *head =
        "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}],"
        "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\xE2\x96\x81\"},"
        "  {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\xE2\x96\x81\"}]},"
        "\"pre_tokenizer\": null,"
        "\"decoder\": {\"type\": \"Sequence\", \"decoders\": ["
        "  {\"type\": \"Replace\", \"pattern\": {\"String\": \"\xE2\x96\x81\"}, \"content\": \" \"},"
        "  {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
        "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, \"fuse_unk\": true,"
        "  \"merges\": [[\"\xE2\x96\x81\", \"a\"], [\"a\", \"b\"]], \"vocab\": {\"<unk>\": 0, ";
    dw_tok_buf_add(&b, head, strlen(head));
    for (int i = 0; i < 256; i++) {
        char e[32];
        snprintf(e, sizeof e, "\"<0x%02X>\": %d, ", i, i + 1);
        dw_tok_buf_add(&b, e, strlen(e));
    }
    const char *tail = "\"\xE2\x96\x81\": 257, \"a\": 258, \"b\": 259, \"\xE2\x96\x81\x61\": 260, \"ab\": 261}}}";
    dw_tok_buf_add(&b, tail, strlen(tail));
    assert_false(b.oom);
    char *p = write_file("sp.json", b.s);
    free(b.s);
    return p;
}

static void expect_ids(const dw_hf_tokenizer *t, const char *text, const int32_t *want, int64_t n) {
    int32_t *ids = NULL;
    int64_t got = -1;
    assert_int_equal(dw_hf_tokenizer_encode(dw_test_ctx, t, text, &ids, &got), DW_OK);
    assert_non_null(ids);
    if (got != n) fail_msg("encode(\"%s\"): %lld ids, want %lld", text, (long long)got, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (ids[i] != want[i]) fail_msg("encode(\"%s\"): id %lld is %d, want %d", text, (long long)i, ids[i], want[i]);
    free(ids);
}

/* decode(ids) as a malloc'd string and its length */
static char *decode(const dw_hf_tokenizer *t, const int32_t *ids, int64_t n, bool skip, size_t *len) {
    char *s = NULL;
    assert_int_equal(dw_hf_tokenizer_decode(dw_test_ctx, t, ids, n, skip, &s, len), DW_OK);
    assert_non_null(s);
    return s;
}

/* A random valid UTF-8 string of up to 40 code points from ASCII, Latin, CJK, emoji and spaces. */
static void random_text(dw_tok_buf *b) {
    static const uint32_t lo[] = {0x20, 0x09, 0xC0, 0x4E00, 0x1F600, 0x3000, 0x30};
    static const uint32_t hi[] = {0x7E, 0x0A, 0x17F, 0x4E40, 0x1F640, 0x3000, 0x39};
    b->n = 0;
    dw_tok_buf_add(b, "", 0);
    const int64_t n = dw_test_rnd(0, 40);
    for (int64_t i = 0; i < n; i++) {
        const int k = (int)dw_test_rnd(0, 6);
        dw_tok_buf_addc(b, (uint32_t)dw_test_rnd(lo[k], hi[k]));
    }
    assert_false(b->oom);
}

static void round_trips(const dw_hf_tokenizer *t, int reps) {
    dw_tok_buf b = {0};
    for (int r = 0; r < reps; r++) {
        random_text(&b);
        int32_t *ids = NULL;
        int64_t n = 0;
        assert_int_equal(dw_hf_tokenizer_encode(dw_test_ctx, t, b.s, &ids, &n), DW_OK);
        for (int64_t i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < dw_hf_tokenizer_vocab(t));
        size_t len;
        char *back = decode(t, ids, n, false, &len);
        if (len != b.n || memcmp(back, b.s, len) != 0) fail_msg("round trip of \"%s\" gave \"%s\"", b.s, back);
        free(back);
        free(ids);
    }
    free(b.s);
}

static void test_gpt2_byte_level(void **state) {
    (void)state;
    char *path = gpt2_file();
    dw_hf_tokenizer *t = NULL;
    assert_int_equal(dw_hf_tokenizer_open(dw_test_ctx, path, &t), DW_OK);
    assert_int_equal(dw_hf_tokenizer_vocab(t), 260);
    assert_string_equal(dw_hf_tokenizer_path(t), path);
    expect_ids(t, " the", (int32_t[]){258}, 1);
    expect_ids(t, "the the", (int32_t[]){'t', 257, 258}, 3);       /* "the", " the" */
    expect_ids(t, "a<|endoftext|> the", (int32_t[]){'a', 259, 258}, 3); /* the special token first */
    expect_ids(t, "\xC3\xA9  x", (int32_t[]){0xC3, 0xA9, ' ', ' ', 'x'}, 5); /* "é", " " (\s+(?!\S)), " x" */
    expect_ids(t, "", NULL, 0);
    size_t len;
    char *s = decode(t, (int32_t[]){'a', 259, 258}, 3, false, &len);
    assert_string_equal(s, "a<|endoftext|> the");
    free(s);
    s = decode(t, (int32_t[]){'a', 259, 258}, 3, true, &len);
    assert_string_equal(s, "a the");
    free(s);
    s = decode(t, (int32_t[]){0xC3, 'x', 260, -1}, 4, false, &len); /* a lone lead byte; ids outside */
    assert_string_equal(s, "\xEF\xBF\xBDx\xEF\xBF\xBD\xEF\xBF\xBD");
    free(s);
    s = decode(t, (int32_t[]){'a', 0, 'b'}, 3, false, &len); /* byte 0 inside the text */
    assert_int_equal(len, 3);
    assert_memory_equal(s, "a\0b", 3);
    free(s);
    round_trips(t, 300);
    int32_t *ids = (int32_t *)1;
    int64_t n = 7;
    assert_int_equal(dw_hf_tokenizer_encode(dw_test_ctx, t, "ok \xFF", &ids, &n), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "not UTF-8 (byte 3"));
    assert_null(ids);
    assert_int_equal(n, 0);
    dw_hf_tokenizer_free(t);
    /* through dw_tokenize / dw_detokenize by path: the ids checked against the model's vocabulary */
    assert_int_equal(dw_tokenize(dw_test_ctx, path, " the", 300, &ids, &n), DW_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 258);
    char *text = dw_detokenize(path, ids, n);
    assert_string_equal(text, " the");
    free(text);
    free(ids);
    assert_int_equal(dw_tokenize(dw_test_ctx, path, " the", 258, &ids, &n), DW_ERR_INVALID);
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "token 258"));
    assert_null(ids);
    free(path);
}

static void test_sentencepiece_byte_fallback(void **state) {
    (void)state;
    char *path = sp_file();
    dw_hf_tokenizer *t = NULL;
    assert_int_equal(dw_hf_tokenizer_open(dw_test_ctx, tmp, &t), DW_ERR_IO); /* a directory: tmp/tokenizer.json */
    assert_non_null(strstr(dw_errmsg(dw_test_ctx), "tokenizer.json"));
    assert_null(t);
    assert_int_equal(dw_hf_tokenizer_open(dw_test_ctx, path, &t), DW_OK);
    expect_ids(t, "ab", (int32_t[]){260, 259}, 2);           /* ▁ab: "▁ a" (rank 0) before "a b" */
    expect_ids(t, "b ab", (int32_t[]){257, 259, 260, 259}, 4); /* ▁b▁ab */
    expect_ids(t, "c", (int32_t[]){257, 1 + 'c'}, 2);         /* c by its byte */
    expect_ids(t, "\xC3\xA9", (int32_t[]){257, 1 + 0xC3, 1 + 0xA9}, 3);
    size_t len;
    char *s = decode(t, (int32_t[]){257, 1 + 'c', 260, 1 + 0xC3}, 4, false, &len); /* a lone byte: U+FFFD */
    assert_string_equal(s, "c a\xEF\xBF\xBD");
    free(s);
    s = decode(t, (int32_t[]){0, 258}, 2, true, &len);
    assert_string_equal(s, "a");
    free(s);
    round_trips(t, 300);
    dw_hf_tokenizer_free(t);
    free(path);
}

/* NFC against hand-worked cases: composition, singletons, canonical order, Hangul, blocking. */
static void test_nfc(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"e\xCC\x81", "\xC3\xA9"},                          /* e + acute -> U+00E9 */
        {"\xE2\x84\xAB", "\xC3\x85"},                      /* U+212B ANGSTROM SIGN -> U+00C5 */
        {"a\xCC\x82\xCC\xA3", "\xE1\xBA\xAD"},            /* a + circumflex + dot below -> U+1EAD */
        {"a\xCC\xA3\xCC\x82", "\xE1\xBA\xAD"},            /* the marks in canonical order first */
        {"\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", "\xEA\xB0\x81"}, /* jamo G A G -> U+AC01 */
        {"\xCC\x81" "a", "\xCC\x81" "a"},                  /* a leading mark stays */
        {"a\xCC\x95\xCC\x81", "\xC3\xA1\xCC\x95"},        /* U+0301 (230) sorts before U+0315 (232) */
        {"a\xCC\x81\xCC\x81", "\xC3\xA1\xCC\x81"},        /* the second acute is blocked by the first */
        {"abc \xE4\xB8\xAD", "abc \xE4\xB8\xAD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = 0;
        char *got = dw_tok_normalize_one(&(dw_tok_norm){.kind = DW_TOKN_NFC}, cases[i][0], strlen(cases[i][0]), &len);
        assert_non_null(got);
        if (len != strlen(cases[i][1]) || memcmp(got, cases[i][1], len) != 0) fail_msg("NFC case %zu: got \"%s\"", i, got);
        free(got);
    }
}

/* The other normalizers against hand-worked cases (the `tokenizers` package's results). */
static void test_other_normalizers(void **state) {
    (void)state;
    static const struct {
        dw_tok_norm_kind kind;
        const char *in, *out;
    } cases[] = {
        {DW_TOKN_NFD, "\xC3\xA9", "e\xCC\x81"},                          /* U+00E9 -> e + acute */
        {DW_TOKN_NFD, "\xEA\xB0\x81", "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8"}, /* U+AC01 -> jamo */
        {DW_TOKN_NFD, "\xEF\xAC\x81", "\xEF\xAC\x81"},                 /* U+FB01 fi: compatibility only */
        {DW_TOKN_NFKD, "\xEF\xAC\x81\xC3\xA9", "fie\xCC\x81"},          /* the ligature split, é decomposed */
        {DW_TOKN_NFKC, "\xE2\x91\xA0\xEF\xBC\xA1" "e\xCC\x81", "1A\xC3\xA9"}, /* circled 1, full-width A, é */
        {DW_TOKN_NFKC, "\xE2\x84\xAB", "\xC3\x85"},                     /* U+212B -> U+00C5 */
        {DW_TOKN_LOWERCASE, "ABC \xC3\x89\xCE\xA3\xCE\xA3", "abc \xC3\xA9\xCF\x83\xCF\x83"}, /* no final sigma */
        {DW_TOKN_LOWERCASE, "\xC4\xB0", "i\xCC\x87"},                    /* U+0130 -> i + dot above */
        {DW_TOKN_LOWERCASE, "\xE1\xBA\x9E\xEF\xBC\xA1", "\xC3\x9F\xEF\xBD\x81"}, /* U+1E9E, full-width A */
        {DW_TOKN_STRIP_ACCENTS, "e\xCC\x81\xC3\xA9", "e\xC3\xA9"},        /* marks go, precomposed stay */
        {DW_TOKN_STRIP_ACCENTS, "a\xE0\xA4\x83\xE2\x83\x9D" "b", "ab"},    /* Mc U+0903, Me U+20DD go too */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len = 0;
        char *got = dw_tok_normalize_one(&(dw_tok_norm){.kind = cases[i].kind}, cases[i].in, strlen(cases[i].in), &len);
        assert_non_null(got);
        if (len != strlen(cases[i].out) || memcmp(got, cases[i].out, len) != 0)
            fail_msg("normalizer case %zu: got \"%s\"", i, got);
        free(got);
    }
}

static void expect_refused(const char *name, const char *text, dw_status st, const char *needle) {
    char *path = write_file(name, text);
    dw_hf_tokenizer *t = (dw_hf_tokenizer *)1;
    assert_int_equal(dw_hf_tokenizer_open(dw_test_ctx, path, &t), st);
    assert_null(t);
    const char *msg = dw_errmsg(dw_test_ctx);
    if (!strstr(msg, path) || !strstr(msg, needle)) fail_msg("%s: \"%s\" lacks the path or \"%s\"", name, msg, needle);
    free(path);
}

static void test_refusals(void **state) {
    (void)state;
    expect_refused("notjson.json", "{\"model\": [", DW_ERR_FORMAT, "invalid JSON");
    expect_refused("wordpiece.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", DW_ERR_UNSUPPORTED,
                   "model type 'WordPiece' is not supported");
    const char *m = "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": ";
    char buf[512];
    snprintf(buf, sizeof buf, "{%s[\"a b\", \"a c\"]}}", m);
    expect_refused("merge.json", buf, DW_ERR_FORMAT, "model.merges[1]: the token 'c' is not in the vocabulary");
    snprintf(buf, sizeof buf, "{%s[\"b b\"]}}", m);
    expect_refused("merged.json", buf, DW_ERR_FORMAT, "the token 'bb' is not in the vocabulary");
    snprintf(buf, sizeof buf, "{%s[]}, \"decoder\": {\"type\": \"CTC\"}}", m);
    expect_refused("ctc.json", buf, DW_ERR_UNSUPPORTED, "decoder type 'CTC' is not supported");
    snprintf(buf, sizeof buf, "{%s[]}, \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": "
             "\"NFKC\"}, {\"type\": \"BertNormalizer\"}]}}", m);
    expect_refused("bert.json", buf, DW_ERR_UNSUPPORTED, "normalizer type 'BertNormalizer'");
    snprintf(buf, sizeof buf, "{%s[]}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(x\"},"
             " \"behavior\": \"Isolated\"}}", m);
    expect_refused("regex.json", buf, DW_ERR_FORMAT, "pattern '(x'");
    snprintf(buf, sizeof buf, "{%s[]}, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"x\"},"
             " \"behavior\": \"Sideways\"}}", m);
    expect_refused("behavior.json", buf, DW_ERR_FORMAT, "Split behavior 'Sideways'");
    snprintf(buf, sizeof buf, "{%s[]}, \"added_tokens\": [{\"id\": -3, \"content\": \"x\"}]}", m);
    expect_refused("added.json", buf, DW_ERR_FORMAT, "added_tokens[0]");
}

static int setup(void **state) {
    tmp = dw_test_tmpdir();
    return tmp ? dw_test_group_setup(state) : -1;
}

static int teardown(void **state) {
    dw_test_rmtree(tmp);
    free(tmp);
    return dw_test_group_teardown(state);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_byte_level),
        cmocka_unit_test(test_sentencepiece_byte_fallback),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_other_normalizers),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
