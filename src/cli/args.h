/* Command-line arguments from one table per command: every olmoc command
 * parses, validates and prints its --help through these, so all of them
 * read the same way.
 *
 * A command describes its options in an array of struct olmo_cli_option
 * (ended by an entry of kind OLMO_CLI_END), each naming the field of the
 * command's argument struct that receives the value (offsetof).  The
 * command sets its defaults in that struct, then calls olmo_cli_parse.
 *
 * Conventions: an option is a word starting with '-' ("-" alone is an
 * argument); an option that takes a value takes the next word, whatever it
 * is; -h and --help print the help to stdout (exit 0); an unknown option, a
 * missing or invalid value or an extra argument is one line on stderr,
 * "olmoc COMMAND: ...", and exit code 2. */
#ifndef OLMOC_CLI_ARGS_H
#define OLMOC_CLI_ARGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "util/error.h"

enum olmo_cli_kind {
    OLMO_CLI_END,     /* ends the table */
    OLMO_CLI_SECTION, /* a heading in the help (help = "input:"); parses nothing */
    OLMO_CLI_FLAG,    /* bool: true when given */
    OLMO_CLI_STRING,  /* const char *: the value (the last one given) */
    OLMO_CLI_LIST,    /* struct olmo_cli_list: every value, in order (a repeatable option) */
    OLMO_CLI_INT,     /* int: an integer in [min, max] */
    OLMO_CLI_LONG,    /* long: an integer in [min, max] */
    OLMO_CLI_U64,     /* unsigned long long: a non-negative integer */
    OLMO_CLI_DOUBLE,  /* double: a number in [min, max], or (min, max] with min_open */
    OLMO_CLI_SIZE,    /* double: bytes, as "141GB" or "131.6GiB" (olmo_parse_bytes) */
    OLMO_CLI_CHOICE,  /* int: the index of the value in choices */
    OLMO_CLI_ARG,     /* const char *: a positional argument (the table's ARG entries, in order) */
    OLMO_CLI_ARGS,    /* struct olmo_cli_list: the positional arguments after the ARG entries */
};

struct olmo_cli_option {
    enum olmo_cli_kind kind;
    const char *name;    /* "--top-p"; for ARG and ARGS the name in the help ("INPUT...") */
    const char *alias;   /* a short form ("-o"), or NULL */
    size_t offset;       /* where the value goes: offsetof(argument struct, field) */
    const char *metavar; /* the value in the help ("P"); options that take a value */
    const char *help;    /* the help text, '\n' between lines; NULL: not listed (ARG only) */
    double min, max;     /* OLMO_CLI_INT, LONG, DOUBLE (both given: max HUGE_VAL for none) */
    bool min_open;       /* OLMO_CLI_DOUBLE: min itself is refused */
    const char *const *choices; /* OLMO_CLI_CHOICE: the accepted values, NULL-terminated */
    const char *expects; /* the error's words for a bad value, instead of the generated
                          * "expects an integer in [1, 4]" ("needs an integer >= 1") */
};

struct olmo_cli_command {
    const char *name;  /* "train": errors read "olmoc train: ..." */
    const char *usage; /* the synopsis, "olmoc train CONFIG.yaml [options]"; '\n' between forms */
    const char *about; /* what the command does: text between the usage and the options, or NULL */
    const struct olmo_cli_option *options;
    const char *epilog; /* text after the options, or NULL */
};

/* The values of a repeatable option or the remaining positional arguments:
 * n of them, read with olmo_cli_each (they stay in argv). */
struct olmo_cli_list {
    int n;
    const struct olmo_cli_command *cmd; /* where they are: set by olmo_cli_parse */
    const struct olmo_cli_option *opt;
    int argc;
    char **argv;
};

/* Parses argv[1..argc-1] into args, the struct the table's offsets point
 * into (the caller has set its defaults).  Returns 0 to go on, or -1 when
 * the command should exit with *status: 0 after --help (printed to stdout),
 * 2 after a usage error (one line on stderr). */
int olmo_cli_parse(const struct olmo_cli_command *c, void *args, int argc, char **argv, int *status);

/* Calls fn(ctx, value) for each value of l in order; returns 0, or -1 at
 * the first call that returns nonzero. */
int olmo_cli_each(const struct olmo_cli_list *l, int (*fn)(void *ctx, const char *value), void *ctx);
/* --backend's help where a command does not list the backends itself (olmoc train --help does). */
#define OLMO_CLI_BACKEND_HELP                                                   \
    "cpu (default), cpu-openblas, cpu-onednn, cpu-bf16, or in a CUDA\n"        \
    "build cuda, cuda-tf32, cuda-bf16, cuda-bf16-cublas (see olmoc train --help)"
/* The --set KEY=VALUE overrides of l applied to cfg in order (olmo_config_set); 0, or -1 with the error set. */
struct olmo_config;
int olmo_cli_apply_sets(const struct olmo_cli_list *l, struct olmo_config *cfg);

/* The help: usage, about, one entry per option (with -h, --help), epilog. */
void olmo_cli_help(const struct olmo_cli_command *c, FILE *out);

/* The usage and where the help is, on stderr, for a missing argument; returns 2. */
int olmo_cli_usage_error(const struct olmo_cli_command *c);

/* "olmoc NAME: message" on stderr; returns 2 (a usage error's exit code). */
int olmo_cli_error(const struct olmo_cli_command *c, const char *fmt, ...) OLMO_PRINTF(2, 3);

#endif
