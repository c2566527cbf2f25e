/* Fuzz target: tokenizer.json loading (vocabulary, merges, added tokens,
 * pre-tokenizer regex), then a round trip of a fixed text through the
 * loaded tokenizer. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "tokenizer/tokenizer.h"

static const char TEXT[] = "Hello, world! 123 d\xc3\xa9j\xc3\xa0 vu\n\tdef f(x):  return x**2 <|endoftext|> \xf0\x9f\x99\x82";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write_input(data, size, ".json");
    struct olmo_tokenizer *t = NULL;
    if (!path || olmo_tokenizer_load(&t, path) != 0) return 0;
    struct olmo_encoder *e = olmo_encoder_new(t);
    if (e) {
        struct olmo_ids ids = {0};
        if (olmo_encode(e, TEXT, strlen(TEXT), 0, &ids, NULL, NULL) == 0) {
            char *out = NULL;
            size_t out_len = 0;
            if (olmo_decode(t, ids.ids, ids.n, false, &out, &out_len) == 0) free(out);
        }
        olmo_ids_free(&ids);
        olmo_encoder_free(e);
    }
    olmo_tokenizer_free(t);
    return 0;
}
