/* safetensors_dtype.c — the safetensors dtype table, the tensor-name rule, element counts and
 * alignment. Not the reader, the writer or the FP32 conversion (safetensors_convert.c). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/safetensors_priv.h"

typedef struct {
    const char *name;
    size_t size;
    bool is_float;
} dtype_info;

static const dtype_info dtypes[DW_DT_COUNT] = {
    [DW_DT_F64] = {"F64", 8, true},         [DW_DT_F32] = {"F32", 4, true},
    [DW_DT_F16] = {"F16", 2, true},         [DW_DT_BF16] = {"BF16", 2, true},
    [DW_DT_F8_E4M3] = {"F8_E4M3", 1, true}, [DW_DT_F8_E5M2] = {"F8_E5M2", 1, true},
    [DW_DT_I64] = {"I64", 8, false},        [DW_DT_I32] = {"I32", 4, false},
    [DW_DT_I16] = {"I16", 2, false},        [DW_DT_I8] = {"I8", 1, false},
    [DW_DT_U64] = {"U64", 8, false},        [DW_DT_U32] = {"U32", 4, false},
    [DW_DT_U16] = {"U16", 2, false},        [DW_DT_U8] = {"U8", 1, false},
    [DW_DT_BOOL] = {"BOOL", 1, false},
};
_Static_assert(sizeof dtypes / sizeof dtypes[0] == DW_DT_COUNT, "dtypes must cover dw_dtype");

static bool dtype_valid(dw_dtype t) { return (int)t >= 0 && t < DW_DT_COUNT; }

const char *dw_dtype_name(dw_dtype t) { return dtype_valid(t) ? dtypes[t].name : "?"; }
size_t dw_dtype_size(dw_dtype t) { return dtype_valid(t) ? dtypes[t].size : 0; }
bool dw_dtype_is_float(dw_dtype t) { return dtype_valid(t) && dtypes[t].is_float; }

bool dw_dtype_parse(const char *name, dw_dtype *out) {
    for (int i = 0; i < DW_DT_COUNT; i++)
        if (name && !strcmp(name, dtypes[i].name)) {
            *out = (dw_dtype)i;
            return true;
        }
    return false;
}

bool dw_st_name_ok(const char *name, size_t len, const char **why) {
    if (len == 0) {
        *why = "empty tensor name";
        return false;
    }
    if (len > DW_ST_MAX_NAME) {
        *why = "tensor name longer than 1024 bytes";
        return false;
    }
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)name[i] < 0x20 || (unsigned char)name[i] > 0x7E) {
            *why = "tensor name is not printable ASCII";
            return false;
        }
    if (len == 12 && !memcmp(name, "__metadata__", 12)) {
        *why = "'__metadata__' is reserved and cannot name a tensor";
        return false;
    }
    return true;
}

const char *dw_st_show_name(char *buf, size_t cap, const char *name, size_t len) {
    size_t o = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (o + 8 >= cap) { /* room for "..." and the NUL */
            memcpy(buf + o, "...", 3);
            o += 3;
            break;
        }
        if (c >= 0x20 && c <= 0x7E && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02X", c);
    }
    buf[o] = '\0';
    return buf;
}

int64_t dw_st_numel(const dw_st_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
    return n;
}

bool dw_st_is_aligned(const dw_st_tensor *t) {
    size_t a = dw_dtype_size(t->dtype);
    return a != 0 && (uintptr_t)t->data % a == 0;
}
