/* family.c — the families of configurations `deepwell plan --explain` accounts for (a
 * configuration belongs to every family whose feature it has): their names and a configuration's
 * membership. The search (search.c) keeps each family's counts and fastest member. */
#include "plan/plan.h"

static const char *const family_names[DW_FAMILY_COUNT] = {
#define X(id, name) name,
    DW_FAMILY_LIST(X)
#undef X
};

const char *dw_family_name(dw_family f) { return f >= 0 && f < DW_FAMILY_COUNT ? family_names[f] : "?"; }

unsigned dw_family_mask(const dw_par *p) {
    unsigned m = 0;
#define IN(id, cond) m |= (cond) ? 1u << DW_FAMILY_##id : 0
    IN(NO_PIPELINE, p->pp == 1);
    IN(PIPELINE_1F1B, p->pp > 1 && p->sched == DW_SCHED_1F1B);
    IN(INTERLEAVED, p->sched == DW_SCHED_INTERLEAVED);
    IN(DUALPIPE, p->sched == DW_SCHED_DUALPIPE);
    IN(A2A_OVERLAP, p->a2a_overlap && p->sched != DW_SCHED_DUALPIPE);
    IN(TP, p->tp > 1);
    IN(CP, p->cp > 1);
    IN(EP, p->ep > 1);
    IN(ETP_FOLDED, dw_par_etp(p) < p->tp);
    IN(ZERO3, p->zero == 3);
    IN(OFFLOAD, p->offload);
    IN(FULL_RECOMPUTE, p->recompute == DW_RECOMPUTE_FULL);
#undef IN
    _Static_assert(DW_FAMILY_COUNT <= 32, "one bit per family");
    return m;
}
