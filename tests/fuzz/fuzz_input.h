/* Shared by the fuzz harnesses: the parsers under test read files, so each
 * input is written to a per-process file (on /dev/shm when it exists, a
 * tmpfs, else the temp directory) named with the suffix the parser expects. */
#ifndef OLMOC_FUZZ_INPUT_H
#define OLMOC_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>

/* Writes data[0, n) to the harness's scratch file with the given suffix
 * (e.g. ".npy") and returns its path, or NULL (message on stderr) when it
 * cannot be written: a harness then returns without parsing. */
const char *fuzz_write_input(const uint8_t *data, size_t n, const char *suffix);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif
