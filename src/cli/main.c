/* olmoc: one command-line front for every job. */
#include <stdio.h>
#include <string.h>

#include "cli/commands.h"
#include "train/signals.h"
#include "util/error.h"
#include "util/threads.h"

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
    int stops_on_signals; /* SIGTERM, SIGINT, SIGHUP, SIGUSR1 ask it to stop (train/signals.h) */
};

static const struct command commands[] = {
    {"train", cmd_train, "train an Olmo 3 model from a YAML config", 1},
    {"info", cmd_info, "show a config resolved, with parameter counts", 0},
    {"eval", cmd_eval, "validation loss / perplexity and multiple-choice accuracy of a checkpoint", 0},
    {"convert", cmd_convert, "import / export Hugging Face Olmo3ForCausalLM checkpoints", 0},
    {"generate", cmd_generate, "continue a prompt (text or token ids) from a model (greedy, temperature, top-p; KV cache)", 0},
    {"tokenize", cmd_tokenize, "turn text / JSONL into an OLMo token file (.npy)", 0},
};

static void usage(FILE *out) {
    fprintf(out, "usage: olmoc COMMAND [ARGS...]\n\nOlmo 3 pre-training in C.\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nRun 'olmoc COMMAND --help' for a command's options.\n");
}

int main(int argc, char **argv) {
    olmo_openmp_wait_default(argv); /* before anything else: it may run olmoc again */
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(argv[1], commands[i].name)) continue;
        /* first, before any thread starts: every thread inherits the blocked
         * signals, and a signal from now on stops the run cleanly */
        if (commands[i].stops_on_signals && olmo_signals_start()) {
            fprintf(stderr, "olmoc %s: %s\n", commands[i].name, olmo_last_error());
            return 1;
        }
        return commands[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "olmoc: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
