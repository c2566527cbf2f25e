/* Small filesystem helpers for run directories and checkpoints: mkdir -p,
 * durable writes (fsync of files and of the directories that name them),
 * recursive removal of a checkpoint directory. */
#ifndef OLMOC_FS_H
#define OLMOC_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* mkdir -p (mode 0755). */
int olmo_make_dirs(const char *path);
/* fsync a file or directory by path. */
int olmo_fsync_path(const char *path);
/* Writes `len` bytes to `path` atomically: path.tmp, fsync, rename, fsync of the parent. */
int olmo_write_file_atomic(const char *path, const void *data, size_t len);
/* Opens path read-only, refusing anything but a regular file (a FIFO is not
 * waited on); `what` names it in messages ("token file", "config").  Returns
 * the descriptor, with the file's size in *size, or -1 with the error set. */
int olmo_open_regular(const char *path, const char *what, size_t *size);
/* Maps a whole non-empty regular file read-only (munmap(*map, *size) to release). */
int olmo_map_file(const char *path, const char *what, uint8_t **map, size_t *size);
/* Reads a whole file (at most max_bytes) into a NUL-terminated malloc'ed buffer. */
int olmo_read_file(const char *path, size_t max_bytes, char **out, size_t *len);
/* Removes a directory tree (regular files and subdirectories; symlinks are unlinked, not followed). */
int olmo_remove_tree(const char *path);
bool olmo_is_dir(const char *path);
bool olmo_is_file(const char *path);
/* The directory part of path ("." when there is none) into out. */
void olmo_dirname(const char *path, char *out, size_t n);

#endif
