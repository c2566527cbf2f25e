/* OLMo-core data mix files (the .txt files of olmo_core/data/mixes/, e.g.
 * OLMo-mix-0625-official.txt for Olmo 3 7B Stage 1): one "label,path" line
 * per token file, '#' comments and blank lines skipped; every path holds
 * "{TOKENIZER}", replaced by the tokenizer id, and is prefixed by the base
 * directory (with a '/' added when it lacks one), as DataMix.build does.  The
 * files form one dataset, concatenated in the order listed. */
#ifndef OLMOC_MIX_FILE_H
#define OLMOC_MIX_FILE_H

/* Reads the paths of a mix file; *paths (n_paths strings) is freed with
 * olmo_mix_file_free. */
int olmo_mix_file_paths(const char *file, const char *base_dir, const char *tokenizer, char ***paths,
                        int *n_paths);
void olmo_mix_file_free(char **paths, int n_paths);

#endif
