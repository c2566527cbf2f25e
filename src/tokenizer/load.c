/* Loading tokenizer.json: the BPE model (vocabulary, merges), the added
 * tokens, the pre-tokenizer steps and the decode table. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tokenizer/internal.h"
#include "util/error.h"

/* GPT-2 byte <-> unicode alphabet. */
static uint32_t byte_to_cp[256];
static int16_t cp_to_byte[324];

static void build_byte_alphabet(void) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        byte_to_cp[b] = keep ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) cp_to_byte[byte_to_cp[b]] = (int16_t)b;
}

static void init_byte_alphabet(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, build_byte_alphabet);
}

/* Byte-level spelling -> raw bytes; returns -1 when a character is outside the alphabet. */
static long spelling_to_bytes(const char *s, size_t n, uint8_t *out) {
    size_t i = 0, o = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = olmo_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (!k || cp >= 324 || cp_to_byte[cp] < 0) return -1;
        i += k;
        out[o++] = (uint8_t)cp_to_byte[cp];
    }
    return (long)o;
}

bool olmo_tok_json_bool(const cJSON *obj, const char *key, bool def) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (cJSON_IsBool(v)) return cJSON_IsTrue(v);
    return def;
}

static char *read_whole_file(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        olmo_error("cannot open tokenizer '%s': %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(fp), &st)) {
        fclose(fp);
        olmo_error("cannot stat '%s': %s", path, strerror(errno));
        return NULL;
    }
    char *buf = olmo_malloc((size_t)st.st_size + 1, "tokenizer.json");
    if (!buf) {
        fclose(fp);
        return NULL;
    }
    size_t n = fread(buf, 1, (size_t)st.st_size, fp);
    fclose(fp);
    if (n != (size_t)st.st_size) {
        free(buf);
        olmo_error("short read on '%s'", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* A token id: a whole number in [0, OLMO_TOKENIZER_MAX_IDS).  Per-id tables
 * are sized by the largest id, so an absurd one (say 2^31 - 2) would cost
 * seconds and gigabytes before anything else is checked: refused here.
 * Returns 0, -1 when v is not an id at all, -2 when it is too large. */
static int json_id(const cJSON *v, uint32_t *id) {
    /* the range first: converting a double past long long's range to an integer is undefined */
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble)) return -1;
    if (v->valuedouble >= (double)OLMO_TOKENIZER_MAX_IDS) return -2;
    *id = (uint32_t)v->valuedouble;
    return 0;
}

static int bad_id(const struct olmo_tokenizer *t, const char *what, const cJSON *v, int why) {
    if (why == -2)
        return olmo_error("'%s': %s has id %.0f; token ids must be below %u (olmoc's limit on the vocabulary size)",
                          t->path, what, v->valuedouble, (unsigned)OLMO_TOKENIZER_MAX_IDS);
    return olmo_error("'%s': %s has a bad id (not a whole number >= 0)", t->path, what);
}

static int cmp_added(const void *a, const void *b) {
    const struct added_token *x = a, *y = b;
    if (x->content[0] != y->content[0]) return x->content[0] < y->content[0] ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int set_token(struct olmo_tokenizer *t, uint32_t id, const char *content) {
    free(t->id_token[id]);
    t->id_token[id] = strdup(content);
    if (!t->id_token[id]) return olmo_error("out of memory");
    return 0;
}

/* model.vocab (and the ids of added_tokens, which size the tables). */
static int load_vocab(struct olmo_tokenizer *t, const cJSON *model, const cJSON *root) {
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return olmo_error("'%s': model has no \"vocab\" object", t->path);
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    /* vocabulary size: 1 + largest id */
    uint32_t max_id = 0;
    size_t n_vocab = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab) {
        uint32_t id;
        int why = json_id(it, &id);
        if (why) {
            char what[100];
            snprintf(what, sizeof what, "vocab entry '%.60s'", it->string);
            return bad_id(t, what, it, why);
        }
        if (id + 1 > max_id) max_id = id + 1;
        n_vocab++;
    }
    if (cJSON_IsArray(added)) {
        cJSON_ArrayForEach(it, added) {
            uint32_t id;
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(it, "id");
            int why = json_id(v, &id);
            if (why) return bad_id(t, "an added token", v, why);
            if (id + 1 > max_id) max_id = id + 1;
        }
    }
    if (max_id == 0) return olmo_error("'%s': empty vocabulary", t->path);
    t->vocab_size = max_id;
    t->id_token = olmo_calloc(max_id, sizeof(char *), "vocabulary");
    t->is_special = olmo_calloc(max_id, sizeof(bool), "vocabulary");
    if (!t->id_token || !t->is_special) return -1;
    if (olmo_strmap_init(&t->by_content, n_vocab) || olmo_strmap_init(&t->by_bytes, n_vocab)) return -1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    uint8_t *buf = NULL;
    size_t buf_cap = 0;
    cJSON_ArrayForEach(it, vocab) {
        uint32_t id = 0;
        json_id(it, &id);
        size_t n = strlen(it->string);
        if (n + 1 > buf_cap) {
            buf_cap = 2 * (n + 1);
            uint8_t *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return olmo_error("out of memory");
            }
            buf = nb;
        }
        if (set_token(t, id, it->string) || olmo_strmap_put(&t->by_content, it->string, n, (int32_t)id)) {
            free(buf);
            return -1;
        }
        long nb = spelling_to_bytes(it->string, n, buf);
        if (nb > 0) {
            if (olmo_strmap_put(&t->by_bytes, buf, (size_t)nb, (int32_t)id)) {
                free(buf);
                return -1;
            }
            if (nb == 1) t->byte_id[buf[0]] = (int32_t)id;
        }
    }
    free(buf);

    return 0;
}

/* model.merges: "a b" strings or ["a", "b"] pairs, in rank order. */
static int load_merges(struct olmo_tokenizer *t, const cJSON *model) {
    const cJSON *it;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    size_t n_merges = cJSON_IsArray(merges) ? (size_t)cJSON_GetArraySize(merges) : 0;
    if (olmo_pairmap_init(&t->merges, n_merges)) return -1;
    uint32_t rank = 0;
    char *joined = NULL;
    size_t joined_cap = 0;
    cJSON_ArrayForEach(it, merges) {
        const char *a, *b;
        size_t la, lb;
        char *space = NULL;
        if (cJSON_IsString(it)) {
            space = strchr(it->valuestring, ' ');
            if (!space || strchr(space + 1, ' ')) {
                free(joined);
                return olmo_error("'%s': merge #%u '%.60s' is not two tokens separated by a space", t->path, rank,
                                  it->valuestring);
            }
            a = it->valuestring;
            la = (size_t)(space - a);
            b = space + 1;
            lb = strlen(b);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            a = it->child->valuestring;
            b = it->child->next->valuestring;
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(joined);
            return olmo_error("'%s': merge #%u is neither \"a b\" nor [\"a\", \"b\"]", t->path, rank);
        }
        if (la + lb + 1 > joined_cap) {
            joined_cap = 2 * (la + lb + 1);
            char *nj = realloc(joined, joined_cap);
            if (!nj) {
                free(joined);
                return olmo_error("out of memory");
            }
            joined = nj;
        }
        memcpy(joined, a, la);
        memcpy(joined + la, b, lb);
        int32_t ia = olmo_strmap_get(&t->by_content, a, la), ib = olmo_strmap_get(&t->by_content, b, lb);
        int32_t ij = olmo_strmap_get(&t->by_content, joined, la + lb);
        if (ia < 0 || ib < 0 || ij < 0) {
            joined[la + lb] = 0;
            olmo_error("'%s': merge #%u: token '%.60s' is not in the vocabulary", t->path, rank,
                       ia < 0 ? a : ib < 0 ? b : joined);
            free(joined);
            return -1;
        }
        olmo_pairmap_add(&t->merges, (uint32_t)ia, (uint32_t)ib, rank, (uint32_t)ij);
        rank++;
    }
    free(joined);
    return 0;
}

static int load_model(struct olmo_tokenizer *t, const cJSON *root) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsObject(model)) return olmo_error("'%s': no \"model\" object", t->path);
    if (mtype && (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE")))
        return olmo_error("'%s': model type '%s' is not supported (only BPE)", t->path,
                          cJSON_IsString(mtype) ? mtype->valuestring : "?");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return olmo_error("'%s': BPE dropout is not supported", t->path);
    const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(model, affixes[i]);
        if (a && !cJSON_IsNull(a) && !(cJSON_IsString(a) && !a->valuestring[0]))
            return olmo_error("'%s': BPE %s is not supported", t->path, affixes[i]);
    }
    if (olmo_tok_json_bool(model, "byte_fallback", false))
        return olmo_error("'%s': BPE byte_fallback is not supported (byte-level BPE does not need it)", t->path);
    t->fuse_unk = olmo_tok_json_bool(model, "fuse_unk", false);
    t->ignore_merges = olmo_tok_json_bool(model, "ignore_merges", false);

    if (load_vocab(t, model, root)) return -1;
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    t->unk_id = -1;
    if (cJSON_IsString(unk)) {
        t->unk_id = olmo_strmap_get(&t->by_content, unk->valuestring, strlen(unk->valuestring));
        if (t->unk_id < 0)
            return olmo_error("'%s': unk_token '%s' is not in the vocabulary", t->path, unk->valuestring);
    }

    return load_merges(t, model);
}

static int load_added(struct olmo_tokenizer *t, const cJSON *root) {
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!cJSON_IsArray(added)) return 0;
    size_t n = (size_t)cJSON_GetArraySize(added);
    t->added = olmo_calloc(n, sizeof *t->added, "added tokens");
    if (!t->added) return -1;
    const cJSON *it;
    cJSON_ArrayForEach(it, added) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        uint32_t id = 0;
        json_id(cJSON_GetObjectItemCaseSensitive(it, "id"), &id);
        if (!cJSON_IsString(content) || !content->valuestring[0])
            return olmo_error("'%s': added token %u has no content", t->path, id);
        struct added_token *a = &t->added[t->n_added++];
        a->len = strlen(content->valuestring);
        a->content = (uint8_t *)strdup(content->valuestring);
        if (!a->content) return olmo_error("out of memory");
        a->id = id;
        a->special = olmo_tok_json_bool(it, "special", false);
        a->lstrip = olmo_tok_json_bool(it, "lstrip", false);
        a->rstrip = olmo_tok_json_bool(it, "rstrip", false);
        a->single_word = olmo_tok_json_bool(it, "single_word", false);
        if (a->lstrip) t->any_lstrip = true;
        if (a->single_word) t->any_single_word = true;
        if (a->len > t->max_added_len) t->max_added_len = a->len;
        if (set_token(t, id, content->valuestring)) return -1;
        t->is_special[id] = a->special;
    }
    qsort(t->added, t->n_added, sizeof *t->added, cmp_added);
    for (size_t i = t->n_added; i-- > 0;) {
        uint8_t b = t->added[i].content[0];
        t->added_first[b] = i;
        t->added_count[b]++;
    }
    return 0;
}

/* Decode bytes of every token: the ByteLevel decoder maps each character
 * back to its byte, unless a character is outside the alphabet, in which
 * case the token's UTF-8 is used as it is. */
static int build_decode_table(struct olmo_tokenizer *t) {
    size_t total = 0;
    for (uint32_t i = 0; i < t->vocab_size; i++)
        if (t->id_token[i]) total += strlen(t->id_token[i]);
    t->dec_arena = olmo_malloc(total + 1, "decode table");
    t->dec_off = olmo_calloc(t->vocab_size, sizeof(uint32_t), "decode table");
    t->dec_len = olmo_calloc(t->vocab_size, sizeof(uint32_t), "decode table");
    if (!t->dec_arena || !t->dec_off || !t->dec_len) return -1;
    size_t o = 0;
    for (uint32_t i = 0; i < t->vocab_size; i++) {
        const char *s = t->id_token[i];
        if (!s) continue;
        size_t n = strlen(s);
        long nb = spelling_to_bytes(s, n, t->dec_arena + o);
        if (nb < 0) {
            memcpy(t->dec_arena + o, s, n);
            nb = (long)n;
        }
        t->dec_off[i] = (uint32_t)o;
        t->dec_len[i] = (uint32_t)nb;
        o += (size_t)nb;
    }
    return 0;
}

int olmo_tokenizer_load(struct olmo_tokenizer **out, const char *path) {
    init_byte_alphabet();
    *out = NULL;
    size_t len;
    char *text = read_whole_file(path, &len);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!root) {
        const char *where = cJSON_GetErrorPtr();
        size_t off = where && where >= text && where <= text + len ? (size_t)(where - text) : 0;
        free(text);
        return olmo_error("'%s': not valid JSON (error near byte offset %zu)", path, off);
    }
    free(text);
    struct olmo_tokenizer *t = olmo_calloc(1, sizeof *t, "tokenizer");
    if (!t) {
        cJSON_Delete(root);
        return -1;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
    int rc = -1;
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (norm && !cJSON_IsNull(norm)) {
        const cJSON *nt = cJSON_GetObjectItemCaseSensitive(norm, "type");
        olmo_error("'%s': normalizer '%s' is not supported (only null)", path,
                   cJSON_IsString(nt) ? nt->valuestring : "?");
        goto done;
    }
    if (load_model(t, root) || load_added(t, root)) goto done;
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (pt && !cJSON_IsNull(pt) && olmo_tok_add_step(t, pt)) goto done;
    int bl = -1;
    for (int i = 0; i < t->n_steps; i++)
        if (t->steps[i].byte_level) bl = i;
    if (bl != t->n_steps - 1 || bl < 0) {
        olmo_error("'%s': the pre_tokenizer must end with ByteLevel (only byte-level BPE is supported)", path);
        goto done;
    }
    for (int i = 0; i < bl; i++)
        if (t->steps[i].byte_level) {
            olmo_error("'%s': ByteLevel may appear only once, as the last pre_tokenizer", path);
            goto done;
        }
    const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(dec, "type");
    t->has_decoder = cJSON_IsString(dt) && !strcmp(dt->valuestring, "ByteLevel");
    if (build_decode_table(t)) goto done;
    if (t->any_single_word) {
        int err;
        PCRE2_SIZE eo;
        t->word_re = pcre2_compile((PCRE2_SPTR) "^[\\p{Alphabetic}\\p{N}_]", PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &eo, NULL);
        if (!t->word_re) {
            olmo_error("internal: word-character regex does not compile");
            goto done;
        }
    }
    rc = 0;
done:
    cJSON_Delete(root);
    if (rc) {
        olmo_tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void olmo_tokenizer_free(struct olmo_tokenizer *t) {
    if (!t) return;
    if (t->id_token)
        for (uint32_t i = 0; i < t->vocab_size; i++) free(t->id_token[i]);
    free(t->id_token);
    free(t->is_special);
    free(t->dec_arena);
    free(t->dec_off);
    free(t->dec_len);
    olmo_strmap_free(&t->by_content);
    olmo_strmap_free(&t->by_bytes);
    olmo_pairmap_free(&t->merges);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    for (int i = 0; i < t->n_steps; i++) pcre2_code_free(t->steps[i].re);
    pcre2_code_free(t->word_re);
    free(t);
}

uint32_t olmo_tokenizer_vocab_size(const struct olmo_tokenizer *t) { return t->vocab_size; }

int64_t olmo_tokenizer_token_to_id(const struct olmo_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].content, token, n)) return t->added[i].id;
    return olmo_strmap_get(&t->by_content, token, n);
}

bool olmo_tokenizer_is_special(const struct olmo_tokenizer *t, uint32_t id) {
    return id < t->vocab_size && t->is_special[id];
}

