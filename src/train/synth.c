/* synth.c — the built-in data set: addition facts "a+b=c\n" with 0 <= a, b < DW_SYNTH_MAX, as
 * bytes, in shuffled rounds. Small enough that a tiny model learns every fact in a few CPU
 * minutes; a person (or scripts/run.sh) checks a sample by doing the sums. The validation text is
 * the same facts in another order (a fresh stream, not held-out facts). */
#include <stdio.h>
#include <stdlib.h>

#include "train/data.h"
#include "train/rng.h"

#define SYNTH_SEED 0x5eedfac75ull /* fixed: the data set is the same in every run */
#define TEXT_BYTES (256 * 1024) /* shuffled passes over the facts until about this much text */

char *dw_synth_text(bool val_split, int64_t *len_out) {
    int nfacts = 0;
    int *facts = malloc(sizeof(int) * DW_SYNTH_MAX * DW_SYNTH_MAX);
    if (!facts) return NULL;
    for (int a = 0; a < DW_SYNTH_MAX; a++)
        for (int b = 0; b < DW_SYNTH_MAX; b++)
            facts[nfacts++] = a * DW_SYNTH_MAX + b;
    int rounds = (int)(TEXT_BYTES / (nfacts * 6) / (val_split ? 16 : 1)) + 1; /* facts are >= 6 bytes */
    size_t cap = (size_t)nfacts * (size_t)rounds * 12 + 1; /* "99+99=198\n" is 10 bytes */
    char *text = malloc(cap);
    if (!text) {
        free(facts);
        return NULL;
    }
    dw_rng r = {SYNTH_SEED + (val_split ? 1 : 0)};
    size_t len = 0;
    for (int round = 0; round < rounds; round++) {
        for (int i = nfacts - 1; i > 0; i--) {
            int j = (int)dw_rng_below(&r, (uint64_t)i + 1);
            int t = facts[i];
            facts[i] = facts[j];
            facts[j] = t;
        }
        for (int i = 0; i < nfacts; i++) {
            int a = facts[i] / DW_SYNTH_MAX, b = facts[i] % DW_SYNTH_MAX;
            len += (size_t)snprintf(text + len, cap - len, "%d+%d=%d\n", a, b, a + b);
        }
    }
    free(facts);
    *len_out = (int64_t)len;
    return text;
}
