/* Command-line arguments from one table per command (args.h). */
#include "cli/args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "train/memplan.h"

/* Where an option's help text starts; an option too wide for it puts its
 * help on the next line. */
enum { HELP_COLUMN = 24 };

static bool is_option(enum olmo_cli_kind k) { return k >= OLMO_CLI_FLAG && k <= OLMO_CLI_CHOICE; }

/* The option a word names, or NULL. */
static const struct olmo_cli_option *find(const struct olmo_cli_command *c, const char *word) {
    for (const struct olmo_cli_option *o = c->options; o->kind != OLMO_CLI_END; o++)
        if (is_option(o->kind) && ((o->name && !strcmp(word, o->name)) || (o->alias && !strcmp(word, o->alias))))
            return o;
    return NULL;
}

/* The entry that takes the k-th positional argument: the k-th ARG entry, else the ARGS entry, else NULL. */
static const struct olmo_cli_option *positional(const struct olmo_cli_command *c, int k) {
    const struct olmo_cli_option *rest = NULL;
    for (const struct olmo_cli_option *o = c->options; o->kind != OLMO_CLI_END; o++) {
        if (o->kind == OLMO_CLI_ARG && k-- == 0) return o;
        if (o->kind == OLMO_CLI_ARGS) rest = o;
    }
    return rest;
}

enum step { STEP_END, STEP_HELP, STEP_OPTION, STEP_ARG, STEP_UNKNOWN, STEP_NO_VALUE, STEP_EXTRA };

/* Reads the word at argv[*i] (and its value): *opt its entry, *word the word, *value the value or argument. */
static enum step step(const struct olmo_cli_command *c, int argc, char **argv, int *i, int *n_pos,
                      const struct olmo_cli_option **opt, const char **word, const char **value) {
    if (*i >= argc) return STEP_END;
    const char *w = argv[(*i)++];
    *word = w;
    *value = NULL;
    if (w[0] == '-' && w[1]) {
        if (!strcmp(w, "--help") || !strcmp(w, "-h")) return STEP_HELP;
        if (!(*opt = find(c, w))) return STEP_UNKNOWN;
        if ((*opt)->kind == OLMO_CLI_FLAG) return STEP_OPTION;
        if (*i >= argc) return STEP_NO_VALUE;
        *value = argv[(*i)++];
        return STEP_OPTION;
    }
    *value = w;
    return (*opt = positional(c, (*n_pos)++)) ? STEP_ARG : STEP_EXTRA;
}

int olmo_cli_error(const struct olmo_cli_command *c, const char *fmt, ...) {
    fflush(stdout);
    fprintf(stderr, "olmoc %s: ", c->name);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 2;
}

/* An invalid value: "olmoc NAME: --opt expects ..., got 'v'". */
static int bad_value(const struct olmo_cli_command *c, const struct olmo_cli_option *o, const char *word,
                     const char *v) {
    char what[512];
    size_t n = 0;
    if (o->expects) snprintf(what, sizeof what, "%s", o->expects);
    else if (o->kind == OLMO_CLI_INT || o->kind == OLMO_CLI_LONG)
        snprintf(what, sizeof what, "expects an integer in [%.0f, %.0f]", o->min, o->max);
    else if (o->kind == OLMO_CLI_U64) snprintf(what, sizeof what, "expects an integer in [0, %llu]", ULLONG_MAX);
    else if (o->kind == OLMO_CLI_DOUBLE && isinf(o->max))
        snprintf(what, sizeof what, "expects a number %s %g", o->min_open ? ">" : ">=", o->min);
    else if (o->kind == OLMO_CLI_DOUBLE)
        snprintf(what, sizeof what, "expects a number in %c%g, %g]", o->min_open ? '(' : '[', o->min, o->max);
    else { /* OLMO_CLI_CHOICE: "must be a, b or c" */
        n = (size_t)snprintf(what, sizeof what, "must be");
        for (int k = 0; o->choices[k] && n < sizeof what; k++)
            n += (size_t)snprintf(what + n, sizeof what - n, "%s %s", k == 0 ? "" : o->choices[k + 1] ? "," : " or",
                                  o->choices[k]);
    }
    return olmo_cli_error(c, "%s %s, got '%s'", word, what, v);
}

/* Stores an option's value, or an argument, at dest; 0, or -1 with the error printed. */
static int store(const struct olmo_cli_command *c, const struct olmo_cli_option *o, void *dest, const char *word,
                 const char *v) {
    char *end = NULL;
    switch (o->kind) {
    case OLMO_CLI_FLAG:
        *(bool *)dest = true;
        return 0;
    case OLMO_CLI_STRING:
    case OLMO_CLI_ARG:
        *(const char **)dest = v;
        return 0;
    case OLMO_CLI_LIST:
    case OLMO_CLI_ARGS:
        ((struct olmo_cli_list *)dest)->n++;
        return 0;
    case OLMO_CLI_INT:
    case OLMO_CLI_LONG: {
        const long x = strtol(v, &end, 10);
        if (!*v || *end || x < o->min || x > o->max) break;
        if (o->kind == OLMO_CLI_INT) *(int *)dest = (int)x;
        else *(long *)dest = x;
        return 0;
    }
    case OLMO_CLI_U64: { /* digits only: strtoull takes blanks and a minus sign (-1 as 2^64-1), and saturates */
        errno = 0;
        const unsigned long long x = strtoull(v, &end, 10);
        if (!(v[0] >= '0' && v[0] <= '9') || *end || errno) break;
        *(unsigned long long *)dest = x;
        return 0;
    }
    case OLMO_CLI_DOUBLE: {
        const double x = strtod(v, &end);
        if (!*v || *end || !(o->min_open ? x > o->min : x >= o->min) || !(x <= o->max)) break;
        *(double *)dest = x;
        return 0;
    }
    case OLMO_CLI_SIZE:
        if (!olmo_parse_bytes(v, (double *)dest)) return 0;
        olmo_cli_error(c, "%s %s", word, olmo_last_error());
        return -1;
    case OLMO_CLI_CHOICE:
        for (int k = 0; o->choices[k]; k++)
            if (!strcmp(v, o->choices[k])) {
                *(int *)dest = k;
                return 0;
            }
        break;
    case OLMO_CLI_END:
    case OLMO_CLI_SECTION:
        break;
    }
    bad_value(c, o, word, v);
    return -1;
}

int olmo_cli_parse(const struct olmo_cli_command *c, void *args, int argc, char **argv, int *status) {
    char *base = args;
    for (const struct olmo_cli_option *o = c->options; o->kind != OLMO_CLI_END; o++)
        if (o->kind == OLMO_CLI_LIST || o->kind == OLMO_CLI_ARGS)
            *(struct olmo_cli_list *)(base + o->offset) = (struct olmo_cli_list){0, c, o, argc, argv};
    int i = 1, n_pos = 0;
    *status = 2;
    for (;;) {
        const struct olmo_cli_option *o = NULL;
        const char *word, *value;
        switch (step(c, argc, argv, &i, &n_pos, &o, &word, &value)) {
        case STEP_END:
            *status = 0;
            return 0;
        case STEP_HELP:
            olmo_cli_help(c, stdout);
            *status = 0;
            return -1;
        case STEP_UNKNOWN:
            olmo_cli_error(c, "unknown option '%s' (see --help)", word);
            return -1;
        case STEP_NO_VALUE:
            olmo_cli_error(c, "%s needs a value", word);
            return -1;
        case STEP_EXTRA:
            olmo_cli_error(c, "unexpected argument '%s' (see --help)", word);
            return -1;
        case STEP_OPTION:
        case STEP_ARG:
            if (store(c, o, base + o->offset, word, value)) return -1;
            break;
        }
    }
}

int olmo_cli_each(const struct olmo_cli_list *l, int (*fn)(void *ctx, const char *value), void *ctx) {
    int i = 1, n_pos = 0;
    for (int seen = 0; seen < l->n;) { /* argv was parsed without an error: only options and arguments */
        const struct olmo_cli_option *o = NULL;
        const char *word, *value;
        const enum step s = step(l->cmd, l->argc, l->argv, &i, &n_pos, &o, &word, &value);
        if (s != STEP_OPTION && s != STEP_ARG) break;
        if (o != l->opt) continue;
        seen++;
        if (fn(ctx, value)) return -1;
    }
    return 0;
}

/* Lines of text, each after `indent` spaces; '\n' separates them. */
static void print_lines(FILE *out, const char *text, int first_indent, int indent) {
    for (int pad = first_indent;; pad = indent) {
        const char *nl = strchr(text, '\n');
        const int len = nl ? (int)(nl - text) : (int)strlen(text);
        fprintf(out, "%*s%.*s\n", len ? pad : 0, "", len, text);
        if (!nl) return;
        text = nl + 1;
    }
}

/* One option: its names and value on the left, its help from HELP_COLUMN. */
static void print_entry(FILE *out, const char *left, const char *help) {
    const int n = fprintf(out, "  %s", left);
    if (n + 2 > HELP_COLUMN) {
        fputc('\n', out);
        print_lines(out, help, HELP_COLUMN, HELP_COLUMN);
    } else {
        print_lines(out, help, HELP_COLUMN - n, HELP_COLUMN);
    }
}

static void print_usage(const struct olmo_cli_command *c, FILE *out) {
    fputs("usage: ", out);
    print_lines(out, c->usage, 0, (int)strlen("usage: "));
}

void olmo_cli_help(const struct olmo_cli_command *c, FILE *out) {
    print_usage(c, out);
    if (c->about) {
        fputc('\n', out);
        print_lines(out, c->about, 0, 0);
    }
    if (c->options[0].kind != OLMO_CLI_SECTION) fputs("\noptions:\n", out);
    for (const struct olmo_cli_option *o = c->options; o->kind != OLMO_CLI_END; o++) {
        if (o->kind == OLMO_CLI_SECTION) {
            fprintf(out, "\n%s\n", o->help);
            continue;
        }
        if (!o->help) continue;
        char left[256];
        const int n = o->alias ? snprintf(left, sizeof left, "%s, %s", o->alias, o->name)
                               : snprintf(left, sizeof left, "%s", o->name);
        if (is_option(o->kind) && o->kind != OLMO_CLI_FLAG && o->metavar && n > 0 && (size_t)n < sizeof left)
            snprintf(left + n, sizeof left - (size_t)n, " %s", o->metavar);
        print_entry(out, left, o->help);
    }
    print_entry(out, "-h, --help", "show this help");
    if (c->epilog) {
        fputc('\n', out);
        print_lines(out, c->epilog, 0, 0);
    }
}

int olmo_cli_usage_error(const struct olmo_cli_command *c) {
    fflush(stdout);
    print_usage(c, stderr);
    fprintf(stderr, "Run 'olmoc %s --help' for the options.\n", c->name);
    return 2;
}

static int set_one(void *cfg, const char *kv) { return olmo_config_set(cfg, kv); }

int olmo_cli_apply_sets(const struct olmo_cli_list *l, struct olmo_config *cfg) {
    return olmo_cli_each(l, set_one, cfg);
}
