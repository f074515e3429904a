/* cli.c — shared helpers for `deepwell` subcommands. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

void cli_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "deepwell %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void cli_escape(const char *s, size_t n, char *out, size_t cap) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char piece[8];
        if (c == '"' || c == '\\') snprintf(piece, sizeof piece, "\\%c", c);
        else if (c >= 0x20 && c < 0x7f) snprintf(piece, sizeof piece, "%c", c);
        else snprintf(piece, sizeof piece, "\\x%02x", c);
        size_t k = strlen(piece);
        if (o + k + 4 > cap) { /* room for "..." and the NUL */
            memcpy(out + o, "...", 3);
            o += 3;
            break;
        }
        memcpy(out + o, piece, k);
        o += k;
    }
    out[o] = '\0';
}

const char cli_exit_table[] =
    "Exit status (every command):\n"
    "  0        success\n"
    "  1        runtime failure (out of memory, CUDA, non-finite numbers, unsupported here)\n"
    "  2        usage or bad input (a flag, a value, a malformed file)\n"
    "  3        I/O failure: a file or stream cannot be opened, read or written (missing,\n"
    "           permissions, a full disk, standard output)\n"
    "  128 + N  interrupted by signal N (train: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 138 SIGUSR1,\n"
    "           after a checkpoint)\n";

int cli_finish(const char *cmd, int rc) {
    errno = 0;
    const bool flushed = fflush(stdout) == 0;
    const int err = errno;
    if (flushed && !ferror(stdout)) return rc;
    cli_error(cmd, "cannot write standard output: %s; the output is incomplete",
              err ? strerror(err) : "a write failed");
    return rc == DW_EXIT_OK ? DW_EXIT_IO : rc;
}

int cli_exit_for(dw_status s) {
    switch (s) {
    case DW_OK: return DW_EXIT_OK;
    case DW_ERR_INVALID:
    case DW_ERR_FORMAT: return DW_EXIT_USAGE;
    case DW_ERR_IO: return DW_EXIT_IO;
    default: return DW_EXIT_FAIL;
    }
}

int cli_fail(const char *cmd, const dw_ctx *ctx, dw_status s) {
    cli_error(cmd, "%s", dw_errmsg(ctx));
    return cli_exit_for(s);
}

bool cli_parse_int(const char *cmd, const char *flag, const char *text, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long v = text ? strtol(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v < lo || v > hi) {
        cli_error(cmd, "%s expects an integer in [%ld, %ld], got '%s'", flag, lo, hi,
                  text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_double(const char *cmd, const char *flag, const char *text, double *out) {
    char *end = NULL;
    errno = 0;
    double v = text ? strtod(text, &end) : 0;
    if (!text || !*text || *end || errno || !isfinite(v)) {
        cli_error(cmd, "%s expects a number, got '%s'", flag, text ? text : "");
        return false;
    }
    *out = v;
    return true;
}

bool cli_parse_recompute(const char *cmd, const char *text, int *mode, int *blocks) {
    char *end = NULL;
    *blocks = 0;
    if (!strcmp(text, "none")) *mode = DW_RECOMPUTE_NONE;
    else if (!strcmp(text, "selective")) *mode = DW_RECOMPUTE_SELECTIVE;
    else if (!strcmp(text, "full")) *mode = DW_RECOMPUTE_FULL;
    else {
        errno = 0;
        long n = strtol(text, &end, 10);
        if (!*text || *end || errno || n < 1 || n > 1000000) {
            cli_error(cmd, "--recompute must be none, selective, full or a block count N >= 1 (the first N blocks), "
                      "got '%s'",
                      text);
            return false;
        }
        *mode = DW_RECOMPUTE_FULL, *blocks = (int)n;
    }
    return true;
}

int cli_usage_error(const char *cmd) {
    fprintf(stderr, "Try 'deepwell %s --help'.\n", cmd);
    return DW_EXIT_USAGE;
}

/* One process per GPU: a rank of a launched job uses the GPU of its local rank (cudaSetDevice, as
 * PyTorch does; narrowing CUDA_VISIBLE_DEVICES instead would keep NCCL from CUDA IPC between the
 * ranks' GPUs), or the one GPU it sees when its launcher gave each rank its own. */
static bool pick_local_gpu(const char *cmd, int *index) {
    dw_dist_env de;
    if (dw_dist_env_get(&de) != DW_OK || de.world_size <= 1) return true; /* a malformed one: train says */
    dw_hw *hw = NULL;
    const int n = dw_probe(NULL, &hw) == DW_OK ? dw_hw_gpu_count(hw) : 0;
    dw_hw_free(hw);
    if (n == 0) return true; /* --device auto falls back to the CPU; cuda says there is no GPU */
    if (de.local_rank < n) *index = de.local_rank;
    else if (n == 1) *index = 0;
    else {
        cli_error(cmd, "local rank %d of %d on this node, but %d GPUs are visible: one process per GPU "
                  "(start at most %d ranks per node, or give each rank one GPU in CUDA_VISIBLE_DEVICES)",
                  de.local_rank, de.local_world_size, n, n);
        return false;
    }
    return true;
}

dw_status cli_ctx_create(const char *cmd, const char *device, dw_ctx **out) {
    *out = NULL;
    dw_ctx_opts o = {.device = DW_DEVICE_AUTO};
    if (!strcmp(device, "cpu")) o.device = DW_DEVICE_CPU;
    else if (!strcmp(device, "cuda")) o.device = DW_DEVICE_CUDA;
    else if (strcmp(device, "auto")) {
        cli_error(cmd, "--device must be cpu, cuda or auto, got '%s'", device);
        return DW_ERR_INVALID;
    }
    if (o.device == DW_DEVICE_CUDA && !dw_built_with_cuda()) {
        cli_error(cmd, "--device cuda: this build has no CUDA (configure with -DDW_CUDA=ON); use --device cpu");
        return DW_ERR_UNSUPPORTED;
    }
    if (o.device != DW_DEVICE_CPU && !pick_local_gpu(cmd, &o.device_index)) return DW_ERR_INVALID;
    dw_status s = dw_ctx_create(&o, out);
    if (s == DW_OK && o.device == DW_DEVICE_AUTO) { /* say which device auto chose, and why */
        if (dw_ctx_device(*out) == DW_DEVICE_CUDA) {
            dw_hw *hw = NULL;
            dw_gpu_info g = {.size = sizeof g};
            const bool named = dw_probe(*out, &hw) == DW_OK && dw_hw_get_gpu(hw, dw_ctx_device_index(*out), &g) == DW_OK;
            fprintf(stderr, "deepwell %s: --device auto: cuda:%d (%s)\n", cmd, dw_ctx_device_index(*out),
                    named ? g.name : "a usable GPU");
            dw_hw_free(hw);
        } else {
            fprintf(stderr, "deepwell %s: --device auto: cpu (%s)\n", cmd,
                    dw_built_with_cuda() ? "no usable GPU found" : "this build has no CUDA");
        }
    }
    if (s == DW_OK) return DW_OK;
    if (o.device == DW_DEVICE_CUDA) {
        cli_error(cmd, "--device cuda: no usable GPU (%s); use --device cpu", dw_errmsg(NULL));
        return DW_ERR_UNSUPPORTED;
    }
    cli_error(cmd, "%s", dw_errmsg(NULL));
    return s;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_io_init(void) { signal(SIGPIPE, SIG_IGN); }
