/* run_lock.c — the run directory's lock (run_lock.h): flock on DIR/.deepwell.lock, the holder's
 * pid, host and start time written inside for whoever is refused. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "train/ckpt.h"
#include "train/run_lock.h"

#define LOCK_NAME ".deepwell.lock"

/* What the lock file says, one line, printable (a damaged file must not garble the message). */
static void holder(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    if (n < 0) n = 0;
    buf[n] = '\0';
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            buf[i] = '\0';
            break;
        }
        if ((unsigned char)buf[i] < 0x20 || (unsigned char)buf[i] > 0x7E) buf[i] = '?';
    }
}

dw_status dw_run_lock(dw_ctx *ctx, const char *dir, int *fd_out) {
    *fd_out = -1;
    char *path = dw_path_join(dir, LOCK_NAME);
    if (!path) return dw_set_error(ctx, DW_ERR_NOMEM, "out of memory");
    dw_status st = DW_OK;
    for (int attempt = 0; attempt < 8; attempt++) {
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0) {
            st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot create the run lock: %s", path, strerror(errno));
            break;
        }
        char who[256];
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            const int err = errno;
            holder(fd, who, sizeof who);
            close(fd);
            if (err == EWOULDBLOCK)
                st = dw_set_error(ctx, DW_ERR_INVALID,
                                  "%s is in use by another training run (%s; lock %s): wait for it to end or choose "
                                  "another --out",
                                  dir, who[0] ? who : "holder unknown", path);
            else st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot lock: %s", path, strerror(err));
            break;
        }
        /* the holder before us may have removed the file between our open and our flock: then
         * this descriptor locks a name nobody else sees; start over */
        struct stat a, b;
        if (fstat(fd, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
            close(fd);
            continue;
        }
        holder(fd, who, sizeof who);
        if (who[0]) DW_LOGW("%s: taking over the run lock of a run that has ended (%s)", dir, who);
        char host[128] = "?", line[400];
        gethostname(host, sizeof host - 1);
        host[sizeof host - 1] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        char when[32] = "?";
        if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
        int n = snprintf(line, sizeof line, "pid %ld on host %s since %s\n", (long)getpid(), host, when);
        if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)n, 0) != n) {
            st = dw_set_error(ctx, DW_ERR_IO, "%s: cannot write the run lock: %s", path, strerror(errno));
            close(fd);
            break;
        }
        *fd_out = fd;
        break;
    }
    if (st == DW_OK && *fd_out < 0)
        st = dw_set_error(ctx, DW_ERR_IO, "%s: the run lock kept changing under us (another run starting?)", path);
    free(path);
    return st;
}

void dw_run_unlock(const char *dir, int fd) {
    if (fd < 0) return;
    char *path = dw_path_join(dir, LOCK_NAME);
    if (path) unlink(path); /* still holding it: a run that opened it before this sees a stale inode */
    free(path);
    close(fd);
}
