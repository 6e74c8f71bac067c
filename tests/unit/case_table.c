/* case_table.c - reads the case tables shared by the C and the Lua tests
 * (format at the top of tests/unit/conf_cases.txt). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin_tests.h"

struct buf {
    char *p;
    size_t len, cap;
};

static void add(struct buf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = realloc(b->p, b->cap);
        ck_assert_ptr_nonnull(b->p);
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

/* One "| " line with its escapes; 1 when it ends the file (\E). */
static int decode(struct buf *b, const char *s)
{
    for (; *s && *s != '\n'; s++) {
        char c = *s;
        if (c != '\\') {
            add(b, &c, 1);
            continue;
        }
        switch (*++s) {
        case 't': add(b, "\t", 1); break;
        case 'r': add(b, "\r", 1); break;
        case '0': add(b, "", 1); break;
        case '\\': add(b, "\\", 1); break;
        case 'E': return 1;
        case '{': {
            char *end;
            long k = strtol(s + 1, &end, 10);
            ck_assert_msg(*end == ':' && end[2] == '}' && k > 0, "bad \\{N:c} escape");
            for (long i = 0; i < k; i++)
                add(b, end + 1, 1);
            s = end + 2;
            break;
        }
        default: ck_abort_msg("unknown escape \\%c in a case table", *s);
        }
    }
    add(b, "\n", 1);
    return 0;
}

size_t table_load(const char *path, struct table_case **cases)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    size_t n = 0;
    struct table_case *cur = NULL;
    struct buf b = { NULL, 0, 0 };
    int ended = 0;

    ck_assert_msg(f != NULL, "cannot open %s", path);
    *cases = NULL;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "== ", 3)) {
            *cases = realloc(*cases, (n + 1) * sizeof(**cases));
            ck_assert_ptr_nonnull(*cases);
            cur = &(*cases)[n++];
            memset(cur, 0, sizeof(*cur));
            snprintf(cur->name, sizeof(cur->name), "%.*s", (int)strcspn(line + 3, "\n"), line + 3);
            b.len = 0;
            add(&b, "", 0);
            ended = 0;
        } else if (cur && line[0] == '|') {
            ck_assert_msg(!ended, "%s: a line after \\E", cur->name);
            ended = decode(&b, line[1] == ' ' ? line + 2 : line + 1);
            cur->text = realloc(cur->text, b.len + 1);
            memcpy(cur->text, b.p, b.len + 1);
            cur->len = b.len;
        } else if (cur && line[0] != '#' && line[0] != '\n') {
            snprintf(cur->expect, sizeof(cur->expect), "%.*s", (int)strcspn(line, "\n"), line);
        }
    }
    fclose(f);
    free(b.p);
    for (size_t i = 0; i < n; i++) {
        ck_assert_msg((*cases)[i].expect[0], "%s: no expectation", (*cases)[i].name);
        if (!(*cases)[i].text)
            (*cases)[i].text = calloc(1, 1);
    }
    return n;
}

void table_free(struct table_case *cases, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(cases[i].text);
    free(cases);
}
