/* keys.c - table-driven decoding of one mapping (see keys.h). */
#include "keys.h"
#include "layer_set.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int key_fail(dctx *c, const mm_node *at, const char *path, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    mm_err_at(c->err, c->file, at ? at->line : 0, at ? at->col : 0, "%s: %s", path, what);
    return -1;
}

int key_fail_key(dctx *c, const mm_node *map, size_t i, const char *path, const char *what)
{
    mm_err_at(c->err, c->file, map->key_line[i], map->key_col[i], "%s: %s", path, what);
    return -1;
}

const char *key_type_name(const mm_node *n)
{
    return n->type == MM_NODE_MAP ? "a mapping" : n->type == MM_NODE_SEQ ? "a list" : "a scalar";
}

/* snprintf(buf, n, "%s%s%s", prefix, *prefix && *key ? "." : "", key), byte
 * for byte (truncated to n - 1), without the format machinery: every key of
 * every map gets its path, used only when the key is refused */
const char *key_path(char *buf, size_t n, const char *prefix, const char *key)
{
    if (!n)
        return buf;
    size_t at = 0;
    const char *parts[3] = {prefix, *prefix && *key ? "." : "", key};
    for (int p = 0; p < 3; p++)
        for (const char *s = parts[p]; *s && at + 1 < n; s++)
            buf[at++] = *s;
    buf[at] = 0;
    return buf;
}

int key_parse_u64(const char *s, uint64_t *out)
{
    if (!*s || !isdigit((unsigned char)s[0]))
        return -1;
    if (!strpbrk(s, "eE.")) {
        errno = 0;
        char *end;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || *end)
            return -1;
        *out = v;
        return 0;
    }
    /* 5e8 style (DeepSpeed configs): must be an exact integer below 2^53 */
    errno = 0;
    char *end;
    double d = strtod(s, &end);
    if (errno || *end || !isfinite(d) || d < 0 || d > 9007199254740992.0 || floor(d) != d)
        return -1;
    *out = (uint64_t)d;
    return 0;
}

int key_index(const keydesc *keys, size_t nkeys, const char *key, unsigned kinds)
{
    int any = -1;
    for (size_t j = 0; j < nkeys; j++) {
        if (keys[j].key[0] != key[0] || strcmp(keys[j].key, key) != 0)
            continue;
        if (!kinds || !keys[j].kinds || (keys[j].kinds & kinds))
            return (int)j; /* the entry for this module kind */
        if (any < 0)
            any = (int)j;
    }
    return any;
}

static int decode_int(dctx *c, const keydesc *k, const mm_node *v, char *field, const char *path)
{
    const char *s = v->str;
    int neg = s[0] == '-';
    uint64_t u;
    if (v->quoted || key_parse_u64(neg ? s + 1 : s, &u))
        return key_fail(c, v, path, "expected an integer, got '%s'", s);
    if ((neg && (k->kind == K_UINT || k->min >= 0 || (double)u > -k->min)) ||
        (!neg && ((double)u > k->max || (double)u < k->min)))
        return key_fail(c, v, path, "%s is out of range (%.0f..%.0f)", s, k->min, k->max);
    if (k->kind == K_UINT)
        *(uint64_t *)(void *)field = u;
    else if (k->kind == K_INT32) /* the range check keeps it within int */
        *(int *)(void *)field = neg ? -(int)u : (int)u;
    else
        *(int64_t *)(void *)field = neg ? -(int64_t)u : (int64_t)u;
    return 0;
}

static int decode_enum(dctx *c, const keydesc *k, const mm_node *v, char *field, const char *path)
{
    const char *s = v->str;
    size_t n = 0;
    while (k->enums[n])
        n++;
    for (size_t i = 0; i < n; i++)
        if (strcmp(s, k->enums[i]) == 0) {
            *(int *)(void *)field = (int)i;
            return 0;
        }
    const char *sug = mm_suggest(s, k->enums, n);
    char list[384] = "";
    for (size_t i = 0; i < n; i++) {
        strncat(list, k->enums[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n)
            strncat(list, " | ", sizeof list - strlen(list) - 1);
    }
    if (sug)
        return key_fail(c, v, path, "unknown value '%s' (did you mean '%s'? expected %s)", s, sug,
                        list);
    return key_fail(c, v, path, "unknown value '%s' (expected %s)", s, list);
}

static int decode_string(dctx *c, const keydesc *k, const mm_node *v, char *field,
                         const char *path)
{
    const char *s = v->str;
    size_t cap = k->kind == K_NAME ? MM_MAX_NAME : 128;
    if (!*s)
        return key_fail(c, v, path, "must not be empty");
    if (strlen(s) >= cap)
        return key_fail(c, v, path, "longer than %zu characters", cap - 1);
    for (const char *p = s; *p; p++) {
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return key_fail(c, v, path, "contains control characters");
        if (k->kind == K_NAME && !isalnum((unsigned char)*p) && *p != '_' && *p != '-')
            return key_fail(c, v, path, "'%s': names use letters, digits, '_' and '-' only", s);
    }
    mm_strlcpy(field, s, cap);
    return 0;
}

static int decode_version(dctx *c, const keydesc *k, const mm_node *v, char *field,
                          const char *path)
{
    int a = 0, b = 0, p = 0;
    char tail;
    int n = sscanf(v->str, "%d.%d.%d%c", &a, &b, &p, &tail);
    if (n < 2 || n > 3 || a < 0 || b < 0 || p < 0 || a > 1000 || b > 1000 || p > 100000)
        return key_fail(c, v, path, "expected a version like \"4.46\" or \"0.14.3\", got '%s'",
                        v->str);
    int *f = (int *)(void *)field;
    f[0] = a;
    f[1] = b;
    if (k->nver == 3)
        f[2] = p;
    return 0;
}

/* a list of layer indices below k->max (the caller checks against the depth) */
static int decode_layers(dctx *c, const keydesc *k, const mm_node *v, char *field,
                         const char *path)
{
    layer_set *set = (layer_set *)(void *)field;
    memset(set, 0, sizeof *set);
    if (v->type != MM_NODE_SEQ)
        return key_fail(c, v, path, "expected a list of layer indices, got %s",
                        key_type_name(v));
    for (size_t i = 0; i < v->n; i++) {
        const mm_node *e = v->vals[i];
        uint64_t u;
        if (e->type != MM_NODE_SCALAR || e->is_null || e->quoted || key_parse_u64(e->str, &u))
            return key_fail(c, e, path, "expected a layer index (0, 1, ...)");
        if (u >= MM_MAX_LAYERS || (k->max > 0 && (double)u > k->max))
            return key_fail(c, e, path, "layer %llu is out of range", (unsigned long long)u);
        if (lset_has(set, u))
            return key_fail(c, e, path, "layer %llu is listed twice", (unsigned long long)u);
        lset_add(set, u);
    }
    return 0;
}

int key_decode_scalar(dctx *c, const keydesc *k, const mm_node *v, void *base, const char *path)
{
    char *field = (char *)base + k->off;
    if (k->kind == K_SPECIAL)
        return 0;
    if (k->kind == K_LAYERS)
        return decode_layers(c, k, v, field, path);
    if (v->type != MM_NODE_SCALAR || v->is_null)
        return key_fail(c, v, path, "expected %s, got %s",
                        k->kind == K_BOOL ? "true or false" : k->kind == K_ENUM ? "a name"
                                                                              : "a value",
                        v->is_null ? "null" : key_type_name(v));
    const char *s = v->str;
    switch (k->kind) {
    case K_UINT:
    case K_INT:
    case K_INT32:
        return decode_int(c, k, v, field, path);
    case K_BOOL:
        if (!v->quoted && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "True"))) {
            *(int *)(void *)field = 1;
            return 0;
        }
        if (!v->quoted && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "False"))) {
            *(int *)(void *)field = 0;
            return 0;
        }
        return key_fail(c, v, path, "expected true or false, got '%s'", s);
    case K_FLOAT: {
        errno = 0;
        char *end;
        double d = strtod(s, &end);
        if (v->quoted || !*s || *end || errno || !isfinite(d))
            return key_fail(c, v, path, "expected a number, got '%s'", s);
        if (d < k->min || d > k->max)
            return key_fail(c, v, path, "%s is out of range (%g..%g)", s, k->min, k->max);
        *(double *)(void *)field = d;
        return 0;
    }
    case K_ENUM:
        return decode_enum(c, k, v, field, path);
    case K_STRING:
    case K_NAME:
        return decode_string(c, k, v, field, path);
    case K_SIZE: {
        uint64_t b;
        mm_error e2;
        if (mm_parse_size(s, &b, &e2))
            return key_fail(c, v, path, "%s", e2.msg);
        *(uint64_t *)(void *)field = b;
        return 0;
    }
    case K_VERSION:
        return decode_version(c, k, v, field, path);
    default:
        return key_fail(c, v, path, "internal: unhandled key kind");
    }
}

static int unknown_key(dctx *c, const mm_node *map, size_t i, const keydesc *keys, size_t nkeys,
                       const char *path, unsigned kinds)
{
    const char *cands[128];
    size_t nc = 0;
    for (size_t q = 0; q < nkeys && nc < 128; q++)
        if (!kinds || !keys[q].kinds || (keys[q].kinds & kinds))
            cands[nc++] = keys[q].key;
    const char *sug = mm_suggest(map->keys[i], cands, nc);
    char what[160];
    if (sug)
        snprintf(what, sizeof what, "unknown key (did you mean '%s'?)", sug);
    else
        snprintf(what, sizeof what, "unknown key");
    return key_fail_key(c, map, i, path, what);
}

int key_decode_map(dctx *c, const mm_node *map, const keydesc *keys, size_t nkeys, void *base,
                   const char *prefix, unsigned kinds, const char *kind_name,
                   unsigned char *seen)
{
    char path[256];
    if (map->type != MM_NODE_MAP)
        return key_fail(c, map, prefix, "expected a mapping, got %s", key_type_name(map));
    for (size_t i = 0; i < map->n; i++) {
        key_path(path, sizeof path, prefix, map->keys[i]);
        int j = key_index(keys, nkeys, map->keys[i], kinds);
        if (j < 0)
            return unknown_key(c, map, i, keys, nkeys, path, kinds);
        if (kinds && keys[j].kinds && !(keys[j].kinds & kinds)) {
            char what[160];
            snprintf(what, sizeof what, "does not apply to a %s module", kind_name);
            return key_fail_key(c, map, i, path, what);
        }
        if (seen)
            seen[j] = 1;
        if (key_decode_scalar(c, &keys[j], map->vals[i], base, path))
            return -1;
    }
    return 0;
}

int key_check_required(dctx *c, const mm_node *map, const keydesc *keys, size_t nkeys,
                       const unsigned char *seen, const char *prefix, unsigned kinds)
{
    for (size_t j = 0; j < nkeys; j++) {
        if (!keys[j].required || seen[j] || (kinds && keys[j].kinds && !(keys[j].kinds & kinds)))
            continue;
        char path[256];
        return key_fail(c, map, key_path(path, sizeof path, prefix, keys[j].key),
                        "required key is missing");
    }
    return 0;
}
