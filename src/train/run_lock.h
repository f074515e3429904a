/* run_lock.h — private: one training run per run directory. An flock'ed DIR/.deepwell.lock holding
 * "pid P host H since T": a second run into the directory is refused at once naming the holder; a
 * lock left by a process that has ended (flock dies with its process) is taken over with a notice. */
#ifndef DW_TRAIN_RUN_LOCK_H
#define DW_TRAIN_RUN_LOCK_H

#include "deepwell.h"

/* Takes the lock of directory dir (which must exist); *fd is the held descriptor. DW_ERR_INVALID
 * when another live run holds it (the message names dir and the holder), DW_ERR_IO when the lock
 * file cannot be made. */
dw_status dw_run_lock(dw_ctx *ctx, const char *dir, int *fd);
/* Releases it and removes the lock file (fd < 0: nothing). */
void dw_run_unlock(const char *dir, int fd);

#endif /* DW_TRAIN_RUN_LOCK_H */
