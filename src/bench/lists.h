/* lists.h — private: the comma lists the benchmarks take for their cases ("square,gpt2"). */
#ifndef DW_BENCH_LISTS_H
#define DW_BENCH_LISTS_H

#include <stdbool.h>

#include "deepwell.h"

/* Whether `word` is an entry of the comma list (NULL: every word is). */
bool dw_bench_list_has(const char *list, const char *word);
/* DW_ERR_INVALID naming `what` and the first entry of `list` that is not one of words[nw]. */
dw_status dw_bench_list_check(dw_ctx *ctx, const char *what, const char *list, const char *const *words, int nw);

#endif /* DW_BENCH_LISTS_H */
