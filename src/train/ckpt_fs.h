/* ckpt_fs.h — private: fsync by name (a file, or a directory so that renames in it persist). */
#ifndef DW_TRAIN_CKPT_FS_H
#define DW_TRAIN_CKPT_FS_H

#include <stdbool.h>

#include "deepwell.h"

dw_status dw_fsync_path(dw_ctx *ctx, const char *path, bool is_dir);

#endif /* DW_TRAIN_CKPT_FS_H */
