/* loop.c - predicted vs measured from the decision log's outcome lines
 * (loop.h).  Jobs are the outcome lines of one job_id folded together (every
 * step's record: the largest values, an OOM if any step had one).  A job
 * joins the earliest unused decision line of the same uid and spec digest
 * (and predicted peak, when both say one) written no later than its outcome,
 * taking jobs by increasing id (Slurm numbers jobs in submission order);
 * plugin lines (sbatch/salloc/srun) with the decision the job was published
 * with are preferred to slurmctld's. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "loop.h"
#include "spec.h"

const double mm_loop_margins[MM_LOOP_N_MARGINS] = { 0, 2.5, 5, 7.5, 10, 15, 20, 25, 30, 40 };

typedef struct dec_rec {
    char *time, *user, *sha, *source, *decision, *model, *gpu, *file;
    unsigned long line;
    double uid, peak, usable, gpu_mem, dp;
    int has_uid, used;
} dec_rec;

typedef struct job {
    double job_id, uid;
    char *time, *state, *file, *status, *oom_phase, *oom_kind;
    unsigned long line;
    /* measured (-1 = absent) */
    double dev_peak, max_alloc, max_reserved, nvml, host_rss, seq, mb, world, ooms;
    int oom;
    /* predicted (the published record) */
    char *p_decision, *p_model, *p_sha, *p_gpu, *p_spec;
    double p_peak, p_alloc, p_usable, p_gpu_mem, p_dp;
    const dec_rec *dec;
    double err;                 /* predicted / measured - 1, NAN unknown */
} job;

struct mm_loop {
    dec_rec *decs;
    size_t n_decs, cap_decs;
    job *jobs;                  /* one per outcome line until joined */
    size_t n_jobs, cap_jobs, n_lines;
    size_t state_ok, state_missing, state_invalid;
    int joined;
};

mm_loop *mm_loop_new(void)
{
    return calloc(1, sizeof(mm_loop));
}

static void free_job(job *j)
{
    free(j->time);
    free(j->state);
    free(j->file);
    free(j->status);
    free(j->oom_phase);
    free(j->oom_kind);
    free(j->p_decision);
    free(j->p_model);
    free(j->p_sha);
    free(j->p_gpu);
    free(j->p_spec);
}

void mm_loop_free(mm_loop *l)
{
    if (!l)
        return;
    for (size_t i = 0; i < l->n_decs; i++) {
        dec_rec *d = &l->decs[i];
        free(d->time);
        free(d->user);
        free(d->sha);
        free(d->source);
        free(d->decision);
        free(d->model);
        free(d->gpu);
        free(d->file);
    }
    for (size_t i = 0; i < l->n_jobs; i++)
        free_job(&l->jobs[i]);
    free(l->decs);
    free(l->jobs);
    free(l);
}

size_t mm_loop_n_decisions(const mm_loop *l)
{
    return l ? l->n_decs : 0;
}

const char *mm_loop_decision_at(const mm_loop *l, size_t i, const char **time)
{
    *time = l->decs[i].time ? l->decs[i].time : "";
    return l->decs[i].decision;
}

size_t mm_loop_outcome_lines(const mm_loop *l)
{
    return l ? l->n_lines : 0;
}

/* ---- reading ------------------------------------------------------------------- */

static json_object *member(json_object *o, const char *key)
{
    json_object *v;
    return o && json_object_object_get_ex(o, key, &v) ? v : NULL;
}

/* NULL (absent) or a copy; *oom set when the copy failed */
static char *dup_str(json_object *o, const char *key, int *oom)
{
    json_object *v = member(o, key);
    char *s;
    if (!v || !json_object_is_type(v, json_type_string))
        return NULL;
    s = strdup(json_object_get_string(v));
    if (!s)
        *oom = 1;
    return s;
}

/* a non-negative finite number, else -1 */
static double num(json_object *o, const char *key)
{
    json_object *v = member(o, key);
    double d;
    if (!v)
        return -1;
    if (json_object_is_type(v, json_type_int))
        d = (double)json_object_get_int64(v);
    else if (json_object_is_type(v, json_type_double))
        d = json_object_get_double(v);
    else
        return -1;
    return isfinite(d) && d >= 0 ? d : -1;
}

static int grow(void **arr, size_t *cap, size_t n, size_t size)
{
    void *p;
    size_t nc;
    if (n < *cap)
        return 0;
    nc = *cap ? *cap * 2 : 64;
    p = realloc(*arr, nc * size);
    if (!p)
        return -2;
    *arr = p;
    *cap = nc;
    return 0;
}

int mm_loop_add_decision(mm_loop *l, json_object *o, const char *decision,
                         const char *file, unsigned long lineno)
{
    dec_rec *d;
    int oom = 0;
    if (grow((void **)&l->decs, &l->cap_decs, l->n_decs, sizeof(dec_rec)) != 0)
        return -2;
    d = &l->decs[l->n_decs];
    memset(d, 0, sizeof(*d));
    d->time = dup_str(o, "time", &oom);
    d->user = dup_str(o, "user", &oom);
    d->sha = dup_str(o, "spec_sha256", &oom);
    d->source = dup_str(o, "source", &oom);
    d->model = dup_str(o, "model", &oom);
    d->gpu = dup_str(o, "gpu", &oom);
    d->decision = strdup(decision);
    d->file = strdup(file ? file : "-");
    d->line = lineno;
    d->uid = num(o, "uid");
    d->has_uid = d->uid >= 0;
    d->peak = num(o, "peak_bytes");
    d->usable = num(o, "usable_bytes");
    d->gpu_mem = num(o, "gpu_mem_bytes");
    d->dp = num(o, "data_parallel");
    l->n_decs++;
    return oom || !d->decision || !d->file ? -2 : 0;
}

/* The device-level peak the job measured: NVML's sampled peak (it sees the
 * CUDA context and everything outside the caching allocator, as mmguard's
 * peak does), else the caching allocator's reserved peak. */
static void read_measured(job *j, json_object *m, int *oom)
{
    json_object *x = member(m, "oom");
    j->status = dup_str(m, "status", oom);
    j->max_alloc = num(m, "max_allocated_bytes");
    j->max_reserved = num(m, "max_reserved_bytes");
    j->nvml = num(m, "nvml_peak_used_bytes");
    j->host_rss = num(m, "host_peak_rss_bytes");
    j->seq = num(m, "max_seq_len");
    j->mb = num(m, "micro_batch");
    j->world = num(m, "world_size");
    j->ooms = num(m, "num_ooms");
    j->dev_peak = j->nvml >= 0 ? j->nvml : j->max_reserved;
    if (x && json_object_is_type(x, json_type_object)) {
        j->oom = 1;
        j->oom_phase = dup_str(x, "phase", oom);
        j->oom_kind = dup_str(x, "kind", oom);
    }
    if (j->ooms > 0 || (j->status && !strcmp(j->status, "oom")))
        j->oom = 1;
}

static void read_predicted(job *j, json_object *p, int *oom)
{
    j->p_decision = dup_str(p, "decision", oom);
    j->p_model = dup_str(p, "model", oom);
    j->p_sha = dup_str(p, "spec_sha256", oom);
    j->p_gpu = dup_str(p, "gpu", oom);
    j->p_spec = dup_str(p, "spec", oom);
    j->p_peak = num(p, "peak_bytes");
    j->p_alloc = num(p, "allocated_peak_bytes");
    j->p_usable = num(p, "usable_bytes");
    j->p_gpu_mem = num(p, "gpu_mem_bytes");
    j->p_dp = num(p, "data_parallel");
}

int mm_loop_add_outcome(mm_loop *l, json_object *o, const char *file, unsigned long lineno)
{
    job *j;
    int oom = 0;
    json_object *m = member(o, "measured"), *p = member(o, "predicted");
    if (num(o, "job_id") < 0)
        return -1;
    if (grow((void **)&l->jobs, &l->cap_jobs, l->n_jobs, sizeof(job)) != 0)
        return -2;
    j = &l->jobs[l->n_jobs++];
    memset(j, 0, sizeof(*j));
    l->n_lines++;
    j->job_id = num(o, "job_id");
    j->uid = num(o, "uid");
    j->time = dup_str(o, "time", &oom);
    j->state = dup_str(o, "record_state", &oom);
    j->file = strdup(file ? file : "-");
    j->line = lineno;
    j->dev_peak = j->max_alloc = j->max_reserved = j->nvml = j->host_rss = -1;
    j->seq = j->mb = j->world = j->ooms = -1;
    j->p_peak = j->p_alloc = j->p_usable = j->p_gpu_mem = j->p_dp = -1;
    if (m && json_object_is_type(m, json_type_object))
        read_measured(j, m, &oom);
    if (p && json_object_is_type(p, json_type_object))
        read_predicted(j, p, &oom);
    return oom || !j->file ? -2 : 0;
}

/* ---- folding and joining ------------------------------------------------------------ */

static int cmp_job(const void *a, const void *b)
{
    const job *x = a, *y = b;
    if (x->job_id != y->job_id)
        return x->job_id < y->job_id ? -1 : 1;
    return x->line < y->line ? -1 : x->line > y->line;
}

static double maxd(double a, double b)
{
    return a > b ? a : b;
}

static int state_rank(const char *s)
{
    return !s ? 0 : !strcmp(s, "ok") ? 3 : !strcmp(s, "invalid") ? 2 : 1;
}

/* b (a later step of the same job) into a; b is freed */
static void fold(job *a, job *b)
{
    a->dev_peak = maxd(a->dev_peak, b->dev_peak);
    a->max_alloc = maxd(a->max_alloc, b->max_alloc);
    a->max_reserved = maxd(a->max_reserved, b->max_reserved);
    a->nvml = maxd(a->nvml, b->nvml);
    a->host_rss = maxd(a->host_rss, b->host_rss);
    a->seq = maxd(a->seq, b->seq);
    a->mb = maxd(a->mb, b->mb);
    a->world = maxd(a->world, b->world);
    if (b->oom && !a->oom) {
        a->oom = 1;
        free(a->oom_phase);
        free(a->oom_kind);
        a->oom_phase = b->oom_phase;
        a->oom_kind = b->oom_kind;
        b->oom_phase = b->oom_kind = NULL;
    }
    if (state_rank(b->state) > state_rank(a->state)) {
        char *t = a->state;
        a->state = b->state;
        b->state = t;
    }
    if (!a->p_decision && b->p_decision) {   /* the later line's prediction */
        char *t[5] = { a->p_decision, a->p_model, a->p_sha, a->p_gpu, a->p_spec };
        a->p_decision = b->p_decision, a->p_model = b->p_model;
        a->p_sha = b->p_sha, a->p_gpu = b->p_gpu, a->p_spec = b->p_spec;
        b->p_decision = t[0], b->p_model = t[1], b->p_sha = t[2], b->p_gpu = t[3];
        b->p_spec = t[4];
        a->p_peak = b->p_peak, a->p_alloc = b->p_alloc, a->p_usable = b->p_usable;
        a->p_gpu_mem = b->p_gpu_mem, a->p_dp = b->p_dp;
    }
    free_job(b);
}

static int same(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

static int matches(const dec_rec *d, const job *j, int ctld)
{
    if (d->used || !d->has_uid || d->uid != j->uid || !same(d->sha, j->p_sha))
        return 0;
    if ((d->source && !strcmp(d->source, "slurmctld")) != ctld)
        return 0;
    if (d->peak >= 0 && j->p_peak >= 0 && d->peak != j->p_peak)
        return 0;
    /* the plugin's line says what it published (a warn run after a reject) */
    if (!ctld && j->p_decision && strcmp(d->decision, j->p_decision))
        return 0;
    return !d->time || !j->time || strcmp(d->time, j->time) <= 0;
}

static int cmp_dec_time(const dec_rec *a, const dec_rec *b)
{
    int c = strcmp(a->time ? a->time : "", b->time ? b->time : "");
    return c ? c : (a->line < b->line ? -1 : a->line > b->line);
}

static void join_one(mm_loop *l, job *j)
{
    for (int ctld = 0; ctld <= 1 && !j->dec; ctld++) {
        dec_rec *best = NULL;
        for (size_t i = 0; i < l->n_decs; i++)
            if (matches(&l->decs[i], j, ctld) && (!best || cmp_dec_time(&l->decs[i], best) < 0))
                best = &l->decs[i];
        if (best) {
            best->used = 1;
            j->dec = best;
        }
    }
    j->err = j->dev_peak > 0 && j->p_peak >= 0 ? j->p_peak / j->dev_peak - 1 : NAN;
}

static void join(mm_loop *l)
{
    size_t w = 0;
    if (l->joined)
        return;
    l->joined = 1;
    if (l->n_jobs)
        qsort(l->jobs, l->n_jobs, sizeof(job), cmp_job);
    for (size_t i = 0; i < l->n_jobs; i++) {
        if (w && l->jobs[w - 1].job_id == l->jobs[i].job_id)
            fold(&l->jobs[w - 1], &l->jobs[i]);
        else
            l->jobs[w++] = l->jobs[i];
    }
    l->n_jobs = w;
    for (size_t i = 0; i < l->n_jobs; i++) {
        job *j = &l->jobs[i];
        join_one(l, j);
        l->state_ok += state_rank(j->state) == 3;
        l->state_invalid += state_rank(j->state) == 2;
        l->state_missing += state_rank(j->state) <= 1;
    }
}

/* ---- the summary --------------------------------------------------------------------- */

static json_object *nj(double v)
{
    if (v < 0 || !isfinite(v))
        return NULL;
    if (v == floor(v) && v < 9.0e15)
        return json_object_new_int64((int64_t)v);
    return json_object_new_double(v);
}

static json_object *errj(double e)
{
    return isfinite(e) ? json_object_new_double(round(e * 1e4) / 1e4) : NULL;
}

static json_object *sj(const char *s)
{
    return s ? json_object_new_string(s) : NULL;
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double quantile(const double *v, size_t n, double q)
{
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    return i + 1 < n ? v[i] + (v[i + 1] - v[i]) * (pos - (double)i) : v[n - 1];
}

#define N_ERR_EDGES 9
static const double err_edges[N_ERR_EDGES] = { -0.5, -0.25, -0.1, -0.05, 0, 0.05, 0.1, 0.25, 0.5 };

/* The distribution of predicted/measured - 1 over the jobs that have both. */
static json_object *error_json(const mm_loop *l)
{
    json_object *o = json_object_new_object(), *bins = json_object_new_array();
    double *v = malloc((l->n_jobs + 1) * sizeof(double)), abs_sum = 0;
    size_t n = 0, under = 0, counts[N_ERR_EDGES + 1] = { 0 };
    for (size_t i = 0; v && i < l->n_jobs; i++)
        if (isfinite(l->jobs[i].err))
            v[n++] = l->jobs[i].err;
    if (v && n)
        qsort(v, n, sizeof(double), cmp_dbl);
    for (size_t i = 0; i < n; i++) {
        size_t b = 0;
        while (b < N_ERR_EDGES && v[i] > err_edges[b])
            b++;
        counts[b]++;
        under += v[i] < 0;
        abs_sum += fabs(v[i]);
    }
    json_object_object_add(o, "jobs", json_object_new_int64((int64_t)n));
    json_object_object_add(o, "under", json_object_new_int64((int64_t)under));
    json_object_object_add(o, "min", n ? errj(v[0]) : NULL);
    json_object_object_add(o, "p10", n ? errj(quantile(v, n, 0.1)) : NULL);
    json_object_object_add(o, "median", n ? errj(quantile(v, n, 0.5)) : NULL);
    json_object_object_add(o, "p90", n ? errj(quantile(v, n, 0.9)) : NULL);
    json_object_object_add(o, "max", n ? errj(v[n - 1]) : NULL);
    json_object_object_add(o, "mean_abs", n ? errj(abs_sum / (double)n) : NULL);
    for (size_t b = 0; b <= N_ERR_EDGES; b++) {
        json_object *x = json_object_new_object();
        json_object_object_add(x, "lo", b ? json_object_new_double(err_edges[b - 1]) : NULL);
        json_object_object_add(x, "hi", b < N_ERR_EDGES ? json_object_new_double(err_edges[b]) : NULL);
        json_object_object_add(x, "count", json_object_new_int64((int64_t)counts[b]));
        json_object_array_add(bins, x);
    }
    json_object_object_add(o, "histogram", bins);
    free(v);
    return o;
}

static const char *job_user(const job *j, char *buf, size_t n)
{
    if (j->dec && j->dec->user)
        return j->dec->user;
    snprintf(buf, n, "uid:%.0f", j->uid);
    return buf;
}

static json_object *job_json(const job *j)
{
    json_object *o = json_object_new_object();
    char ubuf[32];
    json_object_object_add(o, "job_id", nj(j->job_id));
    json_object_object_add(o, "user", json_object_new_string(job_user(j, ubuf, sizeof ubuf)));
    json_object_object_add(o, "model", sj(j->p_model));
    json_object_object_add(o, "gpu", sj(j->p_gpu));
    json_object_object_add(o, "decision", sj(j->p_decision));
    json_object_object_add(o, "predicted_peak_bytes", nj(j->p_peak));
    json_object_object_add(o, "measured_peak_bytes", nj(j->dev_peak));
    json_object_object_add(o, "error", errj(j->err));
    json_object_object_add(o, "oom", json_object_new_boolean(j->oom));
    json_object_object_add(o, "oom_phase", sj(j->oom_phase));
    return o;
}

static int cmp_err_ptr(const void *a, const void *b)
{
    const job *x = *(const job *const *)a, *y = *(const job *const *)b;
    return x->err < y->err ? -1 : x->err > y->err;
}

/* Jobs the prediction under-estimated, worst first. */
static json_object *under_json(const mm_loop *l, size_t top)
{
    json_object *a = json_object_new_array();
    const job **v = malloc((l->n_jobs + 1) * sizeof(*v));
    size_t n = 0;
    for (size_t i = 0; v && i < l->n_jobs; i++)
        if (isfinite(l->jobs[i].err) && l->jobs[i].err < 0)
            v[n++] = &l->jobs[i];
    if (v && n)
        qsort(v, n, sizeof(*v), cmp_err_ptr);
    for (size_t i = 0; i < n && i < top; i++)
        json_object_array_add(a, job_json(v[i]));
    free(v);
    return a;
}

typedef struct gkey {
    const char *key;
    double err;
} gkey;

static int cmp_gkey(const void *a, const void *b)
{
    const gkey *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->err < y->err ? -1 : x->err > y->err);
}

static const char *group_key(const job *j, int by, char *buf, size_t n)
{
    if (by == 0)
        return j->p_model ? j->p_model : "(unknown)";
    if (by == 1)
        return job_user(j, buf, n);
    return j->p_gpu ? j->p_gpu : "(unknown)";
}

static json_object *group_row(const gkey *g, size_t n)
{
    json_object *x = json_object_new_object();
    double *e = malloc(n * sizeof(double));
    size_t under = 0;
    for (size_t i = 0; e && i < n; i++) {
        e[i] = g[i].err;
        under += g[i].err < 0;
    }
    json_object_object_add(x, "key", json_object_new_string(g[0].key));
    json_object_object_add(x, "jobs", json_object_new_int64((int64_t)n));
    json_object_object_add(x, "under", json_object_new_int64((int64_t)under));
    json_object_object_add(x, "worst_error", errj(g[0].err));
    json_object_object_add(x, "median_error", e ? errj(quantile(e, n, 0.5)) : NULL);
    json_object_object_add(x, "max_error", errj(g[n - 1].err));
    free(e);
    return x;
}

/* Per model (by 0), user (1) or GPU type (2): worst under-prediction first. */
static json_object *groups_json(const mm_loop *l, int by)
{
    json_object *a = json_object_new_array();
    gkey *g = malloc((l->n_jobs + 1) * sizeof(gkey));
    char (*ub)[32] = malloc((l->n_jobs + 1) * sizeof(*ub));
    size_t n = 0, start = 0;
    json_object **rows;
    size_t nrows = 0;
    for (size_t i = 0; g && ub && i < l->n_jobs; i++)
        if (isfinite(l->jobs[i].err)) {
            g[n].key = group_key(&l->jobs[i], by, ub[n], sizeof ub[n]);
            g[n].err = l->jobs[i].err;
            n++;
        }
    if (n)
        qsort(g, n, sizeof(gkey), cmp_gkey);
    rows = malloc((n + 1) * sizeof(*rows));
    for (size_t i = 1; rows && i <= n; i++)
        if (i == n || strcmp(g[i].key, g[start].key)) {
            rows[nrows++] = group_row(&g[start], i - start);
            start = i;
        }
    /* worst first: by each group's most negative error */
    for (size_t i = 1; i < nrows; i++)
        for (size_t k = i; k > 0; k--) {
            json_object *w1, *w2;
            json_object_object_get_ex(rows[k - 1], "worst_error", &w1);
            json_object_object_get_ex(rows[k], "worst_error", &w2);
            if (json_object_get_double(w2) >= json_object_get_double(w1))
                break;
            json_object *t = rows[k - 1];
            rows[k - 1] = rows[k];
            rows[k] = t;
        }
    for (size_t i = 0; i < nrows; i++)
        json_object_array_add(a, rows[i]);
    free(rows);
    free(g);
    free(ub);
    return a;
}

static int admitted(const char *d)
{
    return d && (!strcmp(d, "accept") || !strcmp(d, "warn") || !strcmp(d, "resize"));
}

/* Jobs mmguard let run that ran out of memory. */
static json_object *ooms_json(const mm_loop *l, size_t top, size_t *count)
{
    json_object *a = json_object_new_array();
    *count = 0;
    for (size_t i = 0; i < l->n_jobs; i++) {
        const job *j = &l->jobs[i];
        if (!j->oom || !admitted(j->p_decision))
            continue;
        if ((*count)++ < top)
            json_object_array_add(a, job_json(j));
    }
    return a;
}

/* A rejection the measurements contradict: a later job of the same user and
 * spec digest on the same GPU type and data-parallel degree ran, without an
 * OOM, at a measured peak within the rejected decision's usable memory. */
static const job *contradicts(const mm_loop *l, const dec_rec *d)
{
    for (size_t i = 0; i < l->n_jobs; i++) {
        const job *j = &l->jobs[i];
        if (j->oom || j->dev_peak <= 0 || j->uid != d->uid || !same(j->p_sha, d->sha) ||
            !same(j->p_gpu, d->gpu) || j->p_dp != d->dp || d->usable < 0)
            continue;
        if (j->dev_peak <= d->usable && (!d->time || !j->time || strcmp(d->time, j->time) <= 0))
            return j;
    }
    return NULL;
}

static json_object *false_rejections_json(const mm_loop *l, size_t top, size_t *count)
{
    json_object *a = json_object_new_array();
    *count = 0;
    for (size_t i = 0; i < l->n_decs; i++) {
        const dec_rec *d = &l->decs[i];
        const job *j;
        json_object *x;
        if (strcmp(d->decision, "reject") || !d->has_uid || !(j = contradicts(l, d)))
            continue;
        if ((*count)++ >= top)
            continue;
        x = json_object_new_object();
        json_object_object_add(x, "file", json_object_new_string(d->file));
        json_object_object_add(x, "line", json_object_new_int64((int64_t)d->line));
        json_object_object_add(x, "user", sj(d->user));
        json_object_object_add(x, "model", sj(d->model));
        json_object_object_add(x, "gpu", sj(d->gpu));
        json_object_object_add(x, "usable_bytes", nj(d->usable));
        json_object_object_add(x, "predicted_peak_bytes", nj(d->peak));
        json_object_object_add(x, "job_id", nj(j->job_id));
        json_object_object_add(x, "measured_peak_bytes", nj(j->dev_peak));
        json_object_array_add(a, x);
    }
    return a;
}

/* For margin m (percent of the card): accepted iff predicted <= card x (1 -
 * m/100); would OOM iff it did, or its measured device peak exceeds the card. */
static void advice_counts(const mm_loop *l, size_t acc[MM_LOOP_N_MARGINS],
                          size_t oom[MM_LOOP_N_MARGINS], size_t fit_rej[MM_LOOP_N_MARGINS],
                          size_t *usable_jobs)
{
    *usable_jobs = 0;
    memset(acc, 0, MM_LOOP_N_MARGINS * sizeof(size_t));
    memset(oom, 0, MM_LOOP_N_MARGINS * sizeof(size_t));
    memset(fit_rej, 0, MM_LOOP_N_MARGINS * sizeof(size_t));
    for (size_t i = 0; i < l->n_jobs; i++) {
        const job *j = &l->jobs[i];
        int dies;
        if (j->p_peak < 0 || j->p_gpu_mem <= 0 || (j->dev_peak <= 0 && !j->oom))
            continue;
        (*usable_jobs)++;
        dies = j->oom || j->dev_peak > j->p_gpu_mem;
        for (size_t m = 0; m < MM_LOOP_N_MARGINS; m++) {
            int in = j->p_peak <= j->p_gpu_mem * (1 - mm_loop_margins[m] / 100);
            acc[m] += in;
            oom[m] += in && dies;
            fit_rej[m] += !in && !dies;
        }
    }
}

static json_object *advice_json(const mm_loop *l)
{
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    size_t acc[MM_LOOP_N_MARGINS], oom[MM_LOOP_N_MARGINS], rej[MM_LOOP_N_MARGINS], n;
    int best = -1;
    advice_counts(l, acc, oom, rej, &n);
    for (size_t m = 0; m < MM_LOOP_N_MARGINS; m++) {
        json_object *x = json_object_new_object();
        json_object_object_add(x, "margin_percent", json_object_new_double(mm_loop_margins[m]));
        json_object_object_add(x, "accepted", json_object_new_int64((int64_t)acc[m]));
        json_object_object_add(x, "accepted_oom", json_object_new_int64((int64_t)oom[m]));
        json_object_object_add(x, "rejected_would_fit", json_object_new_int64((int64_t)rej[m]));
        json_object_array_add(a, x);
        if (best < 0 && n && oom[m] == 0)
            best = (int)m;
    }
    json_object_object_add(o, "jobs", json_object_new_int64((int64_t)n));
    json_object_object_add(o, "candidates", a);
    json_object_object_add(o, "smallest_safe_margin_percent",
                           best >= 0 ? json_object_new_double(mm_loop_margins[best]) : NULL);
    return o;
}

size_t mm_loop_points(mm_loop *l, double *pred, double *meas, size_t cap)
{
    size_t n = 0;
    join(l);
    for (size_t i = 0; i < l->n_jobs && n < cap; i++)
        if (isfinite(l->jobs[i].err)) {
            pred[n] = l->jobs[i].p_peak;
            meas[n++] = l->jobs[i].dev_peak;
        }
    return n;
}

void mm_loop_advice(mm_loop *l, size_t accepted[MM_LOOP_N_MARGINS],
                    size_t would_oom[MM_LOOP_N_MARGINS])
{
    size_t rej[MM_LOOP_N_MARGINS], n;
    join(l);
    advice_counts(l, accepted, would_oom, rej, &n);
}

/* ---- sequences: what jobs reached against what their spec stated ---------------------- */

static int cmp_sha_ptr(const void *a, const void *b)
{
    const job *x = *(const job *const *)a, *y = *(const job *const *)b;
    return strcmp(x->p_sha, y->p_sha);
}

/* The spec's training.seq_len and micro_batch_size when the file is still
 * there and its digest is the logged one (else -1: changed or gone). */
static void spec_worst(const job *j, double *seq, double *mb)
{
    mm_error err;
    mm_spec *s;
    *seq = *mb = -1;
    if (!j->p_spec || !j->p_sha)
        return;
    s = mm_spec_load_file(j->p_spec, &err);
    if (s && !strcmp(mm_spec_digest(s), j->p_sha)) {
        *seq = (double)s->training.seq_len;
        *mb = (double)s->training.micro_batch_size;
    }
    mm_spec_free(s);
}

static json_object *seq_row(const job *const *g, size_t n)
{
    json_object *x = json_object_new_object();
    double seq = -1, mb = -1, sseq, smb;
    for (size_t i = 0; i < n; i++) {
        seq = maxd(seq, g[i]->seq);
        mb = maxd(mb, g[i]->mb);
    }
    spec_worst(g[0], &sseq, &smb);
    json_object_object_add(x, "model", sj(g[0]->p_model));
    json_object_object_add(x, "spec_sha256", sj(g[0]->p_sha));
    json_object_object_add(x, "jobs", json_object_new_int64((int64_t)n));
    json_object_object_add(x, "max_seq_len_seen", nj(seq));
    json_object_object_add(x, "spec_seq_len", nj(sseq));
    json_object_object_add(x, "max_micro_batch_seen", nj(mb));
    json_object_object_add(x, "spec_micro_batch", nj(smb));
    json_object_object_add(x, "seq_len_used", seq >= 0 && sseq > 0 ? errj(seq / sseq) : NULL);
    return x;
}

static json_object *sequences_json(const mm_loop *l)
{
    json_object *a = json_object_new_array();
    const job **v = malloc((l->n_jobs + 1) * sizeof(*v));
    size_t n = 0, start = 0;
    for (size_t i = 0; v && i < l->n_jobs; i++)
        if (l->jobs[i].p_sha && l->jobs[i].seq >= 0)
            v[n++] = &l->jobs[i];
    if (v && n)
        qsort(v, n, sizeof(*v), cmp_sha_ptr);
    for (size_t i = 1; v && i <= n; i++)
        if (i == n || strcmp(v[i]->p_sha, v[start]->p_sha)) {
            json_object_array_add(a, seq_row(&v[start], i - start));
            start = i;
        }
    free(v);
    return a;
}

/* ---- every job ------------------------------------------------------------------------- */

static json_object *full_job_json(const job *j)
{
    json_object *o = job_json(j), *m = json_object_new_object(), *d = NULL;
    json_object_object_add(o, "record_state", sj(j->state));
    json_object_object_add(m, "status", sj(j->status));
    json_object_object_add(m, "max_allocated_bytes", nj(j->max_alloc));
    json_object_object_add(m, "max_reserved_bytes", nj(j->max_reserved));
    json_object_object_add(m, "nvml_peak_used_bytes", nj(j->nvml));
    json_object_object_add(m, "host_peak_rss_bytes", nj(j->host_rss));
    json_object_object_add(m, "max_seq_len", nj(j->seq));
    json_object_object_add(m, "micro_batch", nj(j->mb));
    json_object_object_add(m, "world_size", nj(j->world));
    json_object_object_add(o, "measured", m);
    if (j->dec) {
        d = json_object_new_object();
        json_object_object_add(d, "decision", sj(j->dec->decision));
        json_object_object_add(d, "source", sj(j->dec->source));
        json_object_object_add(d, "time", sj(j->dec->time));
        json_object_object_add(d, "file", sj(j->dec->file));
        json_object_object_add(d, "line", json_object_new_int64((int64_t)j->dec->line));
    }
    json_object_object_add(o, "decision", d);
    json_object_object_add(o, "published_decision", sj(j->p_decision));
    return o;
}

json_object *mm_loop_json(mm_loop *l, size_t top)
{
    json_object *o = json_object_new_object(), *r = json_object_new_object(), *jobs;
    size_t n_oom, n_rej, joined = 0;
    join(l);
    jobs = json_object_new_array();
    for (size_t i = 0; i < l->n_jobs; i++) {
        joined += l->jobs[i].dec != NULL;
        json_object_array_add(jobs, full_job_json(&l->jobs[i]));
    }
    json_object_object_add(o, "outcome_lines", json_object_new_int64((int64_t)l->n_lines));
    json_object_object_add(o, "jobs_total", json_object_new_int64((int64_t)l->n_jobs));
    json_object_object_add(r, "ok", json_object_new_int64((int64_t)l->state_ok));
    json_object_object_add(r, "missing", json_object_new_int64((int64_t)l->state_missing));
    json_object_object_add(r, "invalid", json_object_new_int64((int64_t)l->state_invalid));
    json_object_object_add(o, "records", r);
    json_object_object_add(o, "joined", json_object_new_int64((int64_t)joined));
    json_object_object_add(o, "error", error_json(l));
    json_object_object_add(o, "under_predictions", under_json(l, top));
    json_object_object_add(o, "by_model", groups_json(l, 0));
    json_object_object_add(o, "by_user", groups_json(l, 1));
    json_object_object_add(o, "by_gpu", groups_json(l, 2));
    json_object_object_add(o, "ooms_let_through", ooms_json(l, SIZE_MAX, &n_oom));
    json_object_object_add(o, "ooms_let_through_count", json_object_new_int64((int64_t)n_oom));
    json_object_object_add(o, "false_rejections", false_rejections_json(l, SIZE_MAX, &n_rej));
    json_object_object_add(o, "false_rejections_count", json_object_new_int64((int64_t)n_rej));
    json_object_object_add(o, "sequences", sequences_json(l));
    json_object_object_add(o, "margin_advice", advice_json(l));
    json_object_object_add(o, "jobs", jobs);
    return o;
}

/* ---- text -------------------------------------------------------------------------------- */

static void text_rows(FILE *f, const char *title, json_object *a, const char *const *keys)
{
    size_t n = json_object_array_length(a);
    if (!n)
        return;
    fprintf(f, "\n%s\n", title);
    for (size_t i = 0; i < n; i++) {
        json_object *x = json_object_array_get_idx(a, i), *v;
        fputs(" ", f);
        for (size_t k = 0; keys[k]; k++) {
            const char *s = json_object_object_get_ex(x, keys[k], &v) && v
                            ? json_object_get_string(v) : "-";
            char buf[48];
            size_t m;
            if (v && json_object_is_type(v, json_type_double)) {
                fprintf(f, " %s=%.4g", keys[k], json_object_get_double(v));
                continue;
            }
            for (m = 0; s[m] && m < sizeof buf - 1; m++)   /* no control bytes from the log */
                buf[m] = (unsigned char)s[m] < 0x20 || s[m] == 0x7f ? '?' : s[m];
            buf[m] = '\0';
            fprintf(f, " %s=%s", keys[k], buf);
        }
        fputc('\n', f);
    }
}

static double dget(json_object *o, const char *k)
{
    json_object *v;
    return json_object_object_get_ex(o, k, &v) && v ? json_object_get_double(v) : NAN;
}

static void text_error(FILE *f, json_object *e)
{
    int n = (int)dget(e, "jobs");
    if (!n) {
        fputs("  predicted vs measured: no job with both a prediction and a measured device peak\n", f);
        return;
    }
    fprintf(f, "  predicted / measured - 1 over %d job(s): min %+.3f  p10 %+.3f  median %+.3f  "
               "p90 %+.3f  max %+.3f  (%d under-predicted)\n", n, dget(e, "min"), dget(e, "p10"),
            dget(e, "median"), dget(e, "p90"), dget(e, "max"), (int)dget(e, "under"));
}

static const char *gib_col(char *buf, size_t n, double v)
{
    if (v < 0)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.2f", v / 1073741824.0);
    return buf;
}

/* the last `top` jobs: what their records say */
static void text_jobs(FILE *f, const mm_loop *l, size_t top)
{
    char ub[32];
    size_t from = l->n_jobs > top ? l->n_jobs - top : 0;
    fprintf(f, "  %10s %-12s %-10s %-8s %-7s %12s %12s %12s\n", "job", "user", "decision", "record",
            "status", "host GiB", "device GiB", "predicted");
    for (size_t i = from; i < l->n_jobs; i++) {
        const job *j = &l->jobs[i];
        char u[13], d[11], g1[24], g2[24], g3[24];
        snprintf(u, sizeof u, "%.12s", job_user(j, ub, sizeof ub));
        snprintf(d, sizeof d, "%.10s", j->p_decision ? j->p_decision : "-");
        for (char *c = u; *c; c++)
            *c = (unsigned char)*c < 0x20 || *c == 0x7f ? '?' : *c;
        fprintf(f, "  %10.0f %-12s %-10s %-8.8s %-7.7s %12s %12s %12s\n", j->job_id, u, d,
                j->state ? j->state : "-", j->status ? j->status : "-", gib_col(g1, sizeof g1, j->host_rss),
                gib_col(g2, sizeof g2, j->dev_peak), gib_col(g3, sizeof g3, j->p_peak));
    }
}

void mm_loop_text(mm_loop *l, FILE *f, size_t top)
{
    static const char *const job_keys[] = { "job_id", "user", "model", "gpu", "predicted_peak_bytes",
                                            "measured_peak_bytes", "error", "oom_phase", NULL };
    static const char *const grp_keys[] = { "key", "jobs", "under", "worst_error", "median_error", NULL };
    static const char *const adv_keys[] = { "margin_percent", "accepted", "accepted_oom",
                                            "rejected_would_fit", NULL };
    static const char *const seq_keys[] = { "model", "jobs", "max_seq_len_seen", "spec_seq_len", NULL };
    json_object *o = mm_loop_json(l, top), *x, *e;
    if (!o)
        return;
    json_object_object_get_ex(o, "records", &x);
    json_object_object_get_ex(o, "error", &e);
    fprintf(f, "\nOutcomes: %zu job(s) from %zu line(s); records %s\n", l->n_jobs, l->n_lines,
            json_object_to_json_string_ext(x, JSON_C_TO_STRING_PLAIN));
    text_error(f, e);
    text_jobs(f, l, top);
    json_object_object_get_ex(o, "under_predictions", &x);
    text_rows(f, "Under-predictions (worst first)", x, job_keys);
    json_object_object_get_ex(o, "by_model", &x);
    text_rows(f, "By model", x, grp_keys);
    json_object_object_get_ex(o, "by_gpu", &x);
    text_rows(f, "By GPU type", x, grp_keys);
    json_object_object_get_ex(o, "ooms_let_through", &x);
    text_rows(f, "OOMs let through", x, job_keys);
    json_object_object_get_ex(o, "sequences", &x);
    text_rows(f, "Longest sequences seen vs the spec", x, seq_keys);
    json_object_object_get_ex(o, "margin_advice", &x);
    json_object_object_get_ex(x, "candidates", &e);
    text_rows(f, "Margin advice (percent of the card)", e, adv_keys);
    json_object_put(o);
}
