/* tokenizer_text.h — private: the text helpers the tokenizer needs (io/tokenizer.h): UTF-8 steps
 * and checks, Rust's from_utf8_lossy (each maximal invalid subpart -> one U+FFFD, as the package
 * decodes), GPT-2's byte <-> printable character map, Unicode White_Space, and a growable byte
 * buffer. Not a Unicode library: utf8proc does the normalizers' Unicode data (tokenizer_norm.c),
 * PCRE2 the regexes. */
#ifndef DW_IO_TOKENIZER_TEXT_H
#define DW_IO_TOKENIZER_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A growable byte string, NUL-terminated while not oom; appends after a failed one do nothing. */
typedef struct {
    char *s;
    size_t n, cap;
    bool oom;
} dw_tok_buf;
void dw_tok_buf_add(dw_tok_buf *b, const void *p, size_t n);
void dw_tok_buf_addc(dw_tok_buf *b, uint32_t cp); /* one code point as UTF-8 */
/* s[0, n) with every a replaced by b (a non-empty), appended to out (Replace, Metaspace). */
void dw_tok_replace_all(dw_tok_buf *out, const char *s, size_t n, const char *a, const char *b);

/* Whether s[0, n) is valid UTF-8; else *bad is the offset of the first invalid byte. */
bool dw_utf8_valid(const char *s, size_t n, size_t *bad);
/* The code point at s (valid UTF-8) and its length in bytes. */
uint32_t dw_utf8_at(const char *s, size_t *len);
/* s[0, n) with invalid UTF-8 replaced as Rust's String::from_utf8_lossy does, appended to b. */
void dw_utf8_lossy(dw_tok_buf *b, const char *s, size_t n);

/* Unicode White_Space (char::is_whitespace). */
bool dw_unicode_space(uint32_t cp);

/* GPT-2's bytes_to_unicode: the printable code point standing for byte b, and back (-1: none). */
uint32_t dw_bytelevel_char(uint8_t b);
int dw_bytelevel_byte(uint32_t cp);

#endif /* DW_IO_TOKENIZER_TEXT_H */
