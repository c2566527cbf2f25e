/* olmoc convert: Hugging Face Olmo3ForCausalLM checkpoints <-> olmoc. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/commands.h"
#include "model/hf.h"
#include "model/weights.h"
#include "train/source.h"
#include "util/error.h"
#include "util/fs.h"

static void convert_usage(FILE *out) {
    fprintf(out,
            "usage: olmoc convert --to-hf SRC OUTDIR [--config CFG.yaml] [--dtype float32|bfloat16] [--set KEY=VALUE ...]\n"
            "       olmoc convert --from-hf HFDIR OUTDIR [--set KEY=VALUE ...]\n\n"
            "--to-hf writes OUTDIR/model.safetensors and OUTDIR/config.json (Olmo3ForCausalLM), loadable\n"
            "with transformers' AutoModelForCausalLM.from_pretrained(OUTDIR).  SRC is a checkpoint\n"
            "(step-NNNNNN/), a run directory (its newest checkpoint), or a .safetensors file with\n"
            "--config.  max_position_embeddings is set to train.seq_len.\n\n"
            "--from-hf reads HFDIR/config.json and HFDIR/model.safetensors (or the shards of\n"
            "model.safetensors.index.json; fp32, bf16 or fp16) and writes OUTDIR/config.yaml (the model\n"
            "section filled in, train/data at their defaults, train.seq_len = min(max_position_embeddings,\n"
            "4096)) and OUTDIR/model.safetensors (fp32), usable with olmoc eval / generate, or with\n"
            "olmoc train --init.  Refused: RoPE scaling (YaRN), tied embeddings, biases, dropout.\n"
            "A config written by OLMo-core's exporter (max_position_embeddings -1, null eos/pad_token_id)\n"
            "is read with Olmo 3's values assumed and said so: sequence length 8192 (train.seq_len 4096),\n"
            "the dolma2 tokenizer's EOS 100257 and PAD 100277; --set model.eos_token_id=ID etc. changes them.\n");
}

int cmd_convert(int argc, char **argv) {
    const char *direction = NULL, *src = NULL, *out = NULL, *config_path = NULL, *dtype = "float32";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            convert_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--to-hf") || !strcmp(argv[i], "--from-hf")) {
            if (direction) {
                fprintf(stderr, "olmoc convert: give one of --to-hf / --from-hf\n");
                return 2;
            }
            direction = argv[i];
        } else if (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--config") || !strcmp(argv[i], "--dtype")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "olmoc convert: %s needs a value\n", argv[i]);
                return 2;
            }
            if (!strcmp(argv[i], "--config")) config_path = argv[i + 1];
            if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
            i++;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "olmoc convert: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        } else if (!src) {
            src = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "olmoc convert: unexpected argument '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    if (!direction || !src || !out) {
        convert_usage(stderr);
        return 2;
    }
    const bool to_hf = !strcmp(direction, "--to-hf");
    enum st_dtype st_dtype;
    if (!strcmp(dtype, "float32")) st_dtype = ST_F32;
    else if (!strcmp(dtype, "bfloat16")) st_dtype = ST_BF16;
    else {
        fprintf(stderr, "olmoc convert: --dtype must be float32 or bfloat16\n");
        return 2;
    }
    if (!to_hf && (config_path || st_dtype != ST_F32)) {
        fprintf(stderr, "olmoc convert: --config and --dtype apply to --to-hf only\n");
        return 2;
    }

    struct olmo_config cfg;
    struct olmo_model_source source;
    struct olmo_model model = {0};
    struct olmo_backend *backend = NULL; /* destroyed after the model */
    char path[4400];
    if (olmo_source_resolve(src, config_path, &source, &cfg)) goto fail;
    if (!to_hf && source.kind != SRC_HF_DIR) {
        olmo_error("'%s' is not a Hugging Face directory (no config.json)", src);
        goto fail;
    }
    if (!to_hf && olmo_hf_config_assumed()[0])
        fprintf(stderr, "olmoc convert: %s/config.json: %s\n", src, olmo_hf_config_assumed());
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--set") && olmo_config_set(&cfg, argv[++i])) goto fail;
    if (olmo_config_validate(&cfg)) goto fail;
    if (!(backend = olmo_backend_create("cpu")) || olmo_model_create(&model, &cfg.model, backend)) goto fail;
    if (olmo_source_load_weights(&source, &model)) goto fail;
    if (olmo_make_dirs(out)) goto fail;
    if (to_hf) {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (olmo_hf_save_weights(&model, path, st_dtype)) goto fail;
        snprintf(path, sizeof path, "%s/config.json", out);
        if (olmo_hf_write_config(&cfg, path, dtype)) goto fail;
    } else {
        snprintf(path, sizeof path, "%s/model.safetensors", out);
        if (olmo_weights_save(&model, model.weights, path)) goto fail;
        snprintf(path, sizeof path, "%s/config.yaml", out);
        if (olmo_config_write(&cfg, path)) goto fail;
    }
    printf("olmoc convert: %s %s (%zu parameters, %d layers) -> %s (%s)\n", olmo_source_kind_name(source.kind), src,
           olmo_model_count_params(&cfg.model, true), cfg.model.n_layers, out,
           to_hf ? "Hugging Face Olmo3ForCausalLM" : "olmoc config.yaml + model.safetensors");
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 0;
fail:
    fprintf(stderr, "olmoc convert: %s\n", olmo_last_error());
    olmo_model_destroy(&model);
    olmo_backend_destroy(backend);
    return 1;
}
