/* alloc_trace.c - replay a real allocator trace through the allocator model.
 *
 * Why: a trace recorded on a GPU (contrib/calibrate/calib_trace.py writes them;
 * tests/gpu_data/traces keeps some) holds every block torch handed out and took
 * back, and every segment it got from the driver.  Feeding the blocks to the
 * model and comparing its segments with the real ones checks the model against
 * the real allocator in CI, with no GPU.  Format (one event per line):
 *
 *   # mmguard-alloc-trace/1 {json header: id, alloc_conf, gpu_total_bytes, ...}
 *   CODE ADDR SIZE STREAM DT     a alloc, f free, S/U segment alloc/free,
 *                                M/N expandable map/unmap, O oom
 *
 * A run of segment frees (U/N) not caused by an allocation is an
 * empty_cache() call in the traced program; the model empties its cache at
 * the first of them. */
#include "alloc.h"
#include "util.h"

#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_MAGIC "# mmguard-alloc-trace/1 "
#define MAX_LINE (1u << 20)

typedef struct addr_map {  /* open addressing, addr -> handle + 1 (0 = empty) */
    uint64_t *key;
    int64_t *val;
    size_t cap, n;
} addr_map;

typedef struct replay {
    const char *path;
    mm_allocator *a;
    addr_map live;
    uint64_t *tseg, *mseg;        /* segment sizes got: the trace's, the model's */
    size_t nt, nm, ct, cm;
    uint64_t truth_res, truth_req;
    int in_free_run, nomem, use_addresses, stop_at_oom, stopped;
    uint64_t device_total;        /* the header's gpu_total_bytes (0: not given) */
    mm_replay_result *out;
} replay;

static size_t slot(const addr_map *m, uint64_t k)
{
    uint64_t h = k * 0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 17) & (m->cap - 1);
}

static int map_grow(addr_map *m)
{
    addr_map n = {0};
    n.cap = m->cap ? m->cap * 2 : 1024;
    n.key = calloc(n.cap, sizeof *n.key);
    n.val = calloc(n.cap, sizeof *n.val);
    if (!n.key || !n.val) {
        free(n.key);
        free(n.val);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->val[i]) {
            size_t j = slot(&n, m->key[i]);
            while (n.val[j])
                j = (j + 1) & (n.cap - 1);
            n.key[j] = m->key[i];
            n.val[j] = m->val[i];
        }
    n.n = m->n;
    free(m->key);
    free(m->val);
    *m = n;
    return 0;
}

/* the slot holding k, or the empty slot where it would go */
static size_t map_find(const addr_map *m, uint64_t k)
{
    size_t j = slot(m, k);
    while (m->val[j] && m->key[j] != k)
        j = (j + 1) & (m->cap - 1);
    return j;
}

/* remove slot j, re-placing the entries after it (linear probing) */
static void map_erase(addr_map *m, size_t j)
{
    m->val[j] = 0;
    m->n--;
    for (size_t i = (j + 1) & (m->cap - 1); m->val[i]; i = (i + 1) & (m->cap - 1)) {
        uint64_t k = m->key[i];
        int64_t v = m->val[i];
        m->val[i] = 0;
        size_t t = map_find(m, k);
        m->key[t] = k;
        m->val[t] = v;
    }
}

static int push(uint64_t **v, size_t *n, size_t *cap, uint64_t x)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 256;
        uint64_t *p = realloc(*v, c * sizeof *p);
        if (!p)
            return -1;
        *v = p;
        *cap = c;
    }
    (*v)[(*n)++] = x;
    return 0;
}

static void on_segment(void *ctx, int got, uint64_t bytes)
{
    replay *r = ctx;
    if (got && push(&r->mseg, &r->nm, &r->cm, bytes) < 0)
        r->nomem = 1;
}

/* the header: id, and the allocator settings the trace was recorded with */
static int read_header(replay *r, const char *line, mm_alloc_conf *conf, int use_conf,
                       mm_error *err)
{
    if (strncmp(line, TRACE_MAGIC, strlen(TRACE_MAGIC)) != 0) {
        mm_err_at(err, r->path, 1, 0, "not an mmguard-alloc-trace/1 file");
        return -1;
    }
    json_object *h = json_tokener_parse(line + strlen(TRACE_MAGIC));
    if (!h || !json_object_is_type(h, json_type_object)) {
        json_object_put(h);
        mm_err_at(err, r->path, 1, 0, "header: malformed JSON");
        return -1;
    }
    json_object *v;
    if (json_object_object_get_ex(h, "id", &v) && json_object_is_type(v, json_type_string))
        mm_strlcpy(r->out->id, json_object_get_string(v), sizeof r->out->id);
    /* the card's memory as torch saw it: a memory fraction is of this
     * (CUDACachingAllocator.cpp setMemoryFraction: fraction * cudaMemGetInfo total),
     * and an expandable segment reserves address space for 1 1/8 of it; a header
     * without it leaves the allocator's default card */
    if (json_object_object_get_ex(h, "gpu_total_bytes", &v) &&
        json_object_is_type(v, json_type_int) && json_object_get_int64(v) > 0)
        r->device_total = (uint64_t)json_object_get_int64(v);
    int rc = 0;
    if (use_conf && json_object_object_get_ex(h, "alloc_conf", &v) &&
        json_object_is_type(v, json_type_string)) {
        mm_error e;
        if (mm_alloc_conf_parse(conf, json_object_get_string(v), &e) < 0) {
            mm_err_at(err, r->path, 1, 0, "header: %s", e.msg);
            rc = -1;
        }
    }
    json_object_put(h);
    return rc;
}

static int parse_event(const char *line, char *code, uint64_t *addr, uint64_t *size,
                       uint64_t *stream)
{
    char *end;
    if (!line[0] || !strchr("afSUMNO", line[0]) || line[1] != ' ')
        return -1;
    *code = line[0];
    errno = 0;
    *addr = strtoull(line + 2, &end, 16);
    if (errno || *end != ' ' || end == line + 2)
        return -1;
    const char *p = end + 1;
    *size = strtoull(p, &end, 10);
    if (errno || *end != ' ' || end == p || *p == '-')
        return -1;
    p = end + 1;
    *stream = strtoull(p, &end, 10);
    if (errno || *end != ' ' || end == p || *p == '-')
        return -1;
    p = end + 1;
    (void)strtoull(p, &end, 10);
    if (errno || end == p || *p == '-' || (*end && *end != '\n'))
        return -1;
    return 0;
}

static int ev_alloc(replay *r, uint64_t addr, uint64_t size, int ln, mm_error *err)
{
    if (r->live.n * 2 >= r->live.cap && map_grow(&r->live) < 0)
        return r->nomem = 1, -1;
    size_t j = map_find(&r->live, addr);
    if (r->live.val[j]) {
        mm_err_at(err, r->path, ln, 0, "alloc at %llx: address already allocated",
                  (unsigned long long)addr);
        return -1;
    }
    int64_t h = mm_allocator_malloc(r->a, size);
    if (h == MM_ALLOC_NOMEM)
        return r->nomem = 1, -1;
    if (h == MM_ALLOC_OOM && r->stop_at_oom) {
        r->stopped = 1; /* the program raised torch.OutOfMemoryError here */
        return 0;
    }
    r->truth_req = mm_sat_add(r->truth_req, size);
    if (r->truth_req > r->out->truth_allocated_peak)
        r->out->truth_allocated_peak = r->truth_req;
    r->live.key[j] = addr;
    /* handle + 1 (0 marks an empty slot); INT64_MIN: the model's device was
     * full (capacity given), so there is nothing to free later */
    r->live.val[j] = h >= 0 ? h + 1 : INT64_MIN;
    r->live.n++;
    return 0;
}

static int ev_free(replay *r, uint64_t addr, uint64_t size, int ln, mm_error *err)
{
    size_t j = r->live.cap ? map_find(&r->live, addr) : 0;
    if (!r->live.cap || !r->live.val[j]) {
        mm_err_at(err, r->path, ln, 0, "free of %llx: no such allocation",
                  (unsigned long long)addr);
        return -1;
    }
    if (r->live.val[j] != INT64_MIN)
        mm_allocator_release(r->a, r->live.val[j] - 1);
    map_erase(&r->live, j);
    r->truth_req = r->truth_req >= size ? r->truth_req - size : 0;
    return 0;
}

/* segment events: the truth, and empty_cache() calls of the traced program */
static int ev_segment(replay *r, char code, uint64_t addr, uint64_t size)
{
    if (code == 'S' || code == 'M') {
        r->truth_res = mm_sat_add(r->truth_res, size);
        if (r->truth_res > r->out->truth_reserved_peak)
            r->out->truth_reserved_peak = r->truth_res;
        r->out->truth_segments++;
        if (code == 'S' && r->use_addresses)
            mm_allocator_next_address(r->a, addr);
        if (push(&r->tseg, &r->nt, &r->ct, size) < 0)
            return r->nomem = 1, -1;
    } else {
        if (!r->in_free_run)
            mm_allocator_empty_cache(r->a);
        r->truth_res = r->truth_res >= size ? r->truth_res - size : 0;
    }
    return 0;
}

static int replay_line(replay *r, const char *line, int ln, mm_error *err)
{
    char code;
    uint64_t addr, size, stream;
    if (parse_event(line, &code, &addr, &size, &stream) < 0) {
        mm_err_at(err, r->path, ln, 0, "expected 'CODE ADDR SIZE STREAM DT' (CODE one of "
                  "a f S U M N O)");
        return -1;
    }
    if (stream != 0) {
        mm_err_at(err, r->path, ln, 0, "stream %llu: only single-stream traces are modelled",
                  (unsigned long long)stream);
        return -1;
    }
    int rc = 0;
    if (code == 'a')
        rc = ev_alloc(r, addr, size, ln, err);
    else if (code == 'f')
        rc = ev_free(r, addr, size, ln, err);
    else if (code != 'O')
        rc = ev_segment(r, code, addr, size);
    if (code == 'a')
        mm_allocator_next_address(r->a, 0); /* a hint the model did not use */
    r->in_free_run = code == 'U' || code == 'N';
    if (code == 'a' || code == 'f')
        r->out->events++;
    if (rc < 0 && r->nomem)
        mm_err_at(err, r->path, ln, 0, "out of memory");
    return rc;
}

static int replay_stream(replay *r, FILE *f, mm_alloc_conf *conf, int use_conf,
                         uint64_t capacity, mm_error *err)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int ln = 0, rc = 0;
    while (rc == 0 && !r->stopped && (len = getline(&line, &cap, f)) >= 0) {
        ln++;
        if ((size_t)len > MAX_LINE) {
            mm_err_at(err, r->path, ln, 0, "line longer than %u bytes", MAX_LINE);
            rc = -1;
        } else if (ln == 1) {
            rc = read_header(r, line, conf, use_conf, err);
            if (rc == 0 && !(r->a = mm_allocator_new(conf, capacity, r->device_total)))
                rc = -1, mm_err(err, "%s: out of memory", r->path);
            if (r->a)
                mm_allocator_on_segment(r->a, on_segment, r);
        } else {
            rc = replay_line(r, line, ln, err);
        }
    }
    free(line);
    if (rc == 0 && ln == 0) {
        mm_err_at(err, r->path, 1, 0, "empty trace");
        rc = -1;
    }
    if (rc == 0 && ferror(f)) {
        mm_err(err, "%s: read error: %s", r->path, strerror(errno));
        rc = -1;
    }
    return rc;
}

static int replay_open(FILE *f, const char *name, const mm_alloc_conf *conf, unsigned flags,
                       uint64_t capacity, mm_replay_result *out, mm_error *err)
{
    replay r = {.path = name, .out = out,
                .use_addresses = (flags & MM_REPLAY_TRACE_ADDRESSES) != 0,
                .stop_at_oom = (flags & MM_REPLAY_STOP_AT_OOM) != 0};
    mm_alloc_conf c;
    if (conf)
        c = *conf;
    else
        mm_alloc_conf_default(&c);
    int rc = replay_stream(&r, f, &c, (flags & MM_REPLAY_CONF_FROM_TRACE) != 0, capacity, err);
    if (rc == 0) {
        out->stats = *mm_allocator_stats(r.a);
        size_t k = 0;
        while (k < r.nt && k < r.nm && r.tseg[k] == r.mseg[k])
            k++;
        out->segments_matched = k;
    }
    mm_allocator_free(r.a);
    free(r.live.key);
    free(r.live.val);
    free(r.tseg);
    free(r.mseg);
    return rc;
}

int mm_alloc_replay_file(const char *path, const mm_alloc_conf *conf, unsigned flags,
                         uint64_t capacity, mm_replay_result *out, mm_error *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
    if (!f) {
        mm_err(err, "%s: %s", path, strerror(errno));
        return -1;
    }
    int rc = replay_open(f, path, conf, flags, capacity, out, err);
    if (f != stdin)
        fclose(f);
    return rc;
}

int mm_alloc_replay_buffer(const char *buf, size_t len, const char *name,
                           const mm_alloc_conf *conf, unsigned flags, uint64_t capacity,
                           mm_replay_result *out, mm_error *err)
{
    memset(out, 0, sizeof *out);
    if (len == 0) {
        mm_err_at(err, name, 1, 0, "empty trace");
        return -1;
    }
    FILE *f = fmemopen((void *)(uintptr_t)buf, len, "r");
    if (!f) {
        mm_err(err, "%s: %s", name, strerror(errno));
        return -1;
    }
    int rc = replay_open(f, name, conf, flags, capacity, out, err);
    fclose(f);
    return rc;
}
