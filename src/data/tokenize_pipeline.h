/* Text or JSONL in, an OLMo token file out (what `olmoc tokenize` runs).
 *
 * The calling thread reads the inputs in ~1 MiB items cut at document (or,
 * for JSONL, line) boundaries and queues them; worker threads tokenize
 * items; a writer thread writes the results in input order, so the output
 * does not depend on the thread count.  At most 2 * threads + 2 items are in
 * flight, so memory stays constant whatever the input size (a JSONL line is
 * kept whole, so the longest line bounds it: a line over max_line_bytes is
 * refused, naming the file and line, before it is read whole).  A text document longer than
 * an item is streamed through the encoder's partial mode piece by piece,
 * which gives exactly the tokens of encoding it whole (unless one
 * pre-token grows past 4 MiB: see encode_piece). */
#ifndef OLMOC_TOKENIZE_PIPELINE_H
#define OLMOC_TOKENIZE_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>

#include "data/text_docs.h"

/* The longest JSONL line tokenized by default (a line costs about ten times
 * its size in memory while it is decoded and encoded). */
#define OLMO_TOKENIZE_MAX_LINE_DEFAULT ((size_t)64 << 20)

enum olmo_input_format { OLMO_FMT_AUTO, OLMO_FMT_JSONL, OLMO_FMT_TEXT };

struct olmo_tokenize_options {
    const char *tokenizer, *output, *text_key;
    const char **inputs; /* "-" = standard input; .gz files are decompressed */
    int n_inputs;
    enum olmo_input_format format;
    enum olmo_doc_unit docs; /* text: what one document is */
    bool strip;              /* JSONL: dolma's strip(), skipping documents left empty */
    bool skip_bad;           /* JSONL: skip (count) malformed lines instead of failing */
    size_t max_line_bytes;   /* JSONL: a longer line is an error; 0: OLMO_TOKENIZE_MAX_LINE_DEFAULT */
    bool raw;                /* a headerless array instead of .npy */
    bool parse_special;      /* match special tokens written in the text */
    bool quiet;              /* no progress line */
    int elem_size;           /* 2, 4, or 0: 2 when the vocabulary fits */
    const char *eos, *bos;   /* token or id; bos may be NULL */
    int threads;
};

/* Tokenizes o->inputs into o->output (written as OUTPUT.tmp, renamed when
 * complete; an output that is one of the inputs, or an existing one that is
 * not a regular file, such as a device or a FIFO, is refused; a killed run's
 * OUTPUT.tmp is removed at the start).  Progress and
 * a summary go to stderr. */
int olmo_tokenize(const struct olmo_tokenize_options *o);

#endif
