/* alloc_conf.c - PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF, parsed as torch does.
 *
 * Why: the allocator model must run with the settings the job runs with, and
 * a spec (or a trace header) states them in PyTorch's own syntax.  Followed:
 * c10/core/AllocatorConfig.cpp (parseArgs, parseMaxSplitSize,
 * parseRoundUpPower2Divisions, ...) of PyTorch main, 2025.  Differences, both
 * deliberate: torch skips unknown keys silently, we name them (a misspelt
 * "max_split_size_mb" would otherwise change nothing); and keys of the CUDA
 * backend that do not change device memory are accepted and ignored. */
#include "alloc.h"
#include "util.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)

void mm_alloc_conf_default(mm_alloc_conf *c)
{
    memset(c, 0, sizeof *c);
    c->max_split_size = UINT64_MAX;
    c->max_non_split_rounding = 20 * MiB; /* kLargeBuffer */
}

typedef struct cursor {
    const char *s;
    size_t i;
    mm_error *err;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->s[c->i] == ' ' || c->s[c->i] == '\t')
        c->i++;
}

/* a token: a run of characters other than , : [ ] and blanks */
static size_t token(cursor *c, char *out, size_t n)
{
    skip_ws(c);
    size_t k = 0;
    while (c->s[c->i] && !strchr(",:[] \t", c->s[c->i])) {
        if (k + 1 < n)
            out[k++] = c->s[c->i];
        c->i++;
    }
    out[k] = 0;
    return k;
}

static int expect(cursor *c, char ch, const char *key)
{
    skip_ws(c);
    if (c->s[c->i] != ch) {
        mm_err(c->err, "alloc_conf: %s: expected '%c' at offset %zu", key, ch, c->i);
        return -1;
    }
    c->i++;
    return 0;
}

static int read_u64(cursor *c, const char *key, uint64_t *v)
{
    char tok[32];
    token(c, tok, sizeof tok);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(tok, &end, 10);
    if (!tok[0] || *end || errno || tok[0] == '-') {
        mm_err(c->err, "alloc_conf: %s: expected a non-negative integer, got '%s'", key, tok);
        return -1;
    }
    *v = x;
    return 0;
}

static int is_pow2(uint64_t x)
{
    return x && !(x & (x - 1));
}

/* max_split_size_mb / max_non_split_rounding_mb: >= 20 (kLargeBuffer / MiB) */
static int parse_mb(cursor *c, const char *key, uint64_t *out)
{
    uint64_t v;
    if (expect(c, ':', key) < 0 || read_u64(c, key, &v) < 0)
        return -1;
    if (v < 20) {
        mm_err(c->err, "alloc_conf: %s: %llu too small, must be >= 20", key,
               (unsigned long long)v);
        return -1;
    }
    *out = v > UINT64_MAX / MiB ? UINT64_MAX / MiB * MiB : v * MiB;
    return 0;
}

static int parse_gc(cursor *c, mm_alloc_conf *o)
{
    const char *key = "garbage_collection_threshold";
    char tok[32];
    if (expect(c, ':', key) < 0)
        return -1;
    token(c, tok, sizeof tok);
    char *end;
    double v = strtod(tok, &end);
    if (!tok[0] || *end || !(v > 0 && v < 1)) {
        mm_err(c->err, "alloc_conf: %s: '%s' is not in (0.0, 1.0)", key, tok);
        return -1;
    }
    o->gc_threshold = v;
    return 0;
}

/* one "BOUNDARY:DIVISIONS" (or ">:DIVISIONS") of the bracketed list */
static int parse_division_item(cursor *c, mm_alloc_conf *o, int *first, size_t *last)
{
    const char *key = "roundup_power2_divisions";
    char b[32];
    uint64_t v, boundary;
    token(c, b, sizeof b);
    if (expect(c, ':', key) < 0 || read_u64(c, key, &v) < 0)
        return -1;
    if (v != 0 && !is_pow2(v)) {
        mm_err(c->err, "alloc_conf: %s: divisions %llu must be a power of 2 or 0", key,
               (unsigned long long)v);
        return -1;
    }
    if (!strcmp(b, ">")) {
        for (size_t k = *last + 1; k < MM_ROUNDUP_INTERVALS; k++)
            o->roundup_divisions[k] = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
        return 0;
    }
    cursor bc = {b, 0, c->err};
    if (read_u64(&bc, key, &boundary) < 0)
        return -1;
    if (!is_pow2(boundary)) {
        mm_err(c->err, "alloc_conf: %s: interval %s (MiB) must be a power of 2", key, b);
        return -1;
    }
    size_t idx = (size_t)(63 - __builtin_clzll(boundary));
    if (idx > MM_ROUNDUP_INTERVALS - 1)
        idx = MM_ROUNDUP_INTERVALS - 1;
    uint32_t d = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
    if (*first) { /* the first value also covers every interval below it */
        for (size_t k = 0; k < idx; k++)
            o->roundup_divisions[k] = d;
        *first = 0;
    }
    o->roundup_divisions[idx] = d;
    *last = idx;
    return 0;
}

static int parse_divisions(cursor *c, mm_alloc_conf *o)
{
    const char *key = "roundup_power2_divisions";
    if (expect(c, ':', key) < 0)
        return -1;
    skip_ws(c);
    if (c->s[c->i] != '[') { /* one value for every interval */
        uint64_t v;
        if (read_u64(c, key, &v) < 0)
            return -1;
        if (!is_pow2(v)) {
            mm_err(c->err, "alloc_conf: %s: %llu must be a power of 2", key,
                   (unsigned long long)v);
            return -1;
        }
        for (size_t k = 0; k < MM_ROUNDUP_INTERVALS; k++)
            o->roundup_divisions[k] = (uint32_t)(v > UINT32_MAX ? UINT32_MAX : v);
        return 0;
    }
    c->i++;
    int first = 1;
    size_t last = 0;
    for (;;) {
        skip_ws(c);
        if (c->s[c->i] == ']') {
            c->i++;
            return 0;
        }
        if (!c->s[c->i]) {
            mm_err(c->err, "alloc_conf: %s: missing ']'", key);
            return -1;
        }
        if (parse_division_item(c, o, &first, &last) < 0)
            return -1;
        skip_ws(c);
        if (c->s[c->i] == ',')
            c->i++;
        else if (c->s[c->i] != ']') {
            mm_err(c->err, c->s[c->i] ? "alloc_conf: %s: expected ',' or ']' at offset %zu"
                                      : "alloc_conf: %s: missing ']' at offset %zu", key, c->i);
            return -1;
        }
    }
}

static int parse_bool(cursor *c, const char *key, int *out)
{
    char tok[16];
    if (expect(c, ':', key) < 0)
        return -1;
    token(c, tok, sizeof tok);
    if (!strcmp(tok, "True") || !strcmp(tok, "true"))
        *out = 1;
    else if (!strcmp(tok, "False") || !strcmp(tok, "false"))
        *out = 0;
    else {
        mm_err(c->err, "alloc_conf: %s: expected True or False, got '%s'", key, tok);
        return -1;
    }
    return 0;
}

/* keys of the CUDA backend that do not change device memory: value skipped */
static const char *const ignored_keys[] = {
    "backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse",
};
static const char *const known_keys[] = {
    "max_split_size_mb", "max_non_split_rounding_mb", "garbage_collection_threshold",
    "roundup_power2_divisions", "expandable_segments", "backend",
    "release_lock_on_cudamalloc", "pinned_use_cuda_host_register",
    "pinned_num_register_threads", "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb", "graph_capture_record_stream_reuse",
};

static int parse_key(cursor *c, const char *key, mm_alloc_conf *o)
{
    char tok[64];
    if (!strcmp(key, "max_split_size_mb"))
        return parse_mb(c, key, &o->max_split_size);
    if (!strcmp(key, "max_non_split_rounding_mb"))
        return parse_mb(c, key, &o->max_non_split_rounding);
    if (!strcmp(key, "garbage_collection_threshold"))
        return parse_gc(c, o);
    if (!strcmp(key, "roundup_power2_divisions"))
        return parse_divisions(c, o);
    if (!strcmp(key, "expandable_segments"))
        return parse_bool(c, key, &o->expandable_segments);
    for (size_t k = 0; k < sizeof ignored_keys / sizeof *ignored_keys; k++)
        if (!strcmp(key, ignored_keys[k])) {
            if (expect(c, ':', key) < 0)
                return -1;
            token(c, tok, sizeof tok);
            return 0;
        }
    const char *near = mm_suggest(key, known_keys, sizeof known_keys / sizeof *known_keys);
    mm_err(c->err, "alloc_conf: unknown key '%s'%s%s%s", key, near ? " (did you mean '" : "",
           near ? near : "", near ? "'?)" : "");
    return -1;
}

int mm_alloc_conf_parse(mm_alloc_conf *out, const char *s, mm_error *err)
{
    mm_alloc_conf o;
    mm_alloc_conf_default(&o); /* parseArgs resets every option */
    o.memory_fraction = out->memory_fraction;
    cursor c = {s ? s : "", 0, err};
    for (;;) {
        char key[64];
        skip_ws(&c);
        if (!c.s[c.i])
            break;
        if (token(&c, key, sizeof key) == 0 || strlen(key) >= sizeof key - 1) {
            mm_err(err, "alloc_conf: expected a key at offset %zu of '%s'", c.i, c.s);
            return -1;
        }
        if (parse_key(&c, key, &o) < 0)
            return -1;
        skip_ws(&c);
        if (c.s[c.i] == ',')
            c.i++;
        else if (c.s[c.i]) {
            mm_err(err, "alloc_conf: %s: unexpected '%c' at offset %zu", key, c.s[c.i], c.i);
            return -1;
        }
    }
    *out = o;
    return 0;
}
