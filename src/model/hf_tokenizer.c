/* The tokenizer of a Hugging Face export (model/hf.h: olmo_hf_write_tokenizer). */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "model/hf.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"

/* A token id's content ("<|endoftext|>"), malloc'ed; NULL with the error set when the tokenizer lacks it. */
static char *token_content(const struct olmo_tokenizer *t, int id, const char *what) {
    if (id < 0 || (uint32_t)id >= olmo_tokenizer_vocab_size(t)) {
        olmo_error("%s %d is not an id of the tokenizer (vocabulary of %u)", what, id, olmo_tokenizer_vocab_size(t));
        return NULL;
    }
    const uint32_t u = (uint32_t)id;
    char *s = NULL;
    if (olmo_decode(t, &u, 1, false, &s, NULL)) {
        olmo_error_context("%s %d", what, id);
        return NULL;
    }
    return s;
}

int olmo_hf_write_tokenizer(const struct olmo_config *cfg, const char *tokenizer_path, const char *out_dir) {
    char path[4400], *json = NULL, *eos = NULL, *pad = NULL, *text = NULL;
    size_t len = 0;
    struct olmo_tokenizer *t = NULL;
    cJSON *c = NULL;
    int rc = -1;
    /* loaded first: a file olmoc cannot read as a tokenizer is refused, not copied */
    if (olmo_tokenizer_load(&t, tokenizer_path) || olmo_read_file(tokenizer_path, (size_t)1 << 30, &json, &len))
        goto done;
    if (!(eos = token_content(t, cfg->model.eos_token_id, "model.eos_token_id")) ||
        !(pad = token_content(t, cfg->model.pad_token_id, "model.pad_token_id")))
        goto done;
    snprintf(path, sizeof path, "%s/tokenizer.json", out_dir);
    if (olmo_write_file_atomic(path, json, len)) goto done;
    /* what transformers' AutoTokenizer reads beside tokenizer.json: the fast tokenizer class and the
     * special tokens the config names (Olmo 3 adds no BOS: OLMo-core's data has none) */
    if (!(c = cJSON_CreateObject()) || !cJSON_AddStringToObject(c, "tokenizer_class", "PreTrainedTokenizerFast") ||
        !cJSON_AddStringToObject(c, "eos_token", eos) || !cJSON_AddStringToObject(c, "pad_token", pad) ||
        !cJSON_AddNumberToObject(c, "model_max_length", cfg->train.seq_len) ||
        !cJSON_AddBoolToObject(c, "add_bos_token", false) || !cJSON_AddBoolToObject(c, "add_eos_token", false) ||
        !(text = cJSON_Print(c))) {
        olmo_error("out of memory for tokenizer_config.json");
        goto done;
    }
    snprintf(path, sizeof path, "%s/tokenizer_config.json", out_dir);
    const size_t n = strlen(text);
    text[n] = '\n'; /* cJSON_Print's terminator becomes the file's last newline */
    rc = olmo_write_file_atomic(path, text, n + 1);
done:
    if (rc) olmo_error_context("tokenizer %s", tokenizer_path);
    cJSON_Delete(c);
    free(text);
    free(eos);
    free(pad);
    free(json);
    olmo_tokenizer_free(t);
    return rc;
}
