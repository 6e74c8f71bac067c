/* import_emit.c - the intermediate form as a commented YAML spec: every
 * value says where it came from, then what was assumed and every input key
 * that was ignored and why. */
#include "import.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (int tries = 0; tries < 2 && !b->oom; tries++) {
        va_start(ap, fmt);
        int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && b->n + (size_t)k < b->cap) {
            b->n += (size_t)k;
            return;
        }
        size_t cap = (b->cap + (size_t)k + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static void section(sbuf *b, const imp_section *s, const char *indent)
{
    for (size_t i = 0; i < s->n; i++) {
        const imp_kv *kv = &s->kv[i];
        char line[1800];
        snprintf(line, sizeof line, "%s%s: %s", indent, kv->key, kv->val);
        if (kv->from[0])
            put(b, "%-48s # %s\n", line, kv->from);
        else
            put(b, "%s\n", line);
    }
}

char *imp_emit(const imp_spec *s)
{
    sbuf b = {0};
    put(&b, "# mmguard spec written by `mmguard import` (" MM_VERSION ") from:\n");
    for (size_t i = 0; i < s->nsources; i++)
        put(&b, "#   %s\n", s->sources[i]);
    if (s->nnotes)
        put(&b, "# Assumed and ignored (edit the spec if an assumption is not your job's):\n");
    for (size_t i = 0; i < s->nnotes; i++)
        put(&b, "#   %s\n", s->notes[i]);
    put(&b, "name: %s\n", s->name[0] ? s->name : "imported");
    put(&b, "modules:\n");
    static const char *const order[] = {"vision", "connector", "decoder"};
    for (size_t k = 0; k < 3; k++)
        for (size_t i = 0; i < s->nmod; i++) {
            if (strcmp(s->mod[i].type, order[k]) || !s->mod[i].n)
                continue;
            put(&b, "  - name: %s\n", s->mod[i].name);
            put(&b, "    type: %s\n", s->mod[i].type);
            section(&b, &s->mod[i], "    ");
        }
    const imp_section *secs[] = {&s->training, &s->framework, &s->deepspeed, &s->fsdp, &s->ddp};
    for (size_t k = 0; k < sizeof secs / sizeof secs[0]; k++) {
        if (!secs[k]->n && k != 0)
            continue;
        put(&b, "%s:\n", secs[k]->name);
        section(&b, secs[k], "  ");
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
