/* report.c - summary of mmguard decision logs (see report.h, docs/report.md). */
#include "report.h"
#include "loop.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <json-c/json.h>

#include "util.h"

static const char *const dec_names[MM_DEC_COUNT] = {
    "accept", "warn", "reject", "resize", "error"
};

const char *mm_decision_name(mm_decision d)
{
    return (unsigned)d < MM_DEC_COUNT ? dec_names[d] : "?";
}

/* ---- a small string-keyed hash set of groups --------------------------------- */

typedef struct group {
    char *key;               /* user, model, source, "sha256\npath", or gpus as text */
    char *label;             /* spec: last model seen */
    uint64_t n[MM_DEC_COUNT];
    uint64_t total;
    uint64_t num;            /* gpu-size rows: GPU count */
    uint64_t unknown;        /* gpu-size rows: rejected jobs without a time limit */
    double hours;            /* gpu-size rows: GPU-hours of those with one */
} group;

typedef struct groupset {
    group *v;
    size_t n, cap;
    size_t *slot;            /* index + 1, 0 = empty */
    size_t nslot;            /* power of two */
} groupset;

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return h;
}

static int gs_rehash(groupset *gs, size_t nslot)
{
    size_t *slot = calloc(nslot, sizeof(*slot));
    if (!slot)
        return -1;
    for (size_t i = 0; i < gs->n; i++) {
        size_t j = (size_t)hash_str(gs->v[i].key) & (nslot - 1);
        while (slot[j])
            j = (j + 1) & (nslot - 1);
        slot[j] = i + 1;
    }
    free(gs->slot);
    gs->slot = slot;
    gs->nslot = nslot;
    return 0;
}

/* The group named `key`, created zeroed if new; NULL when out of memory. */
static group *gs_get(groupset *gs, const char *key)
{
    size_t j;
    if (gs->nslot == 0 && gs_rehash(gs, 64) != 0)
        return NULL;
    j = (size_t)hash_str(key) & (gs->nslot - 1);
    while (gs->slot[j]) {
        group *g = &gs->v[gs->slot[j] - 1];
        if (!strcmp(g->key, key))
            return g;
        j = (j + 1) & (gs->nslot - 1);
    }
    if (gs->n == gs->cap) {
        size_t cap = gs->cap ? gs->cap * 2 : 16;
        group *v = realloc(gs->v, cap * sizeof(*v));
        if (!v)
            return NULL;
        gs->v = v;
        gs->cap = cap;
    }
    group *g = &gs->v[gs->n];
    memset(g, 0, sizeof(*g));
    g->key = strdup(key);
    if (!g->key)
        return NULL;
    gs->slot[j] = ++gs->n;
    if (gs->n * 2 > gs->nslot && gs_rehash(gs, gs->nslot * 2) != 0) {
        /* the set stays valid at the old size; the next insert retries */
    }
    return g;
}

static void gs_free(groupset *gs)
{
    for (size_t i = 0; i < gs->n; i++) {
        free(gs->v[i].key);
        free(gs->v[i].label);
    }
    free(gs->v);
    free(gs->slot);
    memset(gs, 0, sizeof(*gs));
}

/* ---- the report -------------------------------------------------------------- */

/* peak/usable ratio bins: (prev, edge]; the last bin is > 2.0 */
#define N_EDGES 8
static const double ratio_edges[N_EDGES] = { 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0 };

typedef struct malformed {
    char *file;
    unsigned long line;
    char *error;
} malformed;

struct mm_report {
    uint64_t lines, records, n_malformed, files;
    uint64_t dec[MM_DEC_COUNT];
    groupset sources, users, models, specs, sizes;
    /* ratio */
    uint64_t ratio_bins[N_EDGES + 1];
    uint64_t ratio_known, ratio_unknown;
    double ratio_min, ratio_max, ratio_sum;
    /* rejected GPU-hours */
    uint64_t rej_jobs, rej_known, rej_unknown_gpus, rej_unknown_time;
    double rej_hours;
    malformed kept[MM_REPORT_KEEP_MALFORMED];
    size_t n_kept;
    mm_loop *loop;                  /* outcome lines and the decisions they join (loop.c) */
};

mm_report *mm_report_new(void)
{
    mm_report *r = calloc(1, sizeof(mm_report));
    if (r && !(r->loop = mm_loop_new())) {
        free(r);
        return NULL;
    }
    return r;
}

void mm_report_free(mm_report *r)
{
    if (!r)
        return;
    gs_free(&r->sources);
    gs_free(&r->users);
    gs_free(&r->models);
    gs_free(&r->specs);
    gs_free(&r->sizes);
    mm_loop_free(r->loop);
    for (size_t i = 0; i < r->n_kept; i++) {
        free(r->kept[i].file);
        free(r->kept[i].error);
    }
    free(r);
}

struct mm_loop *mm_report_loop(mm_report *r)
{
    return r ? r->loop : NULL;
}

size_t mm_report_records(const mm_report *r)
{
    return r ? (size_t)r->records : 0;
}

size_t mm_report_malformed(const mm_report *r)
{
    return r ? (size_t)r->n_malformed : 0;
}

size_t mm_report_decision_count(const mm_report *r, mm_decision d)
{
    return (r && (unsigned)d < MM_DEC_COUNT) ? (size_t)r->dec[d] : 0;
}

MM_PRINTF(4, 5)
static int bad_line(mm_report *r, const char *file, unsigned long lineno, const char *fmt, ...)
{
    r->n_malformed++;
    if (r->n_kept < MM_REPORT_KEEP_MALFORMED) {
        char buf[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        malformed *m = &r->kept[r->n_kept];
        m->file = strdup(file ? file : "-");
        m->error = strdup(buf);
        m->line = lineno;
        if (!m->file || !m->error) {
            free(m->file);
            free(m->error);
            return -2;
        }
        r->n_kept++;
    }
    return -1;
}

static const char *get_str(json_object *o, const char *key)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || !json_object_is_type(v, json_type_string))
        return NULL;
    return json_object_get_string(v);
}

/* A non-negative finite number (integer or double) as double; 0 when absent,
 * null or of another type. */
static int get_num(json_object *o, const char *key, double *out)
{
    json_object *v;
    double d;
    if (!json_object_object_get_ex(o, key, &v))
        return 0;
    if (json_object_is_type(v, json_type_int)) {
        int64_t i = json_object_get_int64(v);
        if (i < 0)
            return 0;
        d = (double)i;
    } else if (json_object_is_type(v, json_type_double)) {
        d = json_object_get_double(v);
        if (!isfinite(d) || d < 0)
            return 0;
    } else {
        return 0;
    }
    *out = d;
    return 1;
}

static int count_group(groupset *gs, const char *key, mm_decision d, group **out)
{
    group *g = gs_get(gs, key);
    if (!g)
        return -2;
    g->n[d]++;
    g->total++;
    if (out)
        *out = g;
    return 0;
}

/* a rejected spec, grouped by digest and path, labelled with its model */
static int count_rejected_spec(mm_report *r, const char *sha, const char *spec,
                               const char *model, mm_decision d)
{
    group *g;
    char *key;
    size_t klen;
    if (!sha)
        sha = "(unknown)";
    if (!spec)
        spec = "(unknown)";
    klen = strlen(sha) + strlen(spec) + 2;
    key = malloc(klen);
    if (!key)
        return -2;
    snprintf(key, klen, "%s\n%s", sha, spec);
    int rc = count_group(&r->specs, key, d, &g);
    free(key);
    if (rc != 0)
        return rc;
    if (model && (!g->label || strcmp(g->label, model))) {
        char *m = strdup(model);
        if (!m)
            return -2;
        free(g->label);
        g->label = m;
    }
    return 0;
}

/* predicted peak / usable memory, binned */
static void count_ratio(mm_report *r, json_object *o)
{
    double peak, usable;
    if (get_num(o, "peak_bytes", &peak) && get_num(o, "usable_bytes", &usable) && usable > 0) {
        double ratio = peak / usable;
        size_t b = 0;
        while (b < N_EDGES && ratio > ratio_edges[b])
            b++;
        r->ratio_bins[b]++;
        if (r->ratio_known == 0 || ratio < r->ratio_min)
            r->ratio_min = ratio;
        if (r->ratio_known == 0 || ratio > r->ratio_max)
            r->ratio_max = ratio;
        r->ratio_sum += ratio;
        r->ratio_known++;
    } else {
        r->ratio_unknown++;
    }
}

/* a rejected job by its GPU count, and the GPU hours it asked for */
static int count_rejected_size(mm_report *r, json_object *o)
{
    double gpus, minutes;
    r->rej_jobs++;
    if (!get_num(o, "gpus", &gpus) || gpus < 1 || gpus != floor(gpus) || gpus > 1e9) {
        r->rej_unknown_gpus++;
        return 0;
    }
    char key[32];
    group *g;
    snprintf(key, sizeof(key), "%.0f", gpus);
    g = gs_get(&r->sizes, key);
    if (!g)
        return -2;
    g->num = (uint64_t)gpus;
    g->total++;
    /* Slurm time limits are uint32 minutes; INFINITE (and beyond) is unknown */
    if (get_num(o, "time_limit_minutes", &minutes) && minutes > 0 && minutes < 4294967295.0) {
        double h = gpus * minutes / 60.0;
        g->hours += h;
        r->rej_hours += h;
        r->rej_known++;
    } else {
        g->unknown++;
        r->rej_unknown_time++;
    }
    return 0;
}

static int account(mm_report *r, json_object *o, mm_decision d)
{
    const char *source = get_str(o, "source");
    const char *user = get_str(o, "user");
    const char *model = get_str(o, "model");
    char ubuf[48];

    r->records++;
    r->dec[d]++;
    if (count_group(&r->sources, source ? source : "(unknown)", d, NULL) != 0)
        return -2;
    if (!user) {
        double uid;
        if (get_num(o, "uid", &uid)) {
            snprintf(ubuf, sizeof(ubuf), "uid:%.0f", uid);
            user = ubuf;
        } else {
            user = "(unknown)";
        }
    }
    if (count_group(&r->users, user, d, NULL) != 0)
        return -2;
    if (count_group(&r->models, model ? model : "(unknown)", d, NULL) != 0)
        return -2;
    if (d == MM_DEC_REJECT) {
        int rc = count_rejected_spec(r, get_str(o, "spec_sha256"), get_str(o, "spec"), model, d);
        if (rc != 0)
            return rc;
    }
    count_ratio(r, o);
    if (d == MM_DEC_REJECT)
        return count_rejected_size(r, o);
    return 0;
}

int mm_report_add_line(mm_report *r, const char *file, unsigned long lineno,
                       const char *line, size_t len)
{
    json_tokener *tok;
    json_object *o;
    enum json_tokener_error jerr;
    size_t end, i;
    const char *dec;
    int d, rc;

    if (!r || (!line && len))
        return -1;
    r->lines++;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    for (i = 0; i < len && (line[i] == ' ' || line[i] == '\t'); i++)
        ;
    if (i == len)
        return 1;
    if (len > MM_REPORT_MAX_LINE)
        return bad_line(r, file, lineno, "line longer than %u bytes", MM_REPORT_MAX_LINE);
    if (memchr(line, '\0', len))
        return bad_line(r, file, lineno, "NUL byte in line");

    tok = json_tokener_new_ex(MM_MAX_DEPTH);
    if (!tok)
        return -2;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT
#ifdef JSON_TOKENER_VALIDATE_UTF8
                                    | JSON_TOKENER_VALIDATE_UTF8
#endif
    );
    o = json_tokener_parse_ex(tok, line, (int)len);
    jerr = json_tokener_get_error(tok);
    end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (jerr != json_tokener_success || !o) {
        json_object_put(o);
        return bad_line(r, file, lineno, "invalid JSON: %s",
                        jerr == json_tokener_continue ? "unexpected end of line"
                                                      : json_tokener_error_desc(jerr));
    }
    for (; end < len; end++) {
        if (line[end] != ' ' && line[end] != '\t') {
            json_object_put(o);
            return bad_line(r, file, lineno, "trailing characters after the JSON object");
        }
    }
    if (!json_object_is_type(o, json_type_object)) {
        json_object_put(o);
        return bad_line(r, file, lineno, "not a JSON object");
    }
    dec = get_str(o, "event");
    if (dec && !strcmp(dec, "outcome")) {
        rc = mm_loop_add_outcome(r->loop, o, file, lineno);
        json_object_put(o);
        return rc == -1 ? bad_line(r, file, lineno, "outcome without a job_id") : rc;
    }
    dec = get_str(o, "decision");
    if (!dec) {
        json_object_put(o);
        return bad_line(r, file, lineno, "no \"decision\" string");
    }
    for (d = 0; d < MM_DEC_COUNT; d++)
        if (!strcmp(dec, dec_names[d]))
            break;
    if (d == MM_DEC_COUNT) {
        char shown[40];
        size_t k;
        for (k = 0; dec[k] && k < sizeof(shown) - 1; k++)
            shown[k] = ((unsigned char)dec[k] < 0x20 || dec[k] == 0x7f) ? '?' : dec[k];
        shown[k] = '\0';
        json_object_put(o);
        return bad_line(r, file, lineno, "unknown decision '%s'", shown);
    }
    rc = account(r, o, (mm_decision)d);
    if (rc == 0)
        rc = mm_loop_add_decision(r->loop, o, dec_names[d], file, lineno);
    json_object_put(o);
    return rc;
}

int mm_report_add_stream(mm_report *r, FILE *f, const char *name, mm_error *err)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    unsigned long lineno = 0;
    int rc = 0;

    errno = 0;
    while ((n = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (mm_report_add_line(r, name, lineno, line, (size_t)n) == -2) {
            mm_err(err, "%s:%lu: out of memory", name, lineno);
            rc = -1;
            break;
        }
        errno = 0;
    }
    if (rc == 0 && ferror(f)) {
        mm_err(err, "%s: read error: %s", name, strerror(errno ? errno : EIO));
        rc = -1;
    }
    free(line);
    r->files++;
    return rc;
}

int mm_report_add_file(mm_report *r, const char *path, mm_error *err)
{
    FILE *f;
    struct stat st;
    int rc;

    if (!strcmp(path, "-"))
        return mm_report_add_stream(r, stdin, "-", err);
    f = fopen(path, "r");
    if (!f) {
        mm_err(err, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) {
        fclose(f);
        mm_err(err, "%s: is a directory", path);
        return -1;
    }
    rc = mm_report_add_stream(r, f, path, err);
    fclose(f);
    return rc;
}

/* ---- output -------------------------------------------------------------------- */

static int cmp_total(const void *a, const void *b)
{
    const group *x = a, *y = b;
    if (x->total != y->total)
        return x->total > y->total ? -1 : 1;
    return strcmp(x->key, y->key);
}

static int cmp_num(const void *a, const void *b)
{
    const group *x = a, *y = b;
    return (x->num > y->num) - (x->num < y->num);
}

/* A sorted copy of the group array (pointers into gs). */
static group *sorted(const groupset *gs, int (*cmp)(const void *, const void *))
{
    group *v = malloc((gs->n ? gs->n : 1) * sizeof(*v));
    if (!v)
        return NULL;
    if (gs->n)
        memcpy(v, gs->v, gs->n * sizeof(*v));
    qsort(v, gs->n, sizeof(*v), cmp);
    return v;
}

static json_object *u64j(uint64_t v)
{
    return json_object_new_int64(v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

static json_object *dbl(double v)
{
    /* six significant digits: enough for ratios and hours, and stable output */
    char buf[64];
    snprintf(buf, sizeof(buf), "%.6g", v);
    return json_object_new_double_s(v, buf);
}

static json_object *counts_json(const group *g, const char *keyname)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, keyname, json_object_new_string(g->key));
    json_object_object_add(o, "total", u64j(g->total));
    for (int d = 0; d < MM_DEC_COUNT; d++)
        json_object_object_add(o, dec_names[d], u64j(g->n[d]));
    return o;
}

static json_object *group_list_json(const groupset *gs, const char *keyname, size_t top)
{
    json_object *a = json_object_new_array();
    group *v = sorted(gs, cmp_total);
    if (!v || !a) {
        free(v);
        json_object_put(a);
        return NULL;
    }
    for (size_t i = 0; i < gs->n && i < top; i++)
        json_object_array_add(a, counts_json(&v[i], keyname));
    free(v);
    return a;
}

static const char *ratio_label(size_t b, char *buf, size_t n)
{
    if (b == 0)
        snprintf(buf, n, "<=%.2f", ratio_edges[0]);
    else if (b == N_EDGES)
        snprintf(buf, n, ">%.2f", ratio_edges[N_EDGES - 1]);
    else
        snprintf(buf, n, "%.2f-%.2f", ratio_edges[b - 1], ratio_edges[b]);
    return buf;
}

static json_object *malformed_json(const mm_report *r)
{
    json_object *a = json_object_new_array(), *x;
    for (size_t i = 0; i < r->n_kept; i++) {
        x = json_object_new_object();
        json_object_object_add(x, "file", json_object_new_string(r->kept[i].file));
        json_object_object_add(x, "line", u64j(r->kept[i].line));
        json_object_object_add(x, "error", json_object_new_string(r->kept[i].error));
        json_object_array_add(a, x);
    }
    return a;
}

/* the `top` most rejected specs; NULL when out of memory */
static json_object *rejected_specs_json(const mm_report *r, size_t top)
{
    json_object *a = json_object_new_array(), *x;
    group *v = sorted(&r->specs, cmp_total);
    if (!v) {
        json_object_put(a);
        return NULL;
    }
    for (size_t i = 0; i < r->specs.n && i < top; i++) {
        const char *nl = strchr(v[i].key, '\n');
        x = json_object_new_object();
        json_object_object_add(x, "spec_sha256",
                               json_object_new_string_len(v[i].key, (int)(nl - v[i].key)));
        json_object_object_add(x, "spec", json_object_new_string(nl + 1));
        json_object_object_add(x, "model", v[i].label ? json_object_new_string(v[i].label) : NULL);
        json_object_object_add(x, "rejects", u64j(v[i].total));
        json_object_array_add(a, x);
    }
    free(v);
    return a;
}

static json_object *ratio_json(const mm_report *r)
{
    json_object *x = json_object_new_object(), *a;
    char lab[32];
    json_object_object_add(x, "records", u64j(r->ratio_known));
    json_object_object_add(x, "unknown", u64j(r->ratio_unknown));
    json_object_object_add(x, "min", r->ratio_known ? dbl(r->ratio_min) : NULL);
    json_object_object_add(x, "mean", r->ratio_known ? dbl(r->ratio_sum / (double)r->ratio_known) : NULL);
    json_object_object_add(x, "max", r->ratio_known ? dbl(r->ratio_max) : NULL);
    a = json_object_new_array();
    for (size_t b = 0; b <= N_EDGES; b++) {
        json_object *bin = json_object_new_object();
        json_object_object_add(bin, "bin", json_object_new_string(ratio_label(b, lab, sizeof(lab))));
        json_object_object_add(bin, "lo", b ? dbl(ratio_edges[b - 1]) : NULL);
        json_object_object_add(bin, "hi", b < N_EDGES ? dbl(ratio_edges[b]) : NULL);
        json_object_object_add(bin, "count", u64j(r->ratio_bins[b]));
        json_object_array_add(a, bin);
    }
    json_object_object_add(x, "bins", a);
    return x;
}

/* the rejected jobs' GPU hours, by GPU count; NULL when out of memory */
static json_object *rejected_hours_json(const mm_report *r)
{
    json_object *x = json_object_new_object(), *a;
    json_object_object_add(x, "jobs", u64j(r->rej_jobs));
    json_object_object_add(x, "known", u64j(r->rej_known));
    json_object_object_add(x, "unknown_gpus", u64j(r->rej_unknown_gpus));
    json_object_object_add(x, "unknown_time", u64j(r->rej_unknown_time));
    json_object_object_add(x, "gpu_hours", dbl(r->rej_hours));
    a = json_object_new_array();
    group *v = sorted(&r->sizes, cmp_num);
    if (!v) {
        json_object_put(x);
        json_object_put(a);
        return NULL;
    }
    for (size_t i = 0; i < r->sizes.n; i++) {
        json_object *row = json_object_new_object();
        json_object_object_add(row, "gpus", u64j(v[i].num));
        json_object_object_add(row, "jobs", u64j(v[i].total));
        json_object_object_add(row, "unknown_time", u64j(v[i].unknown));
        json_object_object_add(row, "gpu_hours", dbl(v[i].hours));
        json_object_array_add(a, row);
    }
    free(v);
    json_object_object_add(x, "by_gpus", a);
    return x;
}

static json_object *build_json(const mm_report *r, size_t top)
{
    json_object *o = json_object_new_object(), *x;

    if (!o)
        return NULL;
    json_object_object_add(o, "files", u64j(r->files));
    json_object_object_add(o, "lines", u64j(r->lines));
    json_object_object_add(o, "records", u64j(r->records));
    json_object_object_add(o, "malformed", u64j(r->n_malformed));
    json_object_object_add(o, "malformed_lines", malformed_json(r));
    json_object_object_add(o, "malformed_lines_truncated",
                           json_object_new_boolean(r->n_malformed > r->n_kept));

    x = json_object_new_object();
    for (int d = 0; d < MM_DEC_COUNT; d++)
        json_object_object_add(x, dec_names[d], u64j(r->dec[d]));
    json_object_object_add(o, "decisions", x);

    json_object_object_add(o, "sources", group_list_json(&r->sources, "source", SIZE_MAX));
    json_object_object_add(o, "users_total", u64j(r->users.n));
    json_object_object_add(o, "users", group_list_json(&r->users, "user", top));
    json_object_object_add(o, "models_total", u64j(r->models.n));
    json_object_object_add(o, "models", group_list_json(&r->models, "model", top));

    if (!(x = rejected_specs_json(r, top))) {
        json_object_put(o);
        return NULL;
    }
    json_object_object_add(o, "top_rejected_specs", x);
    json_object_object_add(o, "peak_usable_ratio", ratio_json(r));
    if (!(x = rejected_hours_json(r))) {
        json_object_put(o);
        return NULL;
    }
    json_object_object_add(o, "rejected_gpu_hours", x);
    if (!(x = mm_loop_json(r->loop, top))) {
        json_object_put(o);
        return NULL;
    }
    json_object_object_add(o, "outcomes", x);
    return o;
}

char *mm_report_json(const mm_report *r, size_t top, int pretty)
{
    json_object *o;
    char *out;
    if (!r)
        return NULL;
    o = build_json(r, top ? top : 10);
    if (!o)
        return NULL;
    out = strdup(json_object_to_json_string_ext(
        o, (pretty ? JSON_C_TO_STRING_PRETTY : JSON_C_TO_STRING_PLAIN) | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
    return out;
}

/* Terminal-safe copy of a log string: control bytes shown as '?', cut at `w`
 * bytes with "..." (on a UTF-8 boundary). */
static void safe(const char *s, char *buf, size_t w)
{
    size_t n = strlen(s), k = 0;
    if (w < 4)
        w = 4;
    int cut = n > w;
    size_t lim = cut ? w - 3 : n;
    if (cut)
        while (lim > 0 && ((unsigned char)s[lim] & 0xC0) == 0x80)
            lim--;
    for (size_t i = 0; i < lim; i++) {
        unsigned char c = (unsigned char)s[i];
        buf[k++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
    }
    if (cut) {
        memcpy(buf + k, "...", 3);
        k += 3;
    }
    buf[k] = '\0';
}

static void counts_table(FILE *f, const char *title, const char *col, const groupset *gs, size_t top)
{
    group *v = sorted(gs, cmp_total);
    char name[160];
    if (!v)
        return;
    if (gs->n > top)
        fprintf(f, "\n%s (top %zu of %zu)\n", title, top, gs->n);
    else
        fprintf(f, "\n%s\n", title);
    fprintf(f, "  %-32s %8s %8s %8s %8s %8s %8s\n", col, "total", "accept", "warn", "reject",
            "resize", "error");
    for (size_t i = 0; i < gs->n && i < top; i++) {
        safe(v[i].key, name, 32);
        fprintf(f, "  %-32s %8llu", name, (unsigned long long)v[i].total);
        for (int d = 0; d < MM_DEC_COUNT; d++)
            fprintf(f, " %8llu", (unsigned long long)v[i].n[d]);
        fputc('\n', f);
    }
    free(v);
}

static void text_rejected_specs(FILE *f, const mm_report *r, size_t top)
{
    fprintf(f, "\nMost-rejected specs\n");
    if (r->specs.n == 0)
        fprintf(f, "  (no rejected jobs)\n");
    group *v = sorted(&r->specs, cmp_total);
    if (v && r->specs.n) {
        fprintf(f, "  %8s  %-12s  %-24s  %s\n", "rejects", "sha256", "model", "spec");
        for (size_t i = 0; i < r->specs.n && i < top; i++) {
            const char *nl = strchr(v[i].key, '\n');
            char sha[16], model[80], path[200];
            size_t sl = (size_t)(nl - v[i].key);
            snprintf(sha, sizeof(sha), "%.*s", (int)(sl < 12 ? sl : 12), v[i].key);
            safe(sha, sha, 12);
            safe(v[i].label ? v[i].label : "-", model, 24);
            safe(nl + 1, path, 120);
            fprintf(f, "  %8llu  %-12s  %-24s  %s\n", (unsigned long long)v[i].total, sha, model, path);
        }
    }
    free(v);
}

static void text_ratio(FILE *f, const mm_report *r)
{
    char lab[32];
    fprintf(f, "\nPredicted peak / usable GPU memory (%llu record(s), %llu without both values)\n",
            (unsigned long long)r->ratio_known, (unsigned long long)r->ratio_unknown);
    if (!r->ratio_known)
        return;
    uint64_t most = 1;
    for (size_t b = 0; b <= N_EDGES; b++)
        if (r->ratio_bins[b] > most)
            most = r->ratio_bins[b];
    for (size_t b = 0; b <= N_EDGES; b++) {
        int bar = (int)((r->ratio_bins[b] * 40 + most - 1) / most);
        fprintf(f, "  %-10s %8llu  %.*s%s\n", ratio_label(b, lab, sizeof(lab)),
                (unsigned long long)r->ratio_bins[b], bar,
                "########################################",
                b == 3 ? "   <- fits up to here" : "");
    }
    fprintf(f, "  min %.3g  mean %.3g  max %.3g\n", r->ratio_min,
            r->ratio_sum / (double)r->ratio_known, r->ratio_max);
}

static void text_rejected_hours(FILE *f, const mm_report *r)
{
    fprintf(f, "\nRejected jobs: GPU-hours of would-be OoM runs (GPUs x time limit)\n");
    if (r->rej_jobs == 0) {
        fprintf(f, "  (no rejected jobs)\n");
        return;
    }
    group *v = sorted(&r->sizes, cmp_num);
    if (v && r->sizes.n) {
        fprintf(f, "  %6s %8s %12s %14s\n", "gpus", "jobs", "gpu-hours", "no-time-limit");
        for (size_t i = 0; i < r->sizes.n; i++)
            fprintf(f, "  %6llu %8llu %12.1f %14llu\n", (unsigned long long)v[i].num,
                    (unsigned long long)v[i].total, v[i].hours,
                    (unsigned long long)v[i].unknown);
    }
    free(v);
    fprintf(f, "  total: %.1f GPU-hours over %llu of %llu rejected job(s); unknown: %llu "
               "without GPU count, %llu without time limit\n",
            r->rej_hours, (unsigned long long)r->rej_known, (unsigned long long)r->rej_jobs,
            (unsigned long long)r->rej_unknown_gpus, (unsigned long long)r->rej_unknown_time);
}

static void text_malformed(FILE *f, const mm_report *r)
{
    char name[160];
    if (!r->n_malformed)
        return;
    fprintf(f, "\nMalformed lines (%llu)\n", (unsigned long long)r->n_malformed);
    for (size_t i = 0; i < r->n_kept; i++) {
        safe(r->kept[i].file, name, 120);
        fprintf(f, "  %s:%lu: %s\n", name, r->kept[i].line, r->kept[i].error);
    }
    if (r->n_malformed > r->n_kept)
        fprintf(f, "  ... and %llu more\n", (unsigned long long)(r->n_malformed - r->n_kept));
}

char *mm_report_text(const mm_report *r, size_t top)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f;

    if (!r)
        return NULL;
    if (!top)
        top = 10;
    f = open_memstream(&buf, &len);
    if (!f)
        return NULL;

    fprintf(f, "mmguard report: %llu file(s), %llu line(s), %llu record(s), %llu malformed\n",
            (unsigned long long)r->files, (unsigned long long)r->lines,
            (unsigned long long)r->records, (unsigned long long)r->n_malformed);

    fprintf(f, "\nDecisions\n");
    for (int d = 0; d < MM_DEC_COUNT; d++)
        fprintf(f, "  %-8s %8llu  %5.1f%%\n", dec_names[d], (unsigned long long)r->dec[d],
                r->records ? 100.0 * (double)r->dec[d] / (double)r->records : 0.0);
    counts_table(f, "By source", "source", &r->sources, SIZE_MAX);
    counts_table(f, "By user", "user", &r->users, top);
    counts_table(f, "By model", "model", &r->models, top);
    text_rejected_specs(f, r, top);
    text_ratio(f, r);
    text_rejected_hours(f, r);
    if (mm_loop_outcome_lines(r->loop))
        mm_loop_text(r->loop, f, top);
    text_malformed(f, r);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
