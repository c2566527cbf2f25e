/* Outputs written as FILE.tmp and renamed into place (util/fs.h's
 * olmo_open_tmp / olmo_commit_tmp: olmo_write_file_atomic, the safetensors
 * writers, the tokenize pipeline).  An existing output that is a device, a
 * FIFO or a directory is refused and left as it was; a stale FILE.tmp (a
 * killed writer's) is removed, never written through.  Before these checks
 * the rename turned a character device into a regular file, and a symlink
 * left at FILE.tmp was followed.  The device is a null device node made in
 * the scratch directory (mknod c 1 3, as root; skipped otherwise), never a
 * system device.  Runs under ASan+UBSan too; an alarm turns a hang (opening
 * a FIFO for writing) into a failure. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "check.h"
#include "io/safetensors.h"
#include "util/error.h"
#include "util/fs.h"

static mode_t kind_of(const char *path) {
    struct stat st;
    return lstat(path, &st) ? 0 : (st.st_mode & S_IFMT);
}

static bool exists(const char *path) { return kind_of(path) != 0; }

/* A null device node (major 1, minor 3) in the scratch directory; false when
 * this user may not make one. */
static bool make_null_node(const char *name) {
    if (!mknod(path_of(name), S_IFCHR | 0666, makedev(1, 3))) return true;
    printf("note: cannot make a device node (%s): the device cases are skipped\n", strerror(errno));
    return false;
}

static int write_safetensors(const char *path, bool stream) {
    struct olmo_st_writer w = {0};
    const float v[4] = {1, 2, 3, 4};
    const int64_t shape[1] = {4};
    int rc;
    if (!stream) {
        rc = olmo_st_writer_add(&w, "w", OLMO_ST_F32, 1, shape, v) || olmo_st_writer_save(&w, path);
    } else {
        struct olmo_st_stream s = {0};
        rc = olmo_st_writer_declare(&w, "w", OLMO_ST_F32, 1, shape) || olmo_st_stream_begin(&s, &w, path);
        if (!rc) {
            rc = olmo_st_stream_write(&s, v, sizeof v) || olmo_st_stream_finish(&s);
            if (rc) olmo_st_stream_abort(&s);
        }
    }
    olmo_st_writer_free(&w);
    return rc ? -1 : 0;
}

/* Every writer on one special output: refused with a message naming it, the
 * node unchanged, no .tmp left. */
static void refuse_all_writers(const char *name, mode_t kind, const char *word) {
    const char *path = path_of(name);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(olmo_write_file_atomic(path, "x", 1) && error_has(name, word), "%s: atomic write: %s", name,
          olmo_last_error());
    CHECK(kind_of(path) == kind && !exists(tmp), "%s: atomic write changed the node or left a .tmp", name);
    CHECK(write_safetensors(path, false) && error_has(name, word), "%s: safetensors save: %s", name, olmo_last_error());
    CHECK(kind_of(path) == kind && !exists(tmp), "%s: safetensors save changed the node or left a .tmp", name);
    CHECK(write_safetensors(path, true) && error_has(name, word), "%s: safetensors stream: %s", name,
          olmo_last_error());
    CHECK(kind_of(path) == kind && !exists(tmp), "%s: safetensors stream changed the node or left a .tmp", name);
    CHECK(olmo_check_output(path, "weights file") && error_has(name, "not a regular file"), "%s: check: %s", name,
          olmo_last_error());
}

static void test_special_outputs_refused(void) {
    if (make_null_node("null")) refuse_all_writers("null", S_IFCHR, "character device");
    CHECK(!mkfifo(path_of("fifo"), 0644), "mkfifo: %s", strerror(errno));
    refuse_all_writers("fifo", S_IFIFO, "FIFO");
    CHECK(!mkdir(path_of("dir"), 0755), "mkdir: %s", strerror(errno));
    refuse_all_writers("dir", S_IFDIR, "directory");
    /* a symlink is judged by its target */
    if (exists(path_of("null"))) {
        CHECK(!symlink(path_of("null"), path_of("link-to-null")), "symlink: %s", strerror(errno));
        CHECK(olmo_write_file_atomic(path_of("link-to-null"), "x", 1) && error_has("link-to-null", "character device"),
              "symlink to a device: %s", olmo_last_error());
        CHECK(kind_of(path_of("null")) == S_IFCHR && kind_of(path_of("link-to-null")) == S_IFLNK,
              "symlink to a device replaced");
    }
    /* regular files and new paths are written as before */
    CHECK(!olmo_write_file_atomic(path_of("plain"), "abc", 3) && !olmo_write_file_atomic(path_of("plain"), "de", 2),
          "regular file: %s", olmo_last_error());
    char *text = NULL;
    size_t len = 0;
    CHECK(!olmo_read_file(path_of("plain"), 16, &text, &len) && len == 2 && !memcmp(text, "de", 2), "content");
    free(text);
    CHECK(!write_safetensors(path_of("w.safetensors"), false) && !write_safetensors(path_of("w2.safetensors"), true),
          "safetensors: %s", olmo_last_error());
}

/* A killed writer's FILE.tmp: a regular file is removed (the next write
 * succeeds, olmo_remove_stale_tmp removes it at a start), a symlink is
 * removed rather than written through, a FIFO or device there is refused
 * rather than opened (opening a FIFO for writing waits for a reader). */
static void test_stale_tmp(void) {
    write_text("out.tmp", "half a file a killed run left");
    CHECK(!olmo_write_file_atomic(path_of("out"), "new", 3) && !exists(path_of("out.tmp")), "stale .tmp: %s",
          olmo_last_error());
    write_text("out.tmp", "stale");
    CHECK(!olmo_remove_stale_tmp(path_of("out")) && !exists(path_of("out.tmp")), "remove_stale_tmp: %s",
          olmo_last_error());
    CHECK(!olmo_remove_stale_tmp(path_of("out")), "no .tmp: %s", olmo_last_error());
    write_text("victim", "precious");
    CHECK(!symlink(path_of("victim"), path_of("s.safetensors.tmp")), "symlink: %s", strerror(errno));
    CHECK(!write_safetensors(path_of("s.safetensors"), false), "through a stale symlink: %s", olmo_last_error());
    char *text = NULL;
    size_t len = 0;
    CHECK(!olmo_read_file(path_of("victim"), 64, &text, &len) && len == 8 && !memcmp(text, "precious", 8),
          "the symlink's target was written through");
    free(text);
    CHECK(kind_of(path_of("s.safetensors")) == S_IFREG && !exists(path_of("s.safetensors.tmp")),
          "the output is not the new regular file");
    CHECK(!mkfifo(path_of("f.tmp"), 0644), "mkfifo: %s", strerror(errno));
    CHECK(olmo_write_file_atomic(path_of("f"), "x", 1) && error_has("f.tmp", "FIFO"), "FIFO at .tmp: %s",
          olmo_last_error());
    CHECK(kind_of(path_of("f.tmp")) == S_IFIFO && !exists(path_of("f")), "FIFO at .tmp changed");
}

static const struct check_case tests[] = {
    {"special_outputs_refused", test_special_outputs_refused, 0},
    {"stale_tmp", test_stale_tmp, 0},
};

/* test_outputs [NAME...]: the named cases only (all by default). */
int main(int argc, char **argv) {
    return check_main("test_outputs", tests, sizeof tests / sizeof tests[0], argc, argv);
}
