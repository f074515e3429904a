/* fileio.h — private: whole-file reads and atomic writes (temporary name, fsync, rename). */
#ifndef DW_CORE_FILEIO_H
#define DW_CORE_FILEIO_H

#include <stddef.h>

#include "deepwell.h"

#ifdef __cplusplus
extern "C" {
#endif

/* DW_OK when path is a regular file (after symbolic links); else DW_ERR_INVALID naming what it is
 * (a FIFO, a directory, a device, a socket), DW_ERR_IO when it cannot be examined. Asked before
 * opening: opening a FIFO would wait for a writer. */
dw_status dw_check_regular(dw_ctx *ctx, const char *path);
/* Opens a regular file for reading, refusing anything else by name before open() (as
 * dw_check_regular) and again after it (fstat); *fd_out is -1 on error, else owned by the caller.
 * *size_out (may be NULL) is its size. Every reader of a named file opens through this. */
dw_status dw_open_regular(dw_ctx *ctx, const char *path, int *fd_out, size_t *size_out);
/* Reads a whole regular file into a NUL-terminated malloc'd buffer. */
dw_status dw_read_file(dw_ctx *ctx, const char *path, char **data_out, size_t *size_out);

/* Writes `size` bytes to `path` atomically: writes "<path>.tmp.<pid>", fsyncs it, renames it over
 * path and fsyncs the directory. On any failure the temporary is removed and path is untouched. */
dw_status dw_write_file_atomic(dw_ctx *ctx, const char *path, const void *data, size_t size);

/* The file `from` copied to `to` (dw_read_file, then dw_write_file_atomic). */
dw_status dw_copy_file_atomic(dw_ctx *ctx, const char *from, const char *to);

/* Atomic writer for large or streamed files: open, write pieces, then commit or abort. */
typedef struct {
    int fd;
    char *path;
    char *tmp_path;
} dw_atomic_file;

dw_status dw_atomic_open(dw_ctx *ctx, dw_atomic_file *f, const char *path);
dw_status dw_atomic_write(dw_ctx *ctx, dw_atomic_file *f, const void *data, size_t size);
dw_status dw_atomic_commit(dw_ctx *ctx, dw_atomic_file *f); /* fsync + rename + fsync dir */
void dw_atomic_abort(dw_atomic_file *f);                      /* removes the temporary */

/* fsyncs the directory holding `path` (so a rename into it is durable). */
dw_status dw_fsync_parent_dir(dw_ctx *ctx, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* DW_CORE_FILEIO_H */
