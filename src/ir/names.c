/* names.c — the IR's tables of names and facts: each op's name, summary, flags and backends
 * (from ops.def), the dtypes' and initialisers' names, and their parsers. Nothing here reads a
 * graph. */
#include <string.h>

#include "ir/ir.h"

static const char *const op_names[] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) #name,
#include "ir/ops.def"
#undef DW_OP
};
static const char *const op_summaries[] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) summary,
#include "ir/ops.def"
#undef DW_OP
};
static const struct {
    unsigned flags;
    int outs;
    bool cpu, cuda;
} op_facts[] = {
#define DW_OP(ID, name, min_in, max_in, outs, flags, cpu, cuda, summary) {flags, outs, cpu, cuda},
#include "ir/ops.def"
#undef DW_OP
};
_Static_assert(sizeof op_names / sizeof op_names[0] == DW_OP_COUNT, "op name table vs ops.def");
_Static_assert(DW_OP_COUNT == 25, "ops.def changed: update the op tests and docs/ir.md");

const char *dw_op_name(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_names[op] : "?"; }
const char *dw_op_summary(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_summaries[op] : "?"; }
unsigned dw_op_flags(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_facts[op].flags : 0; }
int dw_op_outputs(dw_op op) { return (unsigned)op < DW_OP_COUNT ? op_facts[op].outs : 0; }
bool dw_op_on_backend(dw_op op, int device) {
    if ((unsigned)op >= DW_OP_COUNT) return false;
    return device == DW_DEVICE_CPU ? op_facts[op].cpu : device == DW_DEVICE_CUDA ? op_facts[op].cuda : false;
}

bool dw_op_parse(const char *name, dw_op *out) {
    for (int i = 0; i < DW_OP_COUNT; i++)
        if (!strcmp(op_names[i], name)) {
            *out = (dw_op)i;
            return true;
        }
    return false;
}

static const char *const dtype_names[DW_IR_DTYPE_COUNT] = {"f32", "bf16", "i32"};
const char *dw_ir_dtype_name(dw_ir_dtype t) {
    return (unsigned)t < DW_IR_DTYPE_COUNT ? dtype_names[t] : "?";
}
bool dw_ir_dtype_parse(const char *name, dw_ir_dtype *out) {
    for (int i = 0; i < DW_IR_DTYPE_COUNT; i++)
        if (!strcmp(dtype_names[i], name)) {
            *out = (dw_ir_dtype)i;
            return true;
        }
    return false;
}

static const char *const init_names[] = {"normal", "ones", "zeros"};
const char *dw_init_name(dw_init_kind k) { return (unsigned)k <= DW_INIT_ZEROS ? init_names[k] : "?"; }
bool dw_init_parse(const char *name, dw_init_kind *out) {
    for (int i = 0; i <= DW_INIT_ZEROS; i++)
        if (!strcmp(init_names[i], name)) {
            *out = (dw_init_kind)i;
            return true;
        }
    return false;
}
