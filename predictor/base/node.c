/* node.c - the position-carrying document tree and its two front ends.
 * Hostile input is bounded: nesting depth (MM_MAX_DEPTH), total node count,
 * and YAML aliases are refused outright (no "billion laughs" expansion). */
#include "node.h"
#include "util.h"

#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#define MM_MAX_NODES 100000

mm_node *mm_node_new(mm_node_type t, int line, int col)
{
    mm_node *n = calloc(1, sizeof *n);
    if (n) {
        n->type = t;
        n->line = line;
        n->col = col;
    }
    return n;
}

void mm_node_free(mm_node *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->n; i++) {
        if (n->keys)
            free(n->keys[i]);
        mm_node_free(n->vals[i]);
    }
    free(n->keys);
    free(n->key_line);
    free(n->key_col);
    free(n->vals);
    free(n->str);
    free(n);
}

static int grow(mm_node *n)
{
    if (n->n < n->cap)
        return 0;
    size_t cap = n->cap ? n->cap * 2 : 8;
    mm_node **v = realloc(n->vals, cap * sizeof *v);
    if (!v)
        return -1;
    n->vals = v;
    if (n->type == MM_NODE_MAP) {
        char **k = realloc(n->keys, cap * sizeof *k);
        if (!k)
            return -1;
        n->keys = k;
        int *kl = realloc(n->key_line, cap * sizeof *kl);
        if (!kl)
            return -1;
        n->key_line = kl;
        int *kc = realloc(n->key_col, cap * sizeof *kc);
        if (!kc)
            return -1;
        n->key_col = kc;
    }
    n->cap = cap;
    return 0;
}

int mm_node_map_put(mm_node *map, const char *key, mm_node *val, int line, int col)
{
    for (size_t i = 0; i < map->n; i++) {
        if (strcmp(map->keys[i], key) == 0) {
            mm_node_free(map->vals[i]);
            map->vals[i] = val;
            return 0;
        }
    }
    if (grow(map))
        return -1;
    char *k = strdup(key);
    if (!k)
        return -1;
    map->keys[map->n] = k;
    map->key_line[map->n] = line;
    map->key_col[map->n] = col;
    map->vals[map->n++] = val;
    return 0;
}

int mm_node_seq_push(mm_node *seq, mm_node *val)
{
    if (grow(seq))
        return -1;
    seq->vals[seq->n++] = val;
    return 0;
}

mm_node *mm_node_get(const mm_node *map, const char *key)
{
    if (!map || map->type != MM_NODE_MAP)
        return NULL;
    for (size_t i = 0; i < map->n; i++)
        if (strcmp(map->keys[i], key) == 0)
            return map->vals[i];
    return NULL;
}

mm_node *mm_node_clone(const mm_node *n)
{
    if (!n)
        return NULL;
    mm_node *c = mm_node_new(n->type, n->line, n->col);
    if (!c)
        return NULL;
    c->quoted = n->quoted;
    c->is_null = n->is_null;
    if (n->str && !(c->str = strdup(n->str)))
        goto fail;
    for (size_t i = 0; i < n->n; i++) {
        mm_node *v = mm_node_clone(n->vals[i]);
        if (!v)
            goto fail;
        int rc = n->type == MM_NODE_MAP
                     ? mm_node_map_put(c, n->keys[i], v, n->key_line[i], n->key_col[i])
                     : mm_node_seq_push(c, v);
        if (rc) {
            mm_node_free(v);
            goto fail;
        }
    }
    return c;
fail:
    mm_node_free(c);
    return NULL;
}

/* ---- YAML ------------------------------------------------------------------ */

typedef struct {
    yaml_parser_t p;
    const char *name;
    mm_error *err;
    size_t count;
} ystate;

static int ynext(ystate *y, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&y->p, ev)) {
        mm_err_at(y->err, y->name, (int)y->p.problem_mark.line + 1,
                  (int)y->p.problem_mark.column + 1, "malformed YAML: %s%s%s",
                  y->p.problem ? y->p.problem : "parse error",
                  y->p.context ? " " : "", y->p.context ? y->p.context : "");
        return -1;
    }
    return 0;
}

static mm_node *yparse_node(ystate *y, yaml_event_t *ev, int depth);

static int is_null_scalar(const yaml_event_t *ev)
{
    if (ev->data.scalar.quoted_implicit && !ev->data.scalar.plain_implicit)
        return 0;
    if (ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    const char *s = (const char *)ev->data.scalar.value;
    return strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
           strcmp(s, "NULL") == 0 || s[0] == '\0';
}

static mm_node *yscalar(ystate *y, yaml_event_t *ev, int line, int col)
{
    if (ev->data.scalar.length > 4096) {
        mm_err_at(y->err, y->name, line, col, "scalar longer than 4096 bytes");
        yaml_event_delete(ev);
        return NULL;
    }
    mm_node *n = mm_node_new(MM_NODE_SCALAR, line, col);
    if (!n || !(n->str = strdup((const char *)ev->data.scalar.value))) {
        mm_err(y->err, "%s: out of memory", y->name);
        mm_node_free(n);
        yaml_event_delete(ev);
        return NULL;
    }
    n->quoted = ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE;
    n->is_null = is_null_scalar(ev);
    yaml_event_delete(ev);
    return n;
}

/* one `key: value` of mapping n; e, the key's event, is consumed */
static int ymap_entry(ystate *y, mm_node *n, yaml_event_t *e, int depth)
{
    int kl = (int)e->start_mark.line + 1, kc = (int)e->start_mark.column + 1;
    if (e->type != YAML_SCALAR_EVENT) {
        mm_err_at(y->err, y->name, kl, kc, "mapping keys must be plain strings");
        yaml_event_delete(e);
        return -1;
    }
    char *key = strdup((const char *)e->data.scalar.value);
    yaml_event_delete(e);
    if (!key) {
        mm_err(y->err, "%s: out of memory", y->name);
        return -1;
    }
    if (mm_node_get(n, key)) {
        mm_err_at(y->err, y->name, kl, kc, "%s: duplicate key", key);
        free(key);
        return -1;
    }
    yaml_event_t ve;
    if (ynext(y, &ve)) {
        free(key);
        return -1;
    }
    mm_node *v = yparse_node(y, &ve, depth + 1);
    if (!v || mm_node_map_put(n, key, v, kl, kc)) {
        if (v)
            mm_err(y->err, "%s: out of memory", y->name);
        mm_node_free(v);
        free(key);
        return -1;
    }
    free(key);
    return 0;
}

/* one item of sequence n; e, its first event, is consumed */
static int yseq_item(ystate *y, mm_node *n, yaml_event_t *e, int depth)
{
    mm_node *v = yparse_node(y, e, depth + 1);
    if (!v || mm_node_seq_push(n, v)) {
        if (v)
            mm_err(y->err, "%s: out of memory", y->name);
        mm_node_free(v);
        return -1;
    }
    return 0;
}

static mm_node *ycollection(ystate *y, yaml_event_t *ev, int line, int col, int depth)
{
    int is_map = ev->type == YAML_MAPPING_START_EVENT;
    yaml_event_delete(ev);
    mm_node *n = mm_node_new(is_map ? MM_NODE_MAP : MM_NODE_SEQ, line, col);
    if (!n) {
        mm_err(y->err, "%s: out of memory", y->name);
        return NULL;
    }
    for (;;) {
        yaml_event_t e;
        if (ynext(y, &e))
            break;
        if (e.type == (is_map ? YAML_MAPPING_END_EVENT : YAML_SEQUENCE_END_EVENT)) {
            yaml_event_delete(&e);
            return n;
        }
        if (is_map ? ymap_entry(y, n, &e, depth) : yseq_item(y, n, &e, depth))
            break;
    }
    mm_node_free(n);
    return NULL;
}

/* `ev` is the first event of the node; it is consumed (deleted) here. */
static mm_node *yparse_node(ystate *y, yaml_event_t *ev, int depth)
{
    int line = (int)ev->start_mark.line + 1, col = (int)ev->start_mark.column + 1;
    if (++y->count > MM_MAX_NODES) {
        mm_err_at(y->err, y->name, line, col, "too many YAML nodes (limit %d)", MM_MAX_NODES);
        yaml_event_delete(ev);
        return NULL;
    }
    if (depth > MM_MAX_DEPTH) {
        mm_err_at(y->err, y->name, line, col, "nesting deeper than %d levels", MM_MAX_DEPTH);
        yaml_event_delete(ev);
        return NULL;
    }
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        mm_err_at(y->err, y->name, line, col,
                  "YAML aliases (*%s) are not supported in specs",
                  (const char *)ev->data.alias.anchor);
        yaml_event_delete(ev);
        return NULL;
    case YAML_SCALAR_EVENT:
        return yscalar(y, ev, line, col);
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        return ycollection(y, ev, line, col, depth);
    default:
        mm_err_at(y->err, y->name, line, col, "unexpected YAML event");
        yaml_event_delete(ev);
        return NULL;
    }
}

mm_node *mm_yaml_parse(const char *buf, size_t len, const char *name, mm_error *err)
{
    ystate y = {.name = name, .err = err};
    if (!yaml_parser_initialize(&y.p)) {
        mm_err(err, "%s: cannot initialise the YAML parser", name);
        return NULL;
    }
    yaml_parser_set_input_string(&y.p, (const unsigned char *)buf, len);
    mm_node *root = NULL;
    yaml_event_t ev;
    /* STREAM-START, DOCUMENT-START, node, DOCUMENT-END, then STREAM-END */
    if (ynext(&y, &ev))
        goto out;
    yaml_event_delete(&ev);
    if (ynext(&y, &ev))
        goto out;
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        mm_err_at(err, name, 1, 1, "empty document");
        goto out;
    }
    yaml_event_delete(&ev);
    if (ynext(&y, &ev))
        goto out;
    root = yparse_node(&y, &ev, 0);
    if (!root)
        goto out;
    if (ynext(&y, &ev)) /* DOCUMENT-END */
        goto fail;
    yaml_event_delete(&ev);
    if (ynext(&y, &ev))
        goto fail;
    if (ev.type != YAML_STREAM_END_EVENT) {
        mm_err_at(err, name, (int)ev.start_mark.line + 1, (int)ev.start_mark.column + 1,
                  "only one YAML document is allowed in a spec");
        yaml_event_delete(&ev);
        goto fail;
    }
    yaml_event_delete(&ev);
    goto out;
fail:
    mm_node_free(root);
    root = NULL;
out:
    yaml_parser_delete(&y.p);
    return root;
}

/* ---- JSON ------------------------------------------------------------------
 * json-c validates the text (and gives the error position); a small scanner
 * then builds the tree with line/col for every key and value, in document
 * order, refusing duplicate keys (json-c would silently keep the last one). */

typedef struct {
    const char *s;
    size_t len, pos;
    int line, col;
    const char *name;
    mm_error *err;
    size_t count;
} jscan;

/* the scanner runs only on text json-c accepted, but never trusts that: every
 * read is bounded by the buffer length */
static char jpeek(const jscan *j)
{
    return j->pos < j->len ? j->s[j->pos] : '\0';
}

static void jadv(jscan *j)
{
    if (j->pos >= j->len)
        return;
    if (j->s[j->pos] == '\n') {
        j->line++;
        j->col = 1;
    } else {
        j->col++;
    }
    j->pos++;
}

static void jws(jscan *j)
{
    while (jpeek(j) == ' ' || jpeek(j) == '\t' || jpeek(j) == '\n' || jpeek(j) == '\r')
        jadv(j);
}

/* text is known valid JSON; decode a string token with json-c for escapes */
static char *jstring(jscan *j)
{
    size_t start = j->pos;
    jadv(j); /* opening quote */
    while (j->pos < j->len && j->s[j->pos] != '"') {
        if (j->s[j->pos] == '\\')
            jadv(j);
        jadv(j);
    }
    if (j->pos >= j->len)
        return NULL;
    jadv(j); /* closing quote */
    size_t tl = j->pos - start;
    struct json_tokener *tok = json_tokener_new();
    if (!tok)
        return NULL;
    json_object *so = json_tokener_parse_ex(tok, j->s + start, (int)tl);
    json_tokener_free(tok);
    char *r = so && json_object_is_type(so, json_type_string)
                  ? strdup(json_object_get_string(so))
                  : NULL;
    json_object_put(so);
    return r;
}

static mm_node *jvalue(jscan *j, int depth);

/* one `"key": value` of object n */
static int jmember(jscan *j, mm_node *n, int depth)
{
    int kl = j->line, kc = j->col;
    char *key = jpeek(j) == '"' ? jstring(j) : NULL;
    if (!key) {
        mm_err_at(j->err, j->name, kl, kc, "malformed JSON: expected a key");
        return -1;
    }
    if (mm_node_get(n, key)) {
        mm_err_at(j->err, j->name, kl, kc, "%s: duplicate key", key);
        free(key);
        return -1;
    }
    jws(j);
    jadv(j); /* ':' */
    mm_node *v = jvalue(j, depth + 1);
    if (!v || mm_node_map_put(n, key, v, kl, kc)) {
        mm_node_free(v);
        free(key);
        return -1;
    }
    free(key);
    return 0;
}

/* one item of array n */
static int jitem(jscan *j, mm_node *n, int depth)
{
    mm_node *v = jvalue(j, depth + 1);
    if (!v || mm_node_seq_push(n, v)) {
        mm_node_free(v);
        return -1;
    }
    return 0;
}

/* an object or an array; j is at its opening bracket */
static mm_node *jcontainer(jscan *j, int is_map, int line, int col, int depth)
{
    mm_node *n = mm_node_new(is_map ? MM_NODE_MAP : MM_NODE_SEQ, line, col);
    if (!n)
        return NULL;
    jadv(j);
    jws(j);
    if (jpeek(j) == (is_map ? '}' : ']')) {
        jadv(j);
        return n;
    }
    for (;;) {
        jws(j);
        if (is_map ? jmember(j, n, depth) : jitem(j, n, depth))
            break;
        jws(j);
        char d = jpeek(j);
        jadv(j);
        if (d != ',')
            return n;
    }
    mm_node_free(n);
    return NULL;
}

/* a string, number, true, false or null; c is its first character */
static mm_node *jscalar(jscan *j, char c, int line, int col)
{
    mm_node *n = mm_node_new(MM_NODE_SCALAR, line, col);
    if (!n)
        return NULL;
    if (c == '"') {
        n->quoted = 1;
        n->str = jstring(j);
        if (!n->str)
            mm_err_at(j->err, j->name, line, col, "malformed JSON string");
    } else {
        size_t start = j->pos;
        while (j->pos < j->len && !strchr(",]} \t\r\n", j->s[j->pos]))
            jadv(j);
        n->str = strndup(j->s + start, j->pos - start);
        if (n->str && strcmp(n->str, "null") == 0)
            n->is_null = 1;
    }
    if (!n->str) {
        mm_node_free(n);
        return NULL;
    }
    return n;
}

static mm_node *jvalue(jscan *j, int depth)
{
    jws(j);
    int line = j->line, col = j->col;
    if (++j->count > MM_MAX_NODES || depth > MM_MAX_DEPTH) {
        mm_err_at(j->err, j->name, line, col, "%s",
                  depth > MM_MAX_DEPTH ? "nesting too deep" : "too many JSON values");
        return NULL;
    }
    char c = jpeek(j);
    if (!c) {
        mm_err_at(j->err, j->name, line, col, "malformed JSON: unexpected end");
        return NULL;
    }
    if (c == '{' || c == '[')
        return jcontainer(j, c == '{', line, col, depth);
    return jscalar(j, c, line, col);
}

mm_node *mm_json_parse(const char *buf, size_t len, const char *name, mm_error *err)
{
    struct json_tokener *tok = json_tokener_new_ex(MM_MAX_DEPTH + 1);
    if (!tok) {
        mm_err(err, "%s: out of memory", name);
        return NULL;
    }
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT); /* no trailing commas, no comments */
    json_object *o = json_tokener_parse_ex(tok, buf, (int)len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    size_t off = json_tokener_get_parse_end(tok);
    if (jerr == json_tokener_continue) {
        jerr = json_tokener_error_parse_eof;
        off = len;
    }
    json_tokener_free(tok);
    /* anything but whitespace after the value is an error too */
    size_t rest = off;
    while (jerr == json_tokener_success && rest < len &&
           (buf[rest] == ' ' || buf[rest] == '\n' || buf[rest] == '\t' || buf[rest] == '\r'))
        rest++;
    if (jerr != json_tokener_success || rest < len || !o) {
        int line = 1, col = 1;
        size_t at = jerr != json_tokener_success ? off : rest;
        for (size_t i = 0; i < at && i < len; i++) {
            if (buf[i] == '\n') {
                line++;
                col = 1;
            } else {
                col++;
            }
        }
        mm_err_at(err, name, line, col, "malformed JSON: %s",
                  jerr != json_tokener_success ? json_tokener_error_desc(jerr)
                  : !o                         ? "empty document"
                                               : "trailing characters after the document");
        json_object_put(o);
        return NULL;
    }
    json_object_put(o);
    jscan j = {.s = buf, .len = len, .line = 1, .col = 1, .name = name, .err = err};
    mm_node *root = jvalue(&j, 0);
    if (!root && err && !err->msg[0])
        mm_err(err, "%s: out of memory", name);
    return root;
}
