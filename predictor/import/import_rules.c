/* import_rules.c - what the job readers share: the table of input keys that
 * are not mapped (ignored with a reason, accepted only at the modelled
 * default, or refused), typed reads that also take DeepSpeed's 5e8-style
 * integers and the command line's True/False, and the job state. */
#include "import_rd.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void imp_job_init(imp_job *j, imp_spec *s)
{
    memset(j, 0, sizeof *j);
    j->s = s;
    j->micro_batch = 8; /* TrainingArguments defaults (transformers training_args.py) */
    j->grad_accum = 1;
    j->max_grad_norm = 1.0;
    j->zero_stage = -1;
}

void imp_unset(imp_section *sec, const char *key)
{
    for (size_t i = 0; i < sec->n; i++)
        if (strcmp(sec->kv[i].key, key) == 0) {
            memmove(&sec->kv[i], &sec->kv[i + 1], (sec->n - i - 1) * sizeof sec->kv[0]);
            sec->n--;
            return;
        }
}

int imp_is_auto(const mm_node *v)
{
    return v && v->type == MM_NODE_SCALAR && v->str && strcmp(v->str, "auto") == 0;
}

void imp_where_key(const hfc *h, const char *key, char *buf, size_t n)
{
    int line = h->map ? h->map->line : 0, col = h->map ? h->map->col : 0;
    for (size_t i = 0; h->map && i < h->map->n; i++)
        if (strcmp(h->map->keys[i], key) == 0) {
            line = h->map->key_line[i];
            col = h->map->key_col[i];
        }
    char w[160];
    snprintf(buf, n, "%s:%d:%d: %s", h->file, line, col, hf_where(h, key, w, sizeof w));
}

static int parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double d = strtod(s, &end);
    if (!*s || *end || errno || !isfinite(d))
        return -1;
    *out = d;
    return 0;
}

int imp_num(hfc *h, const char *key, double def, double *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    if (v->type != MM_NODE_SCALAR || !v->str || parse_num(v->str, out))
        return hf_fail(h, key, "expected a number");
    return 0;
}

int imp_u64(hfc *h, const char *key, uint64_t def, uint64_t min, uint64_t max, uint64_t *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    double d;
    if (v->type != MM_NODE_SCALAR || !v->str || parse_num(v->str, &d) || d < 0 || d != floor(d) ||
        d > 9007199254740992.0)
        return hf_fail(h, key, "expected a non-negative integer");
    if (d < (double)min || d > (double)max)
        return hf_fail(h, key, "%.17g is out of range (%llu..%llu)", d, (unsigned long long)min,
                       (unsigned long long)max);
    *out = (uint64_t)d;
    return 0;
}

/* HfArgumentParser's string_to_bool, and YAML/JSON booleans */
static int bool_word(const char *s, int *out)
{
    static const char *const yes[] = {"true", "yes", "t", "y", "1", NULL};
    static const char *const no[] = {"false", "no", "f", "n", "0", NULL};
    for (size_t i = 0; yes[i]; i++) {
        if (!strcasecmp(s, yes[i]))
            return *out = 1, 0;
        if (!strcasecmp(s, no[i]))
            return *out = 0, 0;
    }
    return -1;
}

int imp_bool(hfc *h, const char *key, int def, int *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    if (v->type != MM_NODE_SCALAR || !v->str || bool_word(v->str, out))
        return hf_fail(h, key, "expected true or false");
    return 0;
}

static const imp_rule *rule_of(const imp_rule *rules, size_t n, const char *key)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(rules[i].key, key) == 0)
            return &rules[i];
    return NULL;
}

/* 'd' rules: the value equals the default (numbers numerically, words by name) */
static int is_default(const mm_node *v, const char *def, size_t dlen)
{
    char d[64];
    snprintf(d, sizeof d, "%.*s", (int)(dlen < 63 ? dlen : 63), def);
    if (v->type != MM_NODE_SCALAR || !v->str)
        return 0;
    if (v->is_null)
        return !strcmp(d, "null");
    double a, b;
    int ba, bb;
    if (!parse_num(v->str, &a) && !parse_num(d, &b))
        return a == b;
    if (!bool_word(v->str, &ba) && !bool_word(d, &bb))
        return ba == bb;
    return !strcasecmp(v->str, d);
}

static int apply_rule(hfc *h, size_t i, const imp_rule *r, const char *what)
{
    char where[160];
    const char *key = h->map->keys[i];
    const mm_node *v = h->map->vals[i];
    hf_where(h, key, where, sizeof where);
    if (r->kind == 'i') {
        imp_note(h->s, "ignored %s: %s", where, r->arg);
        return 0;
    }
    if (r->kind == 'r')
        return hf_fail(h, key, "%s", r->arg);
    const char *bar = strchr(r->arg, '|');
    size_t dlen = bar ? (size_t)(bar - r->arg) : strlen(r->arg);
    if (is_default(v, r->arg, dlen)) {
        imp_note(h->s, "ignored %s: %.*s is %s's default, %s", where, (int)dlen, r->arg, what,
                 bar ? bar + 1 : "");
        return 0;
    }
    return hf_fail(h, key, "only %.*s (%s's default) is modelled: %s", (int)dlen, r->arg, what,
                   bar ? bar + 1 : "");
}

int imp_rules_apply(hfc *h, const imp_rule *rules, size_t n, const char *what)
{
    for (size_t i = 0; h->map && i < h->map->n && i < sizeof h->used; i++) {
        const imp_rule *r = h->used[i] ? NULL : rule_of(rules, n, h->map->keys[i]);
        if (r && apply_rule(h, i, r, what))
            return -1;
        if (r)
            h->used[i] = 1;
    }
    return 0;
}

int imp_rules_finish(hfc *h, const imp_rule *rules, size_t n, const char *what)
{
    if (!h->map)
        return 0;
    char where[160];
    for (size_t i = 0; i < h->map->n && i < sizeof h->used; i++) {
        if (h->used[i])
            continue;
        const imp_rule *r = rule_of(rules, n, h->map->keys[i]);
        if (r) {
            if (apply_rule(h, i, r, what))
                return -1;
            continue;
        }
        if (h->s->allow_unknown) {
            imp_note(h->s, "ignored %s: unknown to mmguard (--allow-unknown)",
                     hf_where(h, h->map->keys[i], where, sizeof where));
            continue;
        }
        return hf_fail(h, h->map->keys[i], "unknown %s key: mmguard does not know whether it "
                                           "changes memory (--allow-unknown lists it and goes on)",
                       what);
    }
    if (h->map->n > sizeof h->used)
        return hf_fail(h, "", "more than %zu keys", sizeof h->used);
    return 0;
}

mm_node *imp_parse_map(imp_job *j, const char *buf, size_t len, const char *name, int json,
                       const char *what, mm_error *err)
{
    mm_node *root = json ? mm_json_parse(buf, len, name, err) : mm_yaml_parse(buf, len, name, err);
    if (!root)
        return NULL;
    if (root->type != MM_NODE_MAP) {
        mm_err_at(err, name, root->line, root->col, "%s", what);
        mm_node_free(root);
        return NULL;
    }
    imp_source(j->s, name, buf, len);
    return root;
}

int imp_read_with(imp_job *j, const char *path, imp_buffer_fn fn, mm_error *err)
{
    size_t len;
    char *buf = imp_read_file(path, &len, err);
    if (!buf)
        return -1;
    int rc = fn(j, buf, len, path, err);
    free(buf);
    return rc;
}
