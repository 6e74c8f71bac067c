/* import_args.c - trainer arguments given as command-line flags, as in
 * LLaVA's finetune.sh (`--model_max_length 2048 --bf16 True ...`): split the
 * way a shell does (quotes, backslash-newline), turned into the same map a
 * trainer file gives, each value keeping its line and column.  "--flag" with
 * no value is true (HfArgumentParser's bool flags); words before the first
 * flag are the launcher command and are listed as ignored. */
#include "import_rd.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct word {
    char *s;
    int line, col;
} word;

typedef imp_lexer lexer;

static void adv(lexer *x)
{
    if (*x->p == '\n') {
        x->line++;
        x->col = 1;
    } else {
        x->col++;
    }
    x->p++;
}

/* one shell word into out (n bytes); 0 at the end, -1 unterminated quote
 * (also the ms-swift reader's, import_swift.c) */
int imp_lex_word(imp_lexer *x, char *out, size_t n, int *line, int *col)
{
    for (;;) {
        while (x->p < x->end && isspace((unsigned char)*x->p))
            adv(x);
        if (x->p + 1 < x->end && x->p[0] == '\\' && x->p[1] == '\n') {
            adv(x);
            adv(x);
            continue;
        }
        if (x->p < x->end && *x->p == '#') { /* a comment to the end of the line */
            while (x->p < x->end && *x->p != '\n')
                adv(x);
            continue;
        }
        break;
    }
    if (x->p >= x->end)
        return 0;
    *line = x->line;
    *col = x->col;
    size_t o = 0;
    while (x->p < x->end && !isspace((unsigned char)*x->p)) {
        char q = *x->p;
        if (q == '"' || q == '\'') {
            adv(x);
            while (x->p < x->end && *x->p != q) {
                if (q == '"' && *x->p == '\\' && x->p + 1 < x->end)
                    adv(x);
                if (o + 1 < n)
                    out[o++] = *x->p;
                adv(x);
            }
            if (x->p >= x->end)
                return -1;
            adv(x);
            continue;
        }
        if (q == '\\' && x->p + 1 < x->end)
            adv(x);
        if (o + 1 < n)
            out[o++] = *x->p;
        adv(x);
    }
    out[o] = '\0';
    return 1;
}

/* key at (kl, kc), its value at (line, col) */
static int put_flag(mm_node *map, const char *key, const char *val, int kl, int kc, int line,
                    int col, const char *name, mm_error *err)
{
    if (mm_node_get(map, key)) {
        mm_err_at(err, name, kl, kc, "--%s: given twice", key);
        return -1;
    }
    mm_node *v = mm_node_new(MM_NODE_SCALAR, line, col);
    if (!v || !(v->str = strdup(val)) || mm_node_map_put(map, key, v, kl, kc)) {
        mm_node_free(v);
        mm_err(err, "%s: out of memory", name);
        return -1;
    }
    return 0;
}

/* the flags as a map: --key value, --key=value, --key (true) */
static mm_node *flags_map(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    lexer x = {buf, buf + len, 1, 1};
    mm_node *map = mm_node_new(MM_NODE_MAP, 1, 1);
    char w[4096], key[128] = "";
    int line = 0, col = 0, kl = 0, kc = 0, rc, launcher = 0, count = 0;
    while (map && (rc = imp_lex_word(&x, w, sizeof w, &line, &col)) != 0) {
        if (rc < 0 || ++count > 4096) {
            mm_err_at(err, name, line, col, rc < 0 ? "unterminated quote" : "too many words");
            goto fail;
        }
        if (!strncmp(w, "--", 2) && w[2]) {
            if (key[0] && put_flag(map, key, "true", kl, kc, kl, kc, name, err))
                goto fail;
            char *eq = strchr(w, '=');
            snprintf(key, sizeof key, "%.*s", (int)(eq ? eq - w - 2 : (long)strlen(w) - 2), w + 2);
            kl = line;
            kc = col;
            if (eq && put_flag(map, key, eq + 1, kl, kc, kl, kc, name, err))
                goto fail;
            if (eq)
                key[0] = '\0';
        } else if (key[0]) {
            if (put_flag(map, key, w, kl, kc, line, col, name, err))
                goto fail;
            key[0] = '\0';
        } else if (map->n == 0) {
            launcher = 1;
        } else {
            mm_err_at(err, name, line, col, "'%s': expected a --flag", w);
            goto fail;
        }
    }
    if (map && key[0] && put_flag(map, key, "true", kl, kc, kl, kc, name, err))
        goto fail;
    if (launcher)
        imp_note(j->s, "ignored the words before the first --flag in %s: the launcher command",
                 name);
    return map;
fail:
    mm_node_free(map);
    return NULL;
}

int imp_args_buffer(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    mm_node *map = flags_map(j, buf, len, name, err);
    if (!map)
        return -1;
    imp_source(j->s, name, buf, len);
    hfc h;
    hfc_init(&h, j->s, map, "", name, err);
    j->trainer = 1;
    snprintf(j->trainer_file, sizeof j->trainer_file, "%s", name);
    int rc = imp_trainer_model(j, &h) || imp_trainer_map(j, &h) || imp_trainer_finish(j, &h) ? -1
                                                                                             : 0;
    mm_node_free(map);
    return rc;
}

/* "--flag value ..." or "@FILE" (the flags read from FILE, errors with its lines) */
int imp_args(imp_job *j, const char *args, mm_error *err)
{
    if (args[0] != '@')
        return imp_args_buffer(j, args, strlen(args), "--args", err);
    return imp_read_with(j, args + 1, imp_args_buffer, err);
}
