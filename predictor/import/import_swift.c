/* import_swift.c (layer import) - an ms-swift training command, as its
 * examples write it (examples/train/multimodal, e.g. ocr.sh): environment
 * assignments (MAX_PIXELS=1003520 NPROC_PER_NODE=4 ...), then `swift sft`,
 * then --flag value ... over backslash-continued lines.  The words are split
 * as a shell does (import_args.c imp_lex_word); a flag takes every word up to
 * the next --flag (ms-swift's list arguments: --target_modules q_proj
 * v_proj), none means true.  ms-swift's own flags go to its reader
 * (import_swift_rules.c), the HF TrainingArguments it inherits to the
 * trainer reader, each value with its line and column. */
#include "import_rd.h"
#include "import_swift.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SWIFT_MAX_WORDS 4096

static int oom(const char *name, mm_error *err)
{
    mm_err(err, "%s: out of memory", name);
    return -1;
}

static mm_node *word_node(const char *w, int line, int col)
{
    mm_node *v = mm_node_new(MM_NODE_SCALAR, line, col);
    if (v && !(v->str = strdup(w))) {
        mm_node_free(v);
        v = NULL;
    }
    return v;
}

/* NAME=VALUE with a shell variable name */
static const char *assignment(const char *w)
{
    if (!isalpha((unsigned char)*w) && *w != '_')
        return NULL;
    const char *p = w;
    while (isalnum((unsigned char)*p) || *p == '_')
        p++;
    return *p == '=' ? p : NULL;
}

static int put(mm_node *map, const char *key, mm_node *v, int line, int col, const char *name,
               mm_error *err)
{
    if (mm_node_get(map, key)) {
        mm_node_free(v);
        mm_err_at(err, name, line, col, "%s: given twice", key);
        return -1;
    }
    if (mm_node_map_put(map, key, v, line, col)) {
        mm_node_free(v);
        return oom(name, err);
    }
    return 0;
}

/* the words before `swift`: environment assignments only */
static int env_word(swift_cmd *c, const char *w, int line, int col, const char *name,
                    mm_error *err)
{
    const char *eq = assignment(w);
    if (!eq) {
        mm_err_at(err, name, line, col, "'%s': expected NAME=VALUE or `swift sft`", w);
        return -1;
    }
    char key[128];
    snprintf(key, sizeof key, "%.*s", (int)(eq - w), w);
    mm_node *v = word_node(eq + 1, line, col + (int)(eq - w) + 1);
    return v ? put(c->env, key, v, line, col, name, err) : oom(name, err);
}

/* the flag being read: its values so far (NULL: none yet) */
typedef struct pending {
    char key[128];
    int line, col;
    mm_node *vals;
} pending;

static int flush(swift_cmd *c, pending *p, const char *name, mm_error *err)
{
    if (!p->key[0])
        return 0;
    mm_node *v = p->vals;
    p->vals = NULL;
    if (!v && !(v = word_node("true", p->line, p->col)))
        return oom(name, err);
    if (v->type == MM_NODE_SEQ && v->n == 1) { /* one value: a scalar */
        mm_node *one = v->vals[0];
        v->n = 0;
        mm_node_free(v);
        v = one;
    }
    mm_node *map = c->owns(p->key) ? c->swift : c->trainer;
    int rc = put(map, p->key, v, p->line, p->col, name, err);
    p->key[0] = '\0';
    return rc;
}

/* one word after `swift sft` */
static int flag_word(swift_cmd *c, pending *p, const char *w, int line, int col,
                     const char *name, mm_error *err)
{
    if (!strcmp(w, "&&") || !strcmp(w, ";") || !strcmp(w, "|") || !strcmp(w, "||")) {
        mm_err_at(err, name, line, col, "'%s': only one `swift sft` command is read", w);
        return -1;
    }
    if (!strncmp(w, "--", 2) && w[2]) {
        if (flush(c, p, name, err))
            return -1;
        const char *eq = strchr(w, '=');
        snprintf(p->key, sizeof p->key, "%.*s", (int)(eq ? eq - w - 2 : (long)strlen(w) - 2),
                 w + 2);
        p->line = line;
        p->col = col;
        return eq ? flag_word(c, p, eq + 1, line, col + (int)(eq - w) + 1, name, err) : 0;
    }
    if (!p->key[0]) {
        mm_err_at(err, name, line, col, "'%s': expected a --flag", w);
        return -1;
    }
    if (!p->vals && !(p->vals = mm_node_new(MM_NODE_SEQ, line, col)))
        return oom(name, err);
    mm_node *v = word_node(w, line, col);
    if (!v || mm_node_seq_push(p->vals, v)) {
        mm_node_free(v);
        return oom(name, err);
    }
    return 0;
}

void imp_swift_cmd_free(swift_cmd *c)
{
    mm_node_free(c->swift);
    mm_node_free(c->trainer);
    mm_node_free(c->env);
    memset(c, 0, sizeof *c);
}

static int split(swift_cmd *c, const char *buf, size_t len, const char *name, mm_error *err)
{
    imp_lexer x = {buf, buf + len, 1, 1};
    pending p;
    memset(&p, 0, sizeof p);
    char w[4096];
    int line = 1, col = 1, rc, count = 0, stage = 0; /* 0 env, 1 after swift, 2 flags */
    while ((rc = imp_lex_word(&x, w, sizeof w, &line, &col)) != 0) {
        if (rc < 0 || ++count > SWIFT_MAX_WORDS) {
            mm_err_at(err, name, line, col, rc < 0 ? "unterminated quote" : "too many words");
            goto fail;
        }
        if (stage == 0 && !strcmp(w, "swift")) {
            stage = 1;
            c->line = line;
            c->col = col;
        } else if (stage == 1) {
            if (strcmp(w, "sft")) {
                mm_err_at(err, name, line, col, "swift %s: only `swift sft` is read (pt, rlhf "
                          "and the others train differently or run more than one model)", w);
                goto fail;
            }
            stage = 2;
        } else if (stage == 0 ? env_word(c, w, line, col, name, err)
                              : flag_word(c, &p, w, line, col, name, err)) {
            goto fail;
        }
    }
    if (stage < 2) {
        mm_err_at(err, name, line, col, "no `swift sft` command");
        goto fail;
    }
    if (flush(c, &p, name, err))
        goto fail;
    return 0;
fail:
    mm_node_free(p.vals);
    return -1;
}

int imp_swift_split(swift_cmd *c, const char *buf, size_t len, const char *name,
                    swift_owns_fn owns, mm_error *err)
{
    memset(c, 0, sizeof *c);
    c->owns = owns;
    c->swift = mm_node_new(MM_NODE_MAP, 1, 1);
    c->trainer = mm_node_new(MM_NODE_MAP, 1, 1);
    c->env = mm_node_new(MM_NODE_MAP, 1, 1);
    if (!c->swift || !c->trainer || !c->env) {
        imp_swift_cmd_free(c);
        return oom(name, err);
    }
    if (split(c, buf, len, name, err)) {
        imp_swift_cmd_free(c);
        return -1;
    }
    return 0;
}
