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
/* Writes `len` bytes to `path` atomically: path.tmp, fsync, rename, fsync of the parent
 * (through olmo_open_tmp / olmo_commit_tmp). */
int olmo_write_file_atomic(const char *path, const void *data, size_t len);

/* Outputs written as path.tmp and renamed into place.  An existing output
 * that is not a regular file (a character or block device such as
 * /dev/null, a FIFO, a socket, a directory; a symlink is judged by its
 * target) is refused, never replaced: the rename would turn a device into a
 * regular file.  `what` names the output in messages ("token file"). */
int olmo_check_output(const char *path, const char *what);
/* Removes path.tmp, the temporary a killed writer of path left behind (0 when
 * there is none; one that is not a regular file or a symlink is refused). */
int olmo_remove_stale_tmp(const char *path);
/* Starts a new version of the output path: olmo_check_output, removes a stale
 * path.tmp, creates path.tmp exclusively (O_EXCL, not following a symlink)
 * and writes its name to tmp (n bytes).  Returns the descriptor, or -1 with
 * the error set. */
int olmo_open_tmp(const char *path, const char *what, char *tmp, size_t n);
/* Renames tmp (written and closed) onto path, checking path again first;
 * removes tmp on failure. */
int olmo_commit_tmp(const char *tmp, const char *path, const char *what);
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
