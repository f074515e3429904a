/* safetensors_priv.h — private to src/io/safetensors*.c: the tensor-name rule shared by the reader
 * and the writer, and a printable rendering of hostile names for error messages. */
#ifndef DW_IO_SAFETENSORS_PRIV_H
#define DW_IO_SAFETENSORS_PRIV_H

#include <stdbool.h>
#include <stddef.h>

/* A tensor name is 1..DW_ST_MAX_NAME bytes of printable ASCII (0x20..0x7E), not "__metadata__". */
#define DW_ST_MAX_NAME 1024
bool dw_st_name_ok(const char *name, size_t len, const char **why);

/* Writes `name` (len bytes, any content) into buf as printable ASCII: bytes outside 0x20..0x7E and
 * the backslash become \xNN, and long names are cut with "...". Returns buf. */
#define DW_ST_SHOWN_NAME 200
const char *dw_st_show_name(char *buf, size_t cap, const char *name, size_t len);

#endif /* DW_IO_SAFETENSORS_PRIV_H */
