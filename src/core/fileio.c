/* fileio.c — whole-file reads and atomic writes (see fileio.h). */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"

static dw_status refuse_kind(dw_ctx *ctx, const char *path, mode_t mode) {
    const char *what = S_ISFIFO(mode)   ? "a FIFO (named pipe)"
                       : S_ISDIR(mode)  ? "a directory"
                       : S_ISCHR(mode)  ? "a character device"
                       : S_ISBLK(mode)  ? "a block device"
                       : S_ISSOCK(mode) ? "a socket"
                                        : "not a file";
    return dw_set_error(ctx, DW_ERR_INVALID, "%s: %s, not a regular file: give a file (it is read whole)", path, what);
}

dw_status dw_check_regular(dw_ctx *ctx, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return dw_set_error(ctx, DW_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    return S_ISREG(st.st_mode) ? DW_OK : refuse_kind(ctx, path, st.st_mode);
}

dw_status dw_open_regular(dw_ctx *ctx, const char *path, int *fd_out, size_t *size_out) {
    *fd_out = -1;
    if (size_out) *size_out = 0;
    DW_TRY(dw_check_regular(ctx, path)); /* a device is never opened at all */
    /* O_NONBLOCK: a FIFO put in its place since the stat() cannot make open() wait. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return dw_set_error(ctx, DW_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        dw_status s = dw_set_error(ctx, DW_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return refuse_kind(ctx, path, st.st_mode);
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    if (size_out) *size_out = (size_t)st.st_size;
    return DW_OK;
}

dw_status dw_read_file(dw_ctx *ctx, const char *path, char **data_out, size_t *size_out) {
    *data_out = NULL;
    if (size_out) *size_out = 0;
    int fd;
    size_t size;
    DW_TRY(dw_open_regular(ctx, path, &fd, &size));
    FILE *fp = fdopen(fd, "rb");
    if (!fp) {
        dw_status s = dw_set_error(ctx, DW_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(fp);
        return dw_set_error(ctx, DW_ERR_NOMEM, "%s: cannot allocate %zu bytes to read it", path, size);
    }
    size_t got = fread(buf, 1, size, fp);
    int err = ferror(fp);
    fclose(fp);
    if (got != size || err) {
        free(buf);
        return dw_set_error(ctx, DW_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, size);
    }
    buf[size] = '\0';
    *data_out = buf;
    if (size_out) *size_out = size;
    return DW_OK;
}

dw_status dw_fsync_parent_dir(dw_ctx *ctx, const char *path) {
    char *copy = strdup(path);
    if (!copy) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    const char *dir = dirname(copy);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) {
        dw_status s = dw_set_error(ctx, DW_ERR_IO, "%s: cannot open directory to fsync: %s", dir,
                                   strerror(errno));
        free(copy);
        return s;
    }
    int rc = fsync(fd);
    close(fd);
    free(copy);
    /* Some filesystems refuse fsync on directories (EINVAL); the rename itself already happened. */
    if (rc != 0 && errno != EINVAL)
        return dw_set_error(ctx, DW_ERR_IO, "%s: fsync of its directory failed: %s", path,
                            strerror(errno));
    return DW_OK;
}

dw_status dw_atomic_open(dw_ctx *ctx, dw_atomic_file *f, const char *path) {
    memset(f, 0, sizeof *f);
    f->fd = -1;
    size_t n = strlen(path) + 64;
    f->path = strdup(path);
    f->tmp_path = malloc(n);
    if (!f->path || !f->tmp_path) {
        dw_atomic_abort(f);
        return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    }
    snprintf(f->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    f->fd = open(f->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (f->fd < 0) {
        dw_status s = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create temporary file %s: %s", path,
                                   f->tmp_path, strerror(errno));
        dw_atomic_abort(f);
        return s;
    }
    return DW_OK;
}

dw_status dw_atomic_write(dw_ctx *ctx, dw_atomic_file *f, const void *data, size_t size) {
    const unsigned char *p = data;
    while (size > 0) {
        ssize_t w = write(f->fd, p, size);
        if (w < 0) {
            if (errno == EINTR) continue;
            return dw_set_error(ctx, DW_ERR_IO, "%s: write failed: %s", f->path, strerror(errno));
        }
        p += w;
        size -= (size_t)w;
    }
    return DW_OK;
}

dw_status dw_atomic_commit(dw_ctx *ctx, dw_atomic_file *f) {
    dw_status s = DW_OK;
    if (fsync(f->fd) != 0)
        s = dw_set_error(ctx, DW_ERR_IO, "%s: fsync failed: %s", f->path, strerror(errno));
    if (close(f->fd) != 0 && s == DW_OK)
        s = dw_set_error(ctx, DW_ERR_IO, "%s: close failed: %s", f->path, strerror(errno));
    f->fd = -1;
    if (s == DW_OK && rename(f->tmp_path, f->path) != 0)
        s = dw_set_error(ctx, DW_ERR_IO, "%s: rename from %s failed: %s", f->path, f->tmp_path,
                         strerror(errno));
    if (s == DW_OK) {
        s = dw_fsync_parent_dir(ctx, f->path);
        free(f->tmp_path);
        f->tmp_path = NULL; /* renamed: nothing to remove */
    }
    dw_atomic_abort(f);
    return s;
}

void dw_atomic_abort(dw_atomic_file *f) {
    if (f->fd >= 0) close(f->fd);
    if (f->tmp_path) unlink(f->tmp_path);
    free(f->tmp_path);
    free(f->path);
    f->fd = -1;
    f->tmp_path = NULL;
    f->path = NULL;
}

dw_status dw_write_file_atomic(dw_ctx *ctx, const char *path, const void *data, size_t size) {
    dw_atomic_file f;
    DW_TRY(dw_atomic_open(ctx, &f, path));
    dw_status s = dw_atomic_write(ctx, &f, data, size);
    if (s != DW_OK) {
        dw_atomic_abort(&f);
        return s;
    }
    return dw_atomic_commit(ctx, &f);
}

dw_status dw_copy_file_atomic(dw_ctx *ctx, const char *from, const char *to) {
    char *data = NULL;
    size_t size = 0;
    DW_TRY(dw_read_file(ctx, from, &data, &size));
    dw_status s = dw_write_file_atomic(ctx, to, data, size);
    free(data);
    return s;
}
