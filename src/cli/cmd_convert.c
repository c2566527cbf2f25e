/* olmoc convert: Hugging Face Olmo3ForCausalLM checkpoints <-> olmoc. */
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/args.h"
#include "cli/commands.h"
#include "model/hf.h"
#include "model/weights.h"
#include "train/source.h"
#include "util/error.h"
#include "util/fs.h"

struct convert_args {
    const char *src, *out, *config_path;
    int dtype; /* an index into dtypes */
    bool to_hf, from_hf;
    struct olmo_cli_list sets;
};

static const char *const dtypes[] = {"float32", "bfloat16", NULL};
static const enum olmo_st_dtype st_dtypes[] = {OLMO_ST_F32, OLMO_ST_BF16};

#define ARG(field) offsetof(struct convert_args, field)
static const struct olmo_cli_option convert_options[] = {
    {.kind = OLMO_CLI_ARG, .name = "SRC", .offset = ARG(src)},
    {.kind = OLMO_CLI_ARG, .name = "OUTDIR", .offset = ARG(out)},
    {.kind = OLMO_CLI_FLAG, .name = "--to-hf", .offset = ARG(to_hf),
     .help = "olmoc (a checkpoint, run directory or .safetensors) to Hugging Face"},
    {.kind = OLMO_CLI_FLAG, .name = "--from-hf", .offset = ARG(from_hf), .help = "Hugging Face to olmoc"},
    {.kind = OLMO_CLI_STRING, .name = "--config", .offset = ARG(config_path), .metavar = "CFG.yaml",
     .help = "--to-hf: the model config (required for a bare .safetensors file)"},
    {.kind = OLMO_CLI_CHOICE, .name = "--dtype", .offset = ARG(dtype), .metavar = "T", .choices = dtypes,
     .help = "--to-hf: float32 (default) or bfloat16 weights"},
    {.kind = OLMO_CLI_LIST, .name = "--set", .offset = ARG(sets), .metavar = "KEY=VALUE",
     .help = "override a config value (repeatable)"},
    {.kind = OLMO_CLI_END},
};
#undef ARG

static const struct olmo_cli_command convert_command = {
    "convert",
    "olmoc convert --to-hf SRC OUTDIR [--config CFG.yaml] [--dtype float32|bfloat16] [--set KEY=VALUE ...]\n"
    "olmoc convert --from-hf HFDIR OUTDIR [--set KEY=VALUE ...]",
    "--to-hf writes OUTDIR/model.safetensors and OUTDIR/config.json (Olmo3ForCausalLM), loadable\n"
    "with transformers' AutoModelForCausalLM.from_pretrained(OUTDIR).  SRC is a checkpoint\n"
    "(step-NNNNNN/), a run directory (its newest checkpoint), or a .safetensors file with\n"
    "--config.  max_position_embeddings is set to train.seq_len.  With a tokenizer (data.tokenizer,\n"
    "or SRC/tokenizer.json of a Hugging Face directory) it also writes OUTDIR/tokenizer.json and\n"
    "OUTDIR/tokenizer_config.json, so AutoTokenizer.from_pretrained(OUTDIR) works.\n\n"
    "--from-hf reads HFDIR/config.json and HFDIR/model.safetensors (or the shards of\n"
    "model.safetensors.index.json; fp32, bf16 or fp16) and writes OUTDIR/config.yaml (the model\n"
    "section filled in, train/data at their defaults, train.seq_len = min(max_position_embeddings,\n"
    "4096)) and OUTDIR/model.safetensors (fp32), usable with olmoc eval / generate, or with\n"
    "olmoc train --init.  YaRN RoPE scaling on the full-attention layers is read and written;\n"
    "refused: other RoPE scalings, tied embeddings, biases, dropout.\n"
    "A config written by OLMo-core's exporter (max_position_embeddings -1, null eos/pad_token_id)\n"
    "is read with Olmo 3's values assumed and said so: sequence length 8192 (train.seq_len 4096),\n"
    "the dolma2 tokenizer's EOS 100257 and PAD 100277; --set model.eos_token_id=ID etc. changes them.",
    convert_options,
    NULL,
};

int cmd_convert(int argc, char **argv) {
    struct convert_args a = {0};
    int status;
    if (olmo_cli_parse(&convert_command, &a, argc, argv, &status)) return status;
    if (a.to_hf && a.from_hf) return olmo_cli_error(&convert_command, "give one of --to-hf / --from-hf");
    if (!(a.to_hf || a.from_hf) || !a.src || !a.out) return olmo_cli_usage_error(&convert_command);
    const bool to_hf = a.to_hf;
    const char *src = a.src, *out = a.out, *config_path = a.config_path, *dtype = dtypes[a.dtype];
    const enum olmo_st_dtype out_dtype = st_dtypes[a.dtype];
    if (!to_hf && (config_path || out_dtype != OLMO_ST_F32))
        return olmo_cli_error(&convert_command, "--config and --dtype apply to --to-hf only");

    struct olmo_config cfg;
    struct olmo_model_source source;
    struct olmo_model model = {0};
    struct olmo_backend *backend = NULL; /* destroyed after the model */
    char path[4400];
    bool wrote_tokenizer = false;
    if (olmo_source_resolve(src, config_path, &source, &cfg)) goto fail;
    if (!to_hf && source.kind != OLMO_SRC_HF_DIR) {
        olmo_error("'%s' is not a Hugging Face directory (no config.json)", src);
        goto fail;
    }
    if (!to_hf && olmo_hf_config_assumed()[0])
        fprintf(stderr, "olmoc convert: %s/config.json: %s\n", src, olmo_hf_config_assumed());
    if (olmo_cli_apply_sets(&a.sets, &cfg)) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    if (!(backend = olmo_backend_create("cpu")) || olmo_model_create(&model, &cfg.model, backend)) goto fail;
    if (olmo_source_load_weights(&source, &model)) goto fail;
    if (olmo_make_dirs(out)) goto fail;
    if (to_hf) {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (olmo_hf_save_weights(&model, path, out_dtype)) goto fail;
        snprintf(path, sizeof path, "%s/config.json", out);
        if (olmo_hf_write_config(&cfg, path, dtype)) goto fail;
        /* the run's tokenizer (data.tokenizer), or the source directory's, goes with the export */
        char tokpath[4400] = "";
        if (cfg.data.tokenizer[0]) snprintf(tokpath, sizeof tokpath, "%s", cfg.data.tokenizer);
        else if (source.kind == OLMO_SRC_HF_DIR) snprintf(tokpath, sizeof tokpath, "%s/tokenizer.json", src);
        if (tokpath[0] && olmo_is_file(tokpath)) {
            if (olmo_hf_write_tokenizer(&cfg, tokpath, out)) goto fail;
            wrote_tokenizer = true;
        } else if (cfg.data.tokenizer[0]) {
            fprintf(stderr, "olmoc convert: note: no tokenizer.json written: data.tokenizer '%s' is not a file\n",
                    cfg.data.tokenizer);
        }
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (olmo_weights_save(&model, model.weights, path)) goto fail;
        snprintf(path, sizeof path, "%s/config.yaml", out);
        if (olmo_config_write(&cfg, path)) goto fail;
    }
    printf("olmoc convert: %s %s (%zu parameters, %d layers) -> %s (%s%s)\n", olmo_source_kind_name(source.kind), src,
           olmo_model_count_params(&cfg.model, true), cfg.model.n_layers, out,
           to_hf ? "Hugging Face Olmo3ForCausalLM" : "olmoc config.yaml + model.safetensors",
           wrote_tokenizer ? ", tokenizer.json" : "");
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 0;
fail:
    fprintf(stderr, "olmoc convert: %s\n", olmo_last_error());
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 1;
}
