/* z3_slots.h — private: ZeRO-3's gather block, the rule both the runtime (train/dp_zero3.c places
 * the gathered parameters by it) and the planner (plan/engine.c prices the block by it) read, so
 * that the bytes planned and the bytes allocated cannot drift. */
#ifndef DW_COMPILE_Z3_SLOTS_H
#define DW_COMPILE_Z3_SLOTS_H

#include <stdbool.h>
#include <stdint.h>

#include "compile/memplan.h"
#include "compile/program.h"

/* Whether parameter k keeps a standing BF16 working copy (compile/params.c): BF16 programs. */
bool dw_z3_has_bf16(const dw_compiled *p, int k);

/* The bytes of parameter k's slot: its FP32 values 256-aligned, then its BF16 copy where it has one. */
int64_t dw_z3_slot_bytes(const dw_compiled *p, int k);

/* One item (compile/memplan.h) per parameter some forward or backward step reads, live from the
 * first to the last forward step that reads it and again from the first to the last backward step
 * (a recomputed forward is a backward-sweep step), each lifetime starting earlier, at the sweep's
 * previous event step (the latest first reader of another parameter before its own), where
 * train/dp_zero3_gather.c starts its gathers (the prefetch). items[n_params], item_of[n_params] (parameter
 * k's item, -1: read by no step, never gathered), first[2 x n_params] (the first forward, backward
 * step reading k; -1: none). Returns the number of items; their offsets are dw_memplan_assign's. */
int dw_z3_slot_items(const dw_compiled *p, dw_mem_item *items, int *item_of, int *first);

#endif /* DW_COMPILE_Z3_SLOTS_H */
