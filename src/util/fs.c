#include "util/fs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

int olmo_make_dirs(const char *path) {
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return olmo_error("path too long: '%s'", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) && errno != EEXIST) return olmo_error("cannot create '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) && errno != EEXIST) return olmo_error("cannot create '%s': %s", buf, strerror(errno));
    if (!olmo_is_dir(buf)) return olmo_error("'%s' exists and is not a directory", buf);
    return 0;
}

int olmo_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return olmo_error("cannot open '%s' to sync it: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    /* Some filesystems refuse fsync on directories (EINVAL); nothing more can be done there. */
    if (rc && err != EINVAL) return olmo_error("fsync of '%s' failed: %s", path, strerror(err));
    return 0;
}

void olmo_dirname(const char *path, char *out, size_t n) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

static const char *file_kind(mode_t m) {
    if (S_ISDIR(m)) return "directory";
    if (S_ISFIFO(m)) return "FIFO";
    if (S_ISCHR(m)) return "character device";
    if (S_ISBLK(m)) return "block device";
    if (S_ISSOCK(m)) return "socket";
    return "special file";
}

int olmo_check_output(const char *path, const char *what) {
    struct stat st;
    if (stat(path, &st)) return 0; /* new (or unreadable: creating it will say why) */
    if (!S_ISREG(st.st_mode))
        return olmo_error("the output %s '%s' exists and is a %s, not a regular file: refusing to replace it "
                          "(choose a file path)",
                          what, path, file_kind(st.st_mode));
    return 0;
}

static int tmp_name(const char *path, char *tmp, size_t n) {
    if (snprintf(tmp, n, "%s.tmp", path) >= (int)n) return olmo_error("path too long: '%s'", path);
    return 0;
}

static int remove_tmp(const char *tmp) {
    struct stat st;
    if (lstat(tmp, &st)) return errno == ENOENT ? 0 : olmo_error("cannot stat '%s': %s", tmp, strerror(errno));
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
        return olmo_error("'%s' is a %s, not a temporary olmoc wrote: move it away", tmp, file_kind(st.st_mode));
    if (unlink(tmp) && errno != ENOENT) return olmo_error("cannot remove the stale '%s': %s", tmp, strerror(errno));
    return 0;
}

int olmo_remove_stale_tmp(const char *path) {
    char tmp[4200];
    return tmp_name(path, tmp, sizeof tmp) || remove_tmp(tmp) ? -1 : 0;
}

int olmo_open_tmp(const char *path, const char *what, char *tmp, size_t n) {
    if (olmo_check_output(path, what) || tmp_name(path, tmp, n) || remove_tmp(tmp)) return -1;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return olmo_error("cannot create '%s': %s", tmp, strerror(errno));
    return fd;
}

int olmo_commit_tmp(const char *tmp, const char *path, const char *what) {
    if (olmo_check_output(path, what)) {
        unlink(tmp);
        return -1;
    }
    if (rename(tmp, path)) {
        int err = errno;
        unlink(tmp);
        return olmo_error("cannot rename '%s' to '%s': %s", tmp, path, strerror(err));
    }
    return 0;
}

int olmo_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4200], dir[4096];
    int fd = olmo_open_tmp(path, "file", tmp, sizeof tmp);
    if (fd < 0) return -1;
    const char *p = data;
    size_t left = len;
    while (left) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int err = errno;
            close(fd);
            unlink(tmp);
            return olmo_error("writing '%s' failed: %s", tmp, strerror(err));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) || close(fd)) {
        unlink(tmp);
        return olmo_error("writing '%s' failed: %s", tmp, strerror(errno));
    }
    if (olmo_commit_tmp(tmp, path, "file")) return -1;
    olmo_dirname(path, dir, sizeof dir);
    return olmo_fsync_path(dir);
}

int olmo_open_regular(const char *path, const char *what, size_t *size) {
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below) */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return olmo_error("cannot open %s '%s': %s", what, path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st)) {
        int err = errno;
        close(fd);
        return olmo_error("cannot stat %s '%s': %s", what, path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return olmo_error("%s '%s' is not a regular file (it is a %s)", what, path, file_kind(st.st_mode));
    }
    *size = (size_t)st.st_size;
    return fd;
}

int olmo_map_file(const char *path, const char *what, uint8_t **map, size_t *size) {
    *map = NULL;
    int fd = olmo_open_regular(path, what, size);
    if (fd < 0) return -1;
    if (*size == 0) {
        close(fd);
        return olmo_error("%s '%s' is empty", what, path);
    }
    void *m = mmap(NULL, *size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) return olmo_error("cannot map %s '%s': %s", what, path, strerror(errno));
    *map = m;
    return 0;
}

int olmo_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    size_t size;
    int fd = olmo_open_regular(path, "file", &size);
    FILE *fp = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!fp) {
        if (fd >= 0) {
            close(fd);
            return olmo_error("cannot open '%s': %s", path, strerror(errno));
        }
        return -1;
    }
    if (size > max_bytes) {
        fclose(fp);
        return olmo_error("'%s' is %zu bytes, more than the %zu allowed", path, size, max_bytes);
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        fclose(fp);
        return olmo_error("out of memory reading '%s'", path);
    }
    size_t got = fread(buf, 1, size, fp);
    fclose(fp);
    if (got != size) {
        free(buf);
        return olmo_error("short read of '%s'", path);
    }
    buf[got] = 0;
    *out = buf;
    if (len) *len = got;
    return 0;
}

int olmo_remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st)) return errno == ENOENT ? 0 : olmo_error("cannot stat '%s': %s", path, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlink(path)) return olmo_error("cannot remove '%s': %s", path, strerror(errno));
        return 0;
    }
    DIR *d = opendir(path);
    if (!d) return olmo_error("cannot open directory '%s': %s", path, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char child[4096];
        if (snprintf(child, sizeof child, "%s/%s", path, e->d_name) >= (int)sizeof child)
            rc = olmo_error("path too long under '%s'", path);
        else rc = olmo_remove_tree(child);
    }
    closedir(d);
    if (!rc && rmdir(path)) rc = olmo_error("cannot remove '%s': %s", path, strerror(errno));
    return rc;
}

bool olmo_is_dir(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

bool olmo_is_file(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISREG(st.st_mode);
}
