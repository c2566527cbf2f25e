/* The .npy format for 1-D token arrays: the header olmoc tokenize writes
 * (version 1, '<u2' or '<u4', padded to 128 bytes so that the final header
 * can overwrite the provisional one in place) and the header token files
 * are read with (versions 1-3, '<u2', '<u4' or '<i4', C order). */
#ifndef OLMOC_NPY_H
#define OLMOC_NPY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Whether p[0, size) starts with the .npy magic. */
int olmo_npy_is_npy(const uint8_t *p, size_t size);
/* Writes the 128-byte header of a 1-D little-endian unsigned array of n
 * elements of elem_size (2 or 4) bytes; -1 on a write error. */
int olmo_npy_write_header(FILE *f, int elem_size, uint64_t n);
/* Parses the header of the .npy file p[0, size) (path for errors): the
 * element size, where the data starts and how many elements it holds
 * (checked against the file size). */
int olmo_npy_parse_header(const uint8_t *p, size_t size, const char *path, int *elem_size, size_t *data_offset,
                          size_t *n_elems);

#endif
