/* toml.c (layer import) - the TOML subset torchtitan's train_configs use,
 * read into the same document tree as YAML and JSON (node.h), each value
 * with its line and column: [table] and [dotted.table] headers, key = value
 * with bare, quoted and dotted keys, basic "..." and literal '...' strings,
 * integers, floats, true/false, arrays (over several lines, trailing comma,
 * comments inside) and # comments.  What torchtitan's files never use is
 * refused with its line rather than guessed: multi-line strings, inline
 * tables, arrays of tables [[x]], dates, hex/octal/binary integers, inf and
 * nan.  A key or table defined twice is an error (TOML 1.0 forbids it).
 * Strings are quoted scalars; numbers and booleans are plain scalars holding
 * their text (underscores removed), as a YAML reader gives them. */
#include "toml.h"
#include "util.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOML_MAX_DEPTH 16   /* nested arrays and dotted keys */
#define TOML_MAX_WORD 4096

typedef struct tx {
    const char *p, *end, *name;
    int line, col;
    mm_error *err;
} tx;

static int peek(const tx *x)
{
    return x->p < x->end ? (unsigned char)*x->p : -1;
}

static void adv(tx *x)
{
    if (*x->p == '\n') {
        x->line++;
        x->col = 1;
    } else {
        x->col++;
    }
    x->p++;
}

static int fail(tx *x, const char *msg)
{
    mm_err_at(x->err, x->name, x->line, x->col, "%s", msg);
    return -1;
}

/* spaces and tabs; with nl also newlines and comments (inside arrays) */
static void skip_ws(tx *x, int nl)
{
    for (;;) {
        int c = peek(x);
        if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r'))) {
            adv(x);
        } else if (nl && c == '#') {
            while (peek(x) >= 0 && peek(x) != '\n')
                adv(x);
        } else {
            return;
        }
    }
}

/* after a value or header: spaces, an optional comment, then the line's end */
static int end_of_line(tx *x)
{
    skip_ws(x, 0);
    if (peek(x) == '#')
        while (peek(x) >= 0 && peek(x) != '\n')
            adv(x);
    if (peek(x) == '\r')
        adv(x);
    if (peek(x) >= 0 && peek(x) != '\n')
        return fail(x, "expected the end of the line");
    if (peek(x) == '\n')
        adv(x);
    return 0;
}

/* a "basic" or 'literal' string on one line into out */
static int read_string(tx *x, char *out, size_t n)
{
    char q = *x->p;
    size_t o = 0;
    if (x->p + 2 < x->end && x->p[1] == q && x->p[2] == q)
        return fail(x, "multi-line strings are not read (torchtitan's configs use none)");
    adv(x);
    for (;;) {
        int c = peek(x);
        if (c < 0 || c == '\n')
            return fail(x, "unterminated string");
        if (c == q)
            break;
        if (q == '"' && c == '\\') {
            adv(x);
            c = peek(x);
            static const char from[] = "\"\\btnfr", to[] = "\"\\\b\t\n\f\r";
            const char *e = c > 0 ? strchr(from, c) : NULL;
            if (!e)
                return fail(x, "unsupported escape in a string (\\uXXXX is not read)");
            c = to[e - from];
        } else if (c < 0x20 && c != '\t') {
            return fail(x, "control character in a string");
        }
        if (o + 1 >= n)
            return fail(x, "string too long");
        out[o++] = (char)c;
        adv(x);
    }
    adv(x);
    out[o] = '\0';
    return 0;
}

static int bare_char(int c)
{
    return c >= 0 && (isalnum(c) || c == '_' || c == '-');
}

/* one key part: bare or quoted */
static int read_key_part(tx *x, char *out, size_t n)
{
    skip_ws(x, 0);
    if (peek(x) == '"' || peek(x) == '\'')
        return read_string(x, out, n);
    size_t o = 0;
    while (bare_char(peek(x))) {
        if (o + 1 >= n)
            return fail(x, "key too long");
        out[o++] = *x->p;
        adv(x);
    }
    out[o] = '\0';
    return o ? 0 : fail(x, "expected a key");
}

/* the table `key` of map, created when absent; an error when key holds a value */
static mm_node *subtable(tx *x, mm_node *map, const char *key, int line, int col, int *made)
{
    mm_node *t = mm_node_get(map, key);
    *made = 0;
    if (t) {
        if (t->type != MM_NODE_MAP) {
            mm_err_at(x->err, x->name, line, col, "%s: already defined as a value", key);
            return NULL;
        }
        return t;
    }
    t = mm_node_new(MM_NODE_MAP, line, col);
    if (!t || mm_node_map_put(map, key, t, line, col)) {
        mm_node_free(t);
        mm_err(x->err, "%s: out of memory", x->name);
        return NULL;
    }
    *made = 1;
    return t;
}

/* a dotted key: the tables before its last part are walked (created), the
 * last part is left in last; *where = the map that holds it */
static int read_key(tx *x, mm_node *map, char *last, size_t n, mm_node **where, int *line,
                    int *col)
{
    int made;
    for (int depth = 0;; depth++) {
        if (depth > TOML_MAX_DEPTH)
            return fail(x, "key nested too deeply");
        skip_ws(x, 0);
        *line = x->line;
        *col = x->col;
        if (read_key_part(x, last, n))
            return -1;
        skip_ws(x, 0);
        if (peek(x) != '.')
            break;
        adv(x);
        if (!(map = subtable(x, map, last, *line, *col, &made)))
            return -1;
    }
    *where = map;
    return 0;
}

static mm_node *scalar(tx *x, const char *text, int quoted, int line, int col)
{
    mm_node *v = mm_node_new(MM_NODE_SCALAR, line, col);
    if (!v || !(v->str = strdup(text))) {
        mm_node_free(v);
        mm_err(x->err, "%s: out of memory", x->name);
        return NULL;
    }
    v->quoted = quoted;
    return v;
}

/* a number or true/false: the word is checked against TOML's grammar */
static int check_word(tx *x, char *w)
{
    if (!strcmp(w, "true") || !strcmp(w, "false"))
        return 0;
    const char *p = w + (*w == '+' || *w == '-');
    if (!strcmp(p, "inf") || !strcmp(p, "nan"))
        return fail(x, "inf and nan are not read");
    if (p[0] == '0' && p[1] && strchr("xob", p[1]))
        return fail(x, "hexadecimal, octal and binary integers are not read");
    if (!isdigit((unsigned char)*p))
        return fail(x, "expected a string, a number, true, false or an array");
    size_t o = 0;
    for (const char *q = w; *q; q++) {
        if (*q == '_') {
            if (q == w || !isdigit((unsigned char)q[-1]) || !isdigit((unsigned char)q[1]))
                return fail(x, "an underscore in a number stands between two digits");
            continue;
        }
        if (!isdigit((unsigned char)*q) && !strchr("+-.eE", *q))
            return fail(x, "not a number (dates and times are not read)");
        w[o++] = *q;
    }
    w[o] = '\0';
    char *end;
    (void)strtod(w, &end);
    return *end ? fail(x, "not a number") : 0;
}

static mm_node *read_value(tx *x, int depth);

static mm_node *read_array(tx *x, int depth)
{
    mm_node *seq = mm_node_new(MM_NODE_SEQ, x->line, x->col);
    if (!seq) {
        mm_err(x->err, "%s: out of memory", x->name);
        return NULL;
    }
    adv(x);
    for (;;) {
        skip_ws(x, 1);
        if (peek(x) == ']')
            break;
        mm_node *v = read_value(x, depth + 1);
        if (!v || mm_node_seq_push(seq, v)) {
            if (v)
                mm_err(x->err, "%s: out of memory", x->name);
            mm_node_free(v);
            mm_node_free(seq);
            return NULL;
        }
        skip_ws(x, 1);
        if (peek(x) == ',') {
            adv(x);
            continue;
        }
        if (peek(x) != ']') {
            fail(x, "expected , or ] in an array");
            mm_node_free(seq);
            return NULL;
        }
    }
    adv(x);
    return seq;
}

static mm_node *read_value(tx *x, int depth)
{
    static char w[TOML_MAX_WORD]; /* not reentrant: one document at a time is enough */
    int line = x->line, col = x->col, c = peek(x);
    if (depth > TOML_MAX_DEPTH)
        return fail(x, "arrays nested too deeply"), NULL;
    if (c == '[')
        return read_array(x, depth);
    if (c == '{')
        return fail(x, "inline tables are not read (torchtitan's configs use none)"), NULL;
    if (c == '"' || c == '\'')
        return read_string(x, w, sizeof w) ? NULL : scalar(x, w, 1, line, col);
    size_t o = 0;
    while (peek(x) >= 0 && !strchr(" \t\r\n,]#", peek(x))) {
        if (o + 1 >= sizeof w)
            return fail(x, "value too long"), NULL;
        w[o++] = *x->p;
        adv(x);
    }
    w[o] = '\0';
    if (!o)
        return fail(x, "expected a value"), NULL;
    x->line = line; /* errors in the word point at its start */
    int xc = x->col;
    x->col = col;
    if (check_word(x, w))
        return NULL;
    x->col = xc;
    return scalar(x, w, 0, line, col);
}

/* [a.b.c]: the table (created); defining one twice is an error */
static mm_node *read_header(tx *x, mm_node *root)
{
    int line = x->line, col = x->col, made = 0;
    adv(x);
    if (peek(x) == '[')
        return fail(x, "arrays of tables [[...]] are not read (torchtitan's configs use none)"),
               NULL;
    char part[256];
    mm_node *t = root;
    for (int depth = 0;; depth++) {
        if (depth > TOML_MAX_DEPTH)
            return fail(x, "table nested too deeply"), NULL;
        int kl = x->line, kc = x->col;
        if (read_key_part(x, part, sizeof part) || !(t = subtable(x, t, part, kl, kc, &made)))
            return NULL;
        skip_ws(x, 0);
        if (peek(x) == '.') {
            adv(x);
            continue;
        }
        break;
    }
    if (peek(x) != ']')
        return fail(x, "expected ] closing the table header"), NULL;
    adv(x);
    if (!made && t->line < 0) {
        mm_err_at(x->err, x->name, line, col, "table [%s] defined twice", part);
        return NULL;
    }
    t->line = -line; /* negative: defined by a header (its line kept for messages) */
    t->col = col;
    return end_of_line(x) ? NULL : t;
}

static int read_pair(tx *x, mm_node *table)
{
    char key[256];
    mm_node *map;
    int line, col;
    if (read_key(x, table, key, sizeof key, &map, &line, &col))
        return -1;
    if (peek(x) != '=')
        return fail(x, "expected = after the key");
    adv(x);
    skip_ws(x, 0);
    if (mm_node_get(map, key)) {
        mm_err_at(x->err, x->name, line, col, "%s: defined twice", key);
        return -1;
    }
    mm_node *v = read_value(x, 0);
    if (!v)
        return -1;
    if (mm_node_map_put(map, key, v, line, col)) {
        mm_node_free(v);
        mm_err(x->err, "%s: out of memory", x->name);
        return -1;
    }
    return end_of_line(x);
}

/* header lines were marked with negative lines; make them positive again */
static void unmark(mm_node *n)
{
    if (n->line < 0)
        n->line = -n->line;
    for (size_t i = 0; n->type != MM_NODE_SCALAR && i < n->n; i++)
        unmark(n->vals[i]);
}

mm_node *mm_toml_parse(const char *buf, size_t len, const char *name, mm_error *err)
{
    tx x = {buf, buf + len, name, 1, 1, err};
    mm_node *root = mm_node_new(MM_NODE_MAP, 1, 1), *table = root;
    if (!root) {
        mm_err(err, "%s: out of memory", name);
        return NULL;
    }
    if (len >= 3 && !memcmp(buf, "\xef\xbb\xbf", 3))
        x.p += 3;
    while (table) {
        skip_ws(&x, 1);
        int c = peek(&x);
        if (c < 0)
            break;
        if (c == '[')
            table = read_header(&x, root);
        else if (read_pair(&x, table))
            table = NULL;
    }
    if (!table) {
        mm_node_free(root);
        return NULL;
    }
    unmark(root);
    return root;
}
