#include "fuzz_input.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


const char *fuzz_write_input(const uint8_t *data, size_t n, const char *suffix) {
    static char path[256];
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(path, sizeof path, "%s/olmoc-fuzz-%d%s", dir, (int)getpid(), suffix);
    FILE *fp = fopen(path, "wb");
    if (!fp) {
        perror(path);
        return NULL;
    }
    size_t written = n ? fwrite(data, 1, n, fp) : 0;
    if (fclose(fp) != 0 || written != n) {
        perror(path);
        return NULL;
    }
    return path;
}
