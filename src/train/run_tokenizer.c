/* run_tokenizer.c — dw_run_set_tokenizer (deepwell.h): the tokenizer.json a training run's text
 * goes through, copied into the run directory, from where train/ckpt.c puts a copy into every
 * checkpoint it writes there and dw_model_open (train/model_open.c) decodes with the checkpoint's.
 * Not the tokenizer itself (io/tokenizer*.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "train/ckpt.h"

/* Creates dir and whichever directories above it are missing. */
static dw_status make_dirs(dw_ctx *ctx, const char *dir) {
    char *p = strdup(dir);
    if (!p) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_status st = DW_OK;
    const size_t n = strlen(p);
    for (size_t i = 1; i <= n && st == DW_OK; i++) {
        if (p[i] != '/' && p[i] != '\0') continue;
        const char c = p[i];
        p[i] = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
        p[i] = c;
    }
    free(p);
    return st;
}

dw_status dw_run_set_tokenizer(dw_ctx *ctx, const char *run_dir, const char *tokenizer) {
    if (!run_dir || !*run_dir || !tokenizer || !*tokenizer)
        return dw_set_error(ctx, DW_ERR_INVALID, "run tokenizer: no %s given",
                            run_dir && *run_dir ? "tokenizer" : "run directory");
    struct stat sb;
    const bool dir = stat(tokenizer, &sb) == 0 && S_ISDIR(sb.st_mode);
    char *src = dir ? dw_path_join(tokenizer, DW_CKPT_TOKENIZER) : strdup(tokenizer);
    char *dst = dw_path_join(run_dir, DW_CKPT_TOKENIZER), *text = NULL, *had = NULL;
    size_t n = 0, m = 0;
    dw_status st = src && dst ? dw_read_file(ctx, src, &text, &n) : dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    if (st == DW_OK && access(dst, F_OK) == 0) { /* a run that has one: the same, or refused */
        st = dw_read_file(ctx, dst, &had, &m);
        if (st == DW_OK && (m != n || memcmp(had, text, n) != 0))
            st = dw_set_error(ctx, DW_ERR_INVALID, "%s: this run was trained with another tokenizer than %s (a run "
                              "keeps one tokenizer: give the same one, or train into a new directory)", dst, src);
    } else if (st == DW_OK) {
        st = make_dirs(ctx, run_dir);
        if (st == DW_OK) st = dw_write_file_atomic(ctx, dst, text, n);
    }
    free(text);
    free(had);
    free(src);
    free(dst);
    return st;
}
