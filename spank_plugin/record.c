/* record.c - writing and reading the MMGUARD variable (see record.h). */
#include "record.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum kind { K_STR, K_U64, K_U32, K_DBL, K_TERMS, K_POINTS, K_CARDS };

struct key {
    const char *name;
    enum kind kind;
    size_t off, size;
    int model;      /* part of the peak model (all or none) */
};

#define F(field) offsetof(struct mmg_record, field), sizeof(((struct mmg_record *)0)->field)
static const struct key keys[] = {
    { "decision", K_STR, F(decision), 0 },  { "spec", K_STR, F(spec), 0 },
    { "sha256", K_STR, F(sha256), 0 },      { "model", K_STR, F(model), 0 },
    { "gpu", K_STR, F(gpu), 0 },            { "gpu_mem", K_U64, F(gpu_mem), 0 },
    { "usable", K_U64, F(usable), 0 },      { "dp", K_U32, F(dp), 0 },
    { "request", K_STR, F(request), 0 },    { "peak", K_U64, F(peak), 0 },
    { "alloc", K_U64, F(alloc), 0 },        { "mmb", K_U32, F(mmb), 0 },
    { "host", K_U64, F(host), 0 },          { "error", K_STR, F(error), 0 },
    { "admission", K_STR, F(admission), 0 },
    { "ctx", K_U64, F(ctx), 1 },            { "nccl", K_U64, F(nccl), 1 },
    { "afix", K_U64, F(afix), 1 },          { "afrac", K_DBL, F(afrac), 1 },
    { "dp1", K_U64, F(dp1), 1 },            { "terms", K_TERMS, F(terms), 1 },
    { "res", K_POINTS, F(points), 1 },
    { "cards", K_CARDS, F(cards), 0 },
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))
#define NMODEL 7

/* ---- writing ----------------------------------------------------------------- */

struct out {
    char *buf;
    size_t n, used;
};

__attribute__((format(printf, 2, 3)))
static void put(struct out *o, const char *fmt, ...)
{
    va_list ap;
    int k;
    va_start(ap, fmt);
    k = vsnprintf(o->buf + (o->used < o->n ? o->used : o->n), o->used < o->n ? o->n - o->used : 0,
                  fmt, ap);
    va_end(ap);
    o->used += k > 0 ? (size_t)k : 0;
}

/* put(o, "%s", s) for k bytes of s, without the format machinery: the same
 * truncation (at most n - used - 1 bytes and a NUL while room is left) and
 * the same count */
static void put_bytes(struct out *o, const char *s, size_t k)
{
    if (o->used < o->n) {
        size_t room = o->n - o->used - 1, w = k < room ? k : room;
        memcpy(o->buf + o->used, s, w);
        o->buf[o->used + w] = '\0';
    }
    o->used += k;
}

/* percent-encoded: a run of plain bytes at a time, "%XX" for the others
 * (a vsnprintf per byte was most of the record's cost) */
static void put_str(struct out *o, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned char *run = p;
        while (*p > ' ' && *p < 0x7f && *p != '%')
            p++;
        if (p > run)
            put_bytes(o, (const char *)run, (size_t)(p - run));
        if (*p) {
            char esc[3] = { '%', hex[*p >> 4], hex[*p & 15] };
            put_bytes(o, esc, 3);
            p++;
        }
    }
}

static const char *const kind_names[] = { "fits", "flushes", "oom" };

static void put_cards(struct out *o, const struct mmg_record *r)
{
    for (size_t i = 0; i < r->n_cards && i < MMG_RECORD_CARDS; i++) {
        const struct mmg_card *c = &r->cards[i];
        put(o, "%s", i ? "," : "");
        put_str(o, c->gpu);
        put(o, ":%" PRIu64 ":%" PRIu32 ":%s:%" PRIu64 ":%" PRIu64, c->usable, c->n,
            kind_names[c->kind <= MM_VERDICT_OOM ? c->kind : MM_VERDICT_OOM], c->retries, c->peak);
    }
}

static void put_value(struct out *o, const struct mmg_record *r, const struct key *k)
{
    const char *base = (const char *)r + k->off;
    switch (k->kind) {
    case K_STR: put_str(o, base); break;
    case K_U64: put(o, "%" PRIu64, *(const uint64_t *)(const void *)base); break;
    case K_U32: put(o, "%" PRIu32, *(const uint32_t *)(const void *)base); break;
    case K_DBL: put(o, "%.17g", *(const double *)(const void *)base); break;
    case K_TERMS:
        for (size_t i = 0; i < r->n_terms && i < MM_MAX_TERMS; i++)
            put(o, "%s%" PRIu64 ":%" PRIu64, i ? "," : "", r->terms[i].fixed, r->terms[i].sharded);
        break;
    case K_POINTS:
        for (size_t i = 0; i < r->n_points && i < MMG_RECORD_POINTS; i++) {
            const mm_dp_point *q = &r->points[i];
            put(o, "%s%" PRIu32 "-%" PRIu32 ":%" PRIu64 ":%" PRIu64, i ? "," : "", q->n_from,
                q->n_to, q->reserved, q->paged);
            if (q->allocated)
                put(o, ":%" PRIu64, q->allocated);
        }
        break;
    case K_CARDS: put_cards(o, r); break;
    }
}

static int present(const struct mmg_record *r, const struct key *k)
{
    if (k->model)
        return r->has_model;
    if (!strcmp(k->name, "mmb"))
        return r->has_mmb;
    if (k->kind == K_CARDS)
        return r->n_cards > 0;
    if (k->kind == K_STR)
        return ((const char *)r + k->off)[0] != '\0';
    if (k->kind == K_U32)
        return *(const uint32_t *)(const void *)((const char *)r + k->off) != 0;
    return *(const uint64_t *)(const void *)((const char *)r + k->off) != 0; /* 0: unknown */
}

int mmg_record_format(const struct mmg_record *r, char *buf, size_t n)
{
    struct out o = { buf, n, 0 };
    if (n)
        buf[0] = '\0';
    put(&o, "v=%d", MMG_RECORD_VERSION);
    for (size_t i = 0; i < NKEYS; i++) {
        if (!present(r, &keys[i]))
            continue;
        put(&o, " %s=", keys[i].name);
        put_value(&o, r, &keys[i]);
    }
    return o.used < n && o.used <= MMG_RECORD_MAX ? 0 : -1;
}

/* ---- reading ----------------------------------------------------------------- */

static int hexval(int c)
{
    return isdigit(c) ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10
         : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
}

/* Percent-decode [s, s+n) into dst (size dstlen); control bytes refused. */
static int get_str(const char *s, size_t n, char *dst, size_t dstlen)
{
    size_t used = 0;
    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];
        if (c == '%') {
            int hi, lo;
            if (i + 2 >= n)
                return -1;
            hi = hexval((unsigned char)s[i + 1]);
            lo = hexval((unsigned char)s[i + 2]);
            if (hi < 0 || lo < 0)
                return -1;
            c = hi * 16 + lo;
            i += 2;
        }
        if (c < 0x20 || c == 0x7f || used + 1 >= dstlen)
            return -1;
        dst[used++] = (char)c;
    }
    dst[used] = '\0';
    return 0;
}

/* Decimal digits only, at most 20, within max. */
static int get_u64(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (n == 0 || n > 20)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]) || v > (max - (uint64_t)(s[i] - '0')) / 10)
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

/* A %.17g double in [0, 10]: digits, '.', 'e', sign only. */
static int get_dbl(const char *s, size_t n, double *out)
{
    char buf[40], *end = NULL;
    double v;
    if (n == 0 || n >= sizeof(buf) || strspn(s, "0123456789.eE+-") < n || !isdigit((unsigned char)s[0]))
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    errno = 0;
    v = strtod(buf, &end);
    if (errno || *end || !isfinite(v) || v < 0 || v > 10)
        return -1;
    *out = v;
    return 0;
}

/* Each item of the comma-separated list [s, s+n) through item(); 1..max
 * items, no empty one (a trailing comma included).  The count, or -1. */
typedef int (*item_f)(const char *s, size_t n, size_t idx, struct mmg_record *r);
static long each_item(const char *s, size_t n, size_t max, item_f item, struct mmg_record *r)
{
    size_t i = 0, k = 0;
    while (i < n) {
        const char *c = memchr(s + i, ',', n - i), *end = c ? c : s + n;
        if (k >= max || item(s + i, (size_t)(end - (s + i)), k, r) != 0)
            return -1;
        k++;
        i = (size_t)(end - s) + (c != NULL);
        if (c && i == n)
            return -1; /* trailing comma */
    }
    return k ? (long)k : -1;
}

/* "F:S" */
static int get_term(const char *s, size_t n, size_t idx, struct mmg_record *r)
{
    const char *colon = memchr(s, ':', n);
    mm_dp_term *t = &r->terms[idx];
    return !colon || get_u64(s, (size_t)(colon - s), UINT64_MAX, &t->fixed) != 0 ||
                   get_u64(colon + 1, n - (size_t)(colon - s) - 1, UINT64_MAX, &t->sharded) != 0
               ? -1
               : 0;
}

/* "F:S,F:S,..." with 1..MM_MAX_TERMS terms. */
static int get_terms(const char *s, size_t n, struct mmg_record *r)
{
    long k = each_item(s, n, MM_MAX_TERMS, get_term, r);
    r->n_terms = k > 0 ? (size_t)k : 0;
    return k > 0 ? 0 : -1;
}

/* [s, s+n) split at `sep`: the part before it in *a (length *na), the rest
 * after it; -1 when there is no separator */
static int cut(const char **s, size_t *n, char sep, size_t *na)
{
    const char *c = memchr(*s, sep, *n);
    if (!c)
        return -1;
    *na = (size_t)(c - *s);
    *n -= *na + 1;
    *s = c + 1;
    return 0;
}

/* "PAGED" or "PAGED:ALLOCATED" (ALLOCATED >= 1: a per-degree point, dp.h) */
static int get_paged(const char *s, size_t n, mm_dp_point *q)
{
    const char *d = s;
    size_t nd;
    q->allocated = 0;
    if (cut(&s, &n, ':', &nd) != 0)
        return get_u64(d, n, UINT64_MAX, &q->paged);
    return get_u64(d, nd, UINT64_MAX, &q->paged) != 0 ||
                   get_u64(s, n, UINT64_MAX, &q->allocated) != 0 || q->allocated == 0
               ? -1
               : 0;
}

/* "FROM-TO:RESERVED:PAGED[:ALLOCATED]" with 1 <= FROM <= TO, after the previous TO */
static int get_point(const char *s, size_t n, size_t idx, struct mmg_record *r)
{
    const char *a = s, *b, *c;
    size_t na, nb, nc;
    uint64_t from, to;
    uint32_t after = idx ? r->points[idx - 1].n_to : 0;
    mm_dp_point *q = &r->points[idx];
    if ((idx && after == UINT32_MAX) || cut(&s, &n, '-', &na) != 0)
        return -1;
    b = s;
    if (cut(&s, &n, ':', &nb) != 0)
        return -1;
    c = s;
    if (cut(&s, &n, ':', &nc) != 0 || get_u64(a, na, UINT32_MAX, &from) != 0 ||
        get_u64(b, nb, UINT32_MAX, &to) != 0 || get_u64(c, nc, UINT64_MAX, &q->reserved) != 0 ||
        get_paged(s, n, q) != 0 || from < 1 || from > to || from <= after)
        return -1;
    q->n_from = (uint32_t)from;
    q->n_to = (uint32_t)to;
    return 0;
}

/* 1..MMG_RECORD_POINTS points, ascending and disjoint */
static int get_points(const char *s, size_t n, struct mmg_record *r)
{
    long k = each_item(s, n, MMG_RECORD_POINTS, get_point, r);
    r->n_points = k > 0 ? (size_t)k : 0;
    return k > 0 ? 0 : -1;
}

/* a GPU type as the configuration accepts it: [A-Za-z0-9_.-], 1..31 */
static int get_gpu(const char *s, size_t n, char *dst)
{
    if (n == 0 || n >= sizeof(((struct mmg_card *)0)->gpu))
        return -1;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.-", s[i]))
            return -1;
    memcpy(dst, s, n);
    dst[n] = '\0';
    return 0;
}

static int get_kind(const char *s, size_t n, mm_verdict_kind *k)
{
    for (int i = 0; i < 3; i++)
        if (strlen(kind_names[i]) == n && !memcmp(kind_names[i], s, n)) {
            *k = (mm_verdict_kind)i;
            return 0;
        }
    return -1;
}

/* "TYPE:USABLE:N:KIND:RETRIES:PEAK", N >= 1, PEAK <= USABLE, (TYPE, N) not
 * seen before */
static int get_card(const char *s, size_t n, size_t idx, struct mmg_record *r)
{
    const char *f[6];
    size_t len[6];
    uint64_t cnt;
    struct mmg_card *c = &r->cards[idx];
    for (int i = 0; i < 5; i++) {
        f[i] = s;
        if (cut(&s, &n, ':', &len[i]) != 0)
            return -1;
    }
    f[5] = s;
    len[5] = n;
    if (get_gpu(f[0], len[0], c->gpu) || get_u64(f[1], len[1], UINT64_MAX, &c->usable) ||
        get_u64(f[2], len[2], UINT32_MAX, &cnt) || cnt < 1 || get_kind(f[3], len[3], &c->kind) ||
        get_u64(f[4], len[4], UINT64_MAX, &c->retries) ||
        get_u64(f[5], len[5], UINT64_MAX, &c->peak) || c->peak > c->usable)
        return -1;
    c->n = (uint32_t)cnt;
    for (size_t i = 0; i < idx; i++)
        if (r->cards[i].n == c->n && !strcasecmp(r->cards[i].gpu, c->gpu))
            return -1;
    return 0;
}

static int get_cards(const char *s, size_t n, struct mmg_record *r)
{
    long k = each_item(s, n, MMG_RECORD_CARDS, get_card, r);
    r->n_cards = k > 0 ? (size_t)k : 0;
    return k > 0 ? 0 : -1;
}

static int get_value(struct mmg_record *r, const struct key *k, const char *v, size_t n)
{
    char *base = (char *)r + k->off;
    uint64_t u;
    switch (k->kind) {
    case K_STR: return get_str(v, n, base, k->size);
    case K_U64: return get_u64(v, n, UINT64_MAX, (uint64_t *)(void *)base);
    case K_U32:
        if (get_u64(v, n, UINT32_MAX, &u) != 0)
            return -1;
        *(uint32_t *)(void *)base = (uint32_t)u;
        return 0;
    case K_DBL: return get_dbl(v, n, (double *)(void *)base);
    case K_TERMS: return get_terms(v, n, r);
    case K_CARDS: return get_cards(v, n, r);
    default: return get_points(v, n, r);
    }
}

static const struct key *find_key(const char *name, size_t n)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strlen(keys[i].name) == n && !memcmp(keys[i].name, name, n))
            return &keys[i];
    return NULL;
}

__attribute__((format(printf, 3, 4)))
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

static int parse_token(struct mmg_record *r, const char *t, size_t n, unsigned *seen,
                       char *err, size_t errlen)
{
    const char *eq = memchr(t, '=', n);
    const struct key *k = eq ? find_key(t, (size_t)(eq - t)) : NULL;
    size_t idx, shown = eq ? (size_t)(eq - t) : n;
    if (!k)
        return fail(err, errlen, "MMGUARD: unknown field '%.*s'", (int)(shown > 40 ? 40 : shown), t);
    idx = (size_t)(k - keys);
    if (*seen & (1u << idx))
        return fail(err, errlen, "MMGUARD: duplicate field '%s'", k->name);
    *seen |= 1u << idx;
    if (get_value(r, k, eq + 1, n - (size_t)(eq + 1 - t)) != 0)
        return fail(err, errlen, "MMGUARD: bad value of '%s'", k->name);
    if (!strcmp(k->name, "mmb"))
        r->has_mmb = 1;
    return 0;
}

int mmg_record_parse(const char *text, struct mmg_record *r, char *err, size_t errlen)
{
    size_t len = strnlen(text, MMG_RECORD_MAX + 1), i;
    unsigned seen = 0, model = 0;

    memset(r, 0, sizeof(*r));
    if (len > MMG_RECORD_MAX)
        return fail(err, errlen, "MMGUARD: longer than %u bytes", MMG_RECORD_MAX);
    if (strncmp(text, "v=4", 3) != 0 || (text[3] != ' ' && text[3] != '\0'))
        return fail(err, errlen, "MMGUARD: unsupported version (want v=%d)", MMG_RECORD_VERSION);
    for (i = 3; i < len;) {
        const char *t = text + i + 1, *sp = memchr(t, ' ', len - i - 1);
        size_t n = sp ? (size_t)(sp - t) : len - i - 1;
        if (n == 0 || parse_token(r, t, n, &seen, err, errlen) != 0)
            return n == 0 ? fail(err, errlen, "MMGUARD: empty field") : -1;
        i += n + 1;
    }
    for (size_t k = 0; k < NKEYS; k++)
        model += keys[k].model && (seen & (1u << k));
    if (model != 0 && model != NMODEL)
        return fail(err, errlen, "MMGUARD: incomplete peak model");
    r->has_model = model == NMODEL;
    return 0;
}

void mmg_record_set_model(struct mmg_record *r, const mm_prediction *p)
{
    r->has_model = 1;
    r->ctx = p->overheads.cuda_context;
    r->nccl = p->overheads.nccl;
    r->afix = p->overheads.alloc_fixed;
    r->afrac = p->overheads.alloc_frac;
    r->dp1 = p->allocated_dp1;
    r->n_terms = p->n_terms < MM_MAX_TERMS ? p->n_terms : MM_MAX_TERMS;
    memcpy(r->terms, p->terms, sizeof(r->terms));
    r->n_points = p->n_dp_points < MMG_RECORD_POINTS ? p->n_dp_points : MMG_RECORD_POINTS;
    if (r->n_points)
        memcpy(r->points, p->dp_points, r->n_points * sizeof(r->points[0]));
}

uint64_t mmg_record_peak_for_dp(const struct mmg_record *r, uint32_t n)
{
    mm_prediction p;
    memset(&p, 0, sizeof(p));
    p.overheads.cuda_context = r->ctx;
    p.overheads.nccl = r->nccl;
    p.overheads.alloc_fixed = r->afix;
    p.overheads.alloc_frac = r->afrac;
    p.allocated_dp1 = r->dp1;
    p.n_terms = r->n_terms;
    memcpy(p.terms, r->terms, sizeof(p.terms));
    p.n_dp_points = r->n_points;
    p.dp_points = (mm_dp_point *)r->points; /* read only: not freed */
    return mm_peak_for_dp(&p, n);
}

const struct mmg_card *mmg_cards_find(const struct mmg_card *cards, size_t n_cards,
                                      const char *gpu, uint32_t n)
{
    for (size_t i = 0; i < n_cards && i < MMG_RECORD_CARDS; i++)
        if (cards[i].n == n && !strcasecmp(cards[i].gpu, gpu))
            return &cards[i];
    return NULL;
}

const struct mmg_card *mmg_record_card(const struct mmg_record *r, const char *gpu, uint32_t n)
{
    return mmg_cards_find(r->cards, r->n_cards, gpu, n);
}

void mmg_card_from_verdict(struct mmg_card *c, const char *gpu, const mm_verdict *v)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->gpu, sizeof(c->gpu), "%s", gpu);
    c->usable = v->usable_bytes;
    c->n = v->n;
    c->kind = v->kind;
    c->retries = v->retries_step;
    c->peak = v->reserved_peak > UINT64_MAX - v->context_bytes ? UINT64_MAX
                                                               : v->reserved_peak + v->context_bytes;
    if (c->peak > c->usable)  /* capacity 0: the context alone is over the card */
        c->peak = c->usable;
}

/* the cards of one GPU count: one simulated step for all types, at the
 * data-parallel degree count / training.tensor_parallel (none when that
 * does not divide it) */
static int add_count(struct mmg_card *cards, size_t *n_cards, const mm_spec *spec,
                     size_t n_types, const char *const *names, const uint64_t *mem,
                     const uint64_t *usable, uint32_t count, mm_error *err)
{
    char assign[64];
    mm_verdict v[MMG_RECORD_CARDS];
    uint64_t m[MMG_RECORD_CARDS], u[MMG_RECORD_CARDS];
    const char *nm[MMG_RECORD_CARDS];
    size_t k = 0;
    int rc = 0;
    for (size_t t = 0; t < n_types && *n_cards + k < MMG_RECORD_CARDS; t++)
        if (!mmg_cards_find(cards, *n_cards, names[t], count)) {
            nm[k] = names[t];
            m[k] = mem[t];
            u[k++] = usable[t];
        }
    uint32_t tp = mm_spec_tensor_parallel(spec);
    if (!k || count % tp)
        return 0;
    mm_spec *c = mm_spec_clone(spec);
    snprintf(assign, sizeof(assign), "training.data_parallel=%" PRIu32, count / tp);
    if (!c)
        snprintf(err->msg, sizeof(err->msg), "out of memory");
    if (!c || mm_spec_set(c, assign, err) != 0 || mm_verdict_cards(c, k, m, u, v, err) != 0)
        rc = -1;
    for (size_t i = 0; rc == 0 && i < k; i++) {
        mmg_card_from_verdict(&cards[*n_cards], nm[i], &v[i]);
        cards[(*n_cards)++].n = count;
    }
    if (c)
        mm_spec_free(c);
    return rc;
}

int mmg_cards_add(struct mmg_card *cards, size_t *n_cards, const mm_spec *spec, size_t n_types,
                  const char *const *names, const uint64_t *mem, const uint64_t *usable,
                  size_t n_counts, const uint32_t *counts, mm_error *err)
{
    int rc = 0;
    for (size_t i = 0; i < n_counts && *n_cards < MMG_RECORD_CARDS; i++)
        if (add_count(cards, n_cards, spec, n_types, names, mem, usable, counts[i], err) != 0)
            rc = -1; /* that count stays uncovered; the others are still judged */
    return rc;
}
