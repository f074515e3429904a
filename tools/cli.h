/* cli.h — shared helpers for `deepwell` subcommands: exit codes, number parsing, errors. */
#ifndef DW_TOOLS_CLI_H
#define DW_TOOLS_CLI_H

#include <stdbool.h>
#include <stddef.h>

#include "deepwell.h"

/* Exit status of every command (docs/cli.md; `deepwell --help`): 0 success; 1 a runtime failure
 * (out of memory, CUDA, numerics, unsupported here); 2 usage or bad input (a flag, a value, a
 * malformed file); 3 an I/O failure (a file or stream that cannot be opened, read or written:
 * missing, permissions, a full disk, standard output); 128 + N interrupted by signal N. */
enum { DW_EXIT_OK = 0, DW_EXIT_FAIL = 1, DW_EXIT_USAGE = 2, DW_EXIT_IO = 3 };
/* The table above as `--help` prints it. */
extern const char cli_exit_table[];

#define DW_COMMAND(name, fn, summary) int fn(int argc, char **argv);
#include "commands.h"
#undef DW_COMMAND

/* Prints "deepwell <cmd>: <message>" to stderr. */
void cli_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Maps a failed status to an exit code: bad input (invalid, format) → 2, io → 3, otherwise 1. */
int cli_exit_for(dw_status s);
/* Reports dw_errmsg(ctx) for a failed call and returns cli_exit_for(s). */
int cli_fail(const char *cmd, const dw_ctx *ctx, dw_status s);
/* Bytes from a file, fit to echo in a message: printable ASCII as is, quotes and backslashes and
 * every other byte as \", \\, \xNN; cut with "..." to fit cap (at least 8). */
void cli_escape(const char *s, size_t n, char *out, size_t cap);
/* Strict integer parsing of a flag value: the whole string, within [lo, hi]. */
bool cli_parse_int(const char *cmd, const char *flag, const char *text, long lo, long hi, long *out);
bool cli_parse_double(const char *cmd, const char *flag, const char *text, double *out);
/* A context for --device cpu|cuda|auto: cuda needs a CUDA build and a usable GPU; auto is cuda
 * when a GPU is usable, else cpu. On failure the reason is printed (as "deepwell CMD: ...") and
 * *out is NULL. */
dw_status cli_ctx_create(const char *cmd, const char *device, dw_ctx **out);
/* --recompute none | full | N (the first N blocks): *mode a dw_recompute, *blocks 0 (every block)
 * or N; false with the message printed when text is none of these. */
bool cli_parse_recompute(const char *cmd, const char *text, int *mode, int *blocks);
/* After a command: flushes standard output and checks that everything written to it arrived; if
 * not, says so and turns a success into DW_EXIT_IO. Returns the exit status. */
int cli_finish(const char *cmd, int rc);
/* getopt_long's "unknown option"/"missing argument" message already printed: add the hint. */
int cli_usage_error(const char *cmd);
/* Once, before any command: SIGPIPE ignored, so that a write to a closed pipe (stdout or stderr
 * piped into `head`) fails with EPIPE instead of killing the process: progress and log lines
 * written to stderr are best effort (training goes on), and a failed stdout still ends in
 * DW_EXIT_IO through cli_finish; the exit status stays the command's outcome. */
void cli_io_init(void);
/* Seconds on the monotonic clock (differences time a command's work). */
double cli_now(void);

#endif /* DW_TOOLS_CLI_H */
