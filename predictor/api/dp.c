/* dp.c - the per-GPU peak as a function of the data-parallel degree N.
 *
 * peak(N) = dev(allocated(N), reserved(N)) + paged(N): allocated(N) has a
 * closed form - the sim's live bytes at every event are fixed + (N > 1 ?
 * multi : 0) + ceil(sharded / N), so the maximum over the step is the maximum
 * over the pareto points (fixed + multi, sharded) the sim collects, exactly,
 * for every N >= 2 (dp_envelope keeps every point that is the maximum at some
 * N).  reserved(N), the caching allocator's, has none: it is not even
 * monotone in N (blocks of one size land in segments cached for another), so
 * it is replayed at each N it is wanted for.  One simulated step serves every
 * N: the sim's allocations and frees come in the same order at any N, only
 * sharded sizes (/ N) and DDP buckets (N > 1) change, and reserve_replay takes
 * the sizes at the N it replays.  A prediction records the degrees it
 * replayed (dp_points); without a sharded tensor the replay is the same for
 * every N >= 2, so one replay covers them all. */
#include "dp.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int step_run_spec(const mm_spec *sp, const resolved_model *rm, sim *s, const step_cfg *cfg,
                  mm_error *err)
{
    if (rm)
        return step_run(rm, s, cfg, err);
    resolved_model own;
    if (resolve_model(sp, &own, err)) {
        memset(s, 0, sizeof *s);
        return -1;
    }
    int rc = step_run(&own, s, cfg, err);
    resolved_free(&own);
    return rc;
}

#define DP_CHECK_N 4096u /* degrees checked one by one in dp_envelope */

static uint64_t term_at(const mm_dp_term *t, uint64_t n)
{
    return mm_sat_add(t->fixed, mm_ceil_div(t->sharded, n));
}

/* Mark, in need[], every point that is the (first) maximum at some N in
 * [2, DP_CHECK_N], and for N beyond it the points that could still be: the
 * largest fixed part, and any whose fixed + ceil(sharded / (DP_CHECK_N + 1))
 * exceeds it (F + ceil(S / N) only falls with N).  For many points. */
static void mark_winners(const mm_dp_term *in, size_t n, unsigned char *need)
{
    for (uint64_t N = 2; N <= DP_CHECK_N; N++) {
        size_t best = 0;
        uint64_t bv = term_at(&in[0], N);
        for (size_t i = 1; i < n; i++) {
            uint64_t v = term_at(&in[i], N);
            if (v > bv) {
                bv = v;
                best = i;
            }
        }
        need[best] = 1;
    }
    size_t top = 0;
    for (size_t i = 1; i < n; i++)
        if (in[i].fixed > in[top].fixed ||
            (in[i].fixed == in[top].fixed && in[i].sharded > in[top].sharded))
            top = i;
    need[top] = 1;
    for (size_t i = 0; i < n; i++)
        if (term_at(&in[i], DP_CHECK_N + 1) > in[top].fixed)
            need[i] = 1;
}

/* the highest line F + S x other than k at x */
static double others_at(const mm_dp_term *in, size_t n, size_t k, double x)
{
    double m = -1;
    for (size_t j = 0; j < n; j++)
        if (j != k && (double)in[j].fixed + (double)in[j].sharded * x > m)
            m = (double)in[j].fixed + (double)in[j].sharded * x;
    return m;
}

/* Mark every point that can be the maximum at some N >= 2, without a
 * division per N: F + ceil(S / N) lies less than a byte above the line
 * F + S x at x = 1 / N, so a point whose line stays 2 bytes (1 + room for
 * rounding) below the highest other line everywhere on x in [0, 1/2] never
 * is.  Its line minus the upper envelope of the others is concave in x, so
 * it suffices to look at 0, 1/2 and where two other lines cross.  A superset
 * of the winners: the envelope stays exact.  For a few points whose bytes a
 * double holds to the byte (below 2^52). */
static void mark_needed(const mm_dp_term *in, size_t n, unsigned char *need)
{
    double xs[2 + 16 * 15 / 2];
    int small = n <= 16;
    for (size_t i = 0; i < n && small; i++)
        small = in[i].fixed < (1ull << 52) && in[i].sharded < (1ull << 52);
    if (!small) {
        mark_winners(in, n, need);
        return;
    }
    for (size_t k = 0; k < n; k++) {
        size_t nx = 0;
        xs[nx++] = 0;
        xs[nx++] = 0.5;
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++) {
                if (i == k || j == k || in[i].sharded == in[j].sharded)
                    continue;
                double x = ((double)in[i].fixed - (double)in[j].fixed) /
                           ((double)in[j].sharded - (double)in[i].sharded);
                if (x > 0 && x < 0.5)
                    xs[nx++] = x;
            }
        for (size_t t = 0; t < nx && !need[k]; t++)
            need[k] = (double)in[k].fixed + (double)in[k].sharded * xs[t] + 2 >
                      others_at(in, n, k, xs[t]);
    }
}

/* merge the two points with the closest slopes into their maximum */
static void merge_closest(mm_dp_term *t, size_t *k)
{
    size_t bi = 0;
    uint64_t bd = UINT64_MAX;
    for (size_t i = 0; i + 1 < *k; i++) {
        uint64_t a = t[i].sharded, b = t[i + 1].sharded;
        uint64_t d = a > b ? a - b : b - a;
        if (d < bd) {
            bd = d;
            bi = i;
        }
    }
    if (t[bi + 1].fixed > t[bi].fixed)
        t[bi].fixed = t[bi + 1].fixed;
    if (t[bi + 1].sharded > t[bi].sharded)
        t[bi].sharded = t[bi + 1].sharded;
    memmove(&t[bi + 1], &t[bi + 2], (*k - bi - 2) * sizeof *t);
    (*k)--;
}

static int by_sharded(const void *a, const void *b)
{
    const mm_dp_term *x = a, *y = b;
    if (x->sharded != y->sharded)
        return x->sharded < y->sharded ? -1 : 1;
    return x->fixed < y->fixed ? 1 : x->fixed > y->fixed ? -1 : 0;
}

size_t dp_envelope(const mm_dp_term *in, size_t n, mm_dp_term *out, int *exact)
{
    *exact = 1;
    if (n <= 1) {
        if (n)
            out[0] = in[0];
        return n;
    }
    mm_dp_term *tmp = malloc(n * sizeof *tmp);
    unsigned char *need = calloc(n, 1);
    size_t k = 0;
    if (!tmp || !need) { /* keep the largest fixed and sharded parts: an upper bound */
        mm_dp_term m = in[0];
        for (size_t i = 1; i < n; i++) {
            m.fixed = in[i].fixed > m.fixed ? in[i].fixed : m.fixed;
            m.sharded = in[i].sharded > m.sharded ? in[i].sharded : m.sharded;
        }
        free(tmp);
        free(need);
        out[0] = m;
        *exact = n == 1;
        return 1;
    }
    mark_needed(in, n, need);
    for (size_t i = 0; i < n; i++)
        if (need[i])
            tmp[k++] = in[i];
    qsort(tmp, k, sizeof *tmp, by_sharded);
    if (k > MM_MAX_TERMS)
        *exact = 0;
    while (k > MM_MAX_TERMS)
        merge_closest(tmp, &k);
    memcpy(out, tmp, k * sizeof *out);
    free(tmp);
    free(need);
    return k;
}

static const mm_dp_point *point_for(const mm_prediction *p, uint32_t n);

uint64_t dp_allocated(const mm_prediction *p, uint32_t n)
{
    const mm_dp_point *pt = point_for(p, n ? n : 1);
    if (pt && pt->allocated)
        return pt->allocated;
    if (n <= 1)
        return p->allocated_dp1;
    uint64_t a = 0;
    for (size_t i = 0; i < p->n_terms; i++) {
        uint64_t v = term_at(&p->terms[i], n);
        if (v > a)
            a = v;
    }
    return a;
}

uint64_t dp_device_level(const mm_overheads *o, uint64_t alloc, uint64_t slack, uint32_t n)
{
    long double a = (long double)alloc * (1.0L + (long double)o->alloc_frac);
    uint64_t v = a >= 1.8e19L ? UINT64_MAX : (uint64_t)ceill(a);
    v = mm_sat_add(v, o->alloc_fixed);
    v = mm_sat_add(v, slack);
    v = mm_sat_add(v, o->cuda_context);
    if (n > 1)
        v = mm_sat_add(v, o->nccl);
    return v;
}

static const mm_dp_point *point_for(const mm_prediction *p, uint32_t n)
{
    for (size_t i = 0; i < p->n_dp_points; i++)
        if (p->dp_points[i].n_from <= n && n <= p->dp_points[i].n_to)
            return &p->dp_points[i];
    return NULL;
}

uint64_t mm_peak_for_dp(const mm_prediction *p, uint32_t n)
{
    n = n ? n : 1;
    const mm_dp_point *pt = point_for(p, n);
    if (!pt)
        return MM_PEAK_UNKNOWN;
    uint64_t a = dp_allocated(p, n);
    uint64_t slack = pt->reserved > a ? pt->reserved - a : 0;
    return mm_sat_add(dp_device_level(&p->overheads, a, slack, n), pt->paged);
}

/* join points i and i + 1 when they are neighbours with the same values */
static void join(mm_prediction *p, size_t i)
{
    mm_dp_point *x = &p->dp_points[i], *y = x + 1;
    if (i + 1 >= p->n_dp_points || x->n_to == UINT32_MAX || x->n_to + 1 != y->n_from ||
        x->reserved != y->reserved || x->paged != y->paged || x->allocated != y->allocated)
        return;
    x->n_to = y->n_to;
    memmove(y, y + 1, (p->n_dp_points - i - 2) * sizeof *y);
    p->n_dp_points--;
}

int dp_add_point(mm_prediction *p, uint32_t from, uint32_t to, uint64_t reserved,
                 uint64_t paged, uint64_t allocated)
{
    size_t at = 0;
    while (at < p->n_dp_points && p->dp_points[at].n_to < from)
        at++;
    if (at < p->n_dp_points && p->dp_points[at].n_from <= to)
        return 0; /* already covered (the same replay gave it) */
    mm_dp_point *v = realloc(p->dp_points, (p->n_dp_points + 1) * sizeof *v);
    if (!v)
        return -1;
    p->dp_points = v;
    memmove(&v[at + 1], &v[at], (p->n_dp_points - at) * sizeof *v);
    v[at] = (mm_dp_point){.n_from = from, .n_to = to, .reserved = reserved, .paged = paged,
                          .allocated = allocated};
    p->n_dp_points++;
    join(p, at);
    if (at)
        join(p, at - 1);
    return 0;
}

/* ---- the step log ------------------------------------------------------------------- */

uint64_t steplog_degree(const mm_spec *sp, uint64_t n, int own_n)
{
    if (dp_per_degree(sp))
        own_n = 1; /* its layout at n, not at another degree */
    return own_n ? (n ? n : 1) : n > 2 ? n : 2;
}

int steplog_run(const mm_spec *sp, const resolved_model *rm, const sim *rows_from,
                uint64_t largest, uint64_t n, int own_n, steplog *L, mm_error *err)
{
    memset(L, 0, sizeof *L);
    L->n_log = steplog_degree(sp, n, own_n);
    step_cfg cfg = {.rows_from = rows_from, .largest_param = largest, .dp = L->n_log,
                    .nofold = 1, .log = 1};
    mm_alloc_conf_default(&L->conf);
    if (sp->device.alloc_conf[0] && mm_alloc_conf_parse(&L->conf, sp->device.alloc_conf, err) < 0)
        return -1;
    if (step_run_spec(sp, rm, &L->s, &cfg, err)) {
        steplog_free(L);
        return -1;
    }
    /* sm90's default (CUBLAS_WORKSPACE_CONFIG :4096:8), the GPUs the defaults were
     * measured on; device.cublas_workspace for others (reserve.c cublas_workspaces) */
    L->s.cublas_workspace = sp->device.has_cublas ? sp->device.cublas_workspace
                                                 : 32ull * 1024 * 1024;
    optimizer_kind o = sp->training.optimizer;
    L->per_param = sp->training.zero_stage == 0;
    L->pairs = o == OPT_ADAMW || o == OPT_ADAM || o == OPT_ADAMW_8BIT;
    L->per_degree = dp_per_degree(sp);
    L->n_dependent = L->per_degree;
    for (size_t i = 0; i < L->s.nev && !L->n_dependent; i++)
        L->n_dependent = L->s.t[L->s.ev[i].id].sharded == SIM_SHARDED;
    if (L->s.outside_bytes && spec_parallel(sp) != PAR_DDP)
        L->n_dependent = 1; /* paged states divided by N */
    return 0;
}

int steplog_replay(const steplog *L, uint64_t n, reserve_result *r, mm_error *err)
{
    if (reserve_replay(&L->s, n, &L->conf, L->per_param, L->pairs, r)) {
        mm_err(err, "out of memory");
        return -1;
    }
    return 0;
}

int steplog_reserved(const steplog *L, uint64_t n, uint64_t *reserved, mm_error *err)
{
    reserve_result r;
    if (steplog_replay(L, n, &r, err))
        return -1;
    *reserved = r.reserved_peak;
    return 0;
}

void steplog_free(steplog *L)
{
    sim_free(&L->s);
}

int dp_paged_at(const mm_spec *sp, const resolved_model *rm, const sim *rows_from,
                uint64_t largest, uint64_t n, uint64_t *paged, mm_error *err)
{
    sim s;
    step_cfg cfg = {.rows_from = rows_from, .largest_param = largest, .dp = n, .snap_at = 1};
    int rc = step_run_spec(sp, rm, &s, &cfg, err);
    *paged = s.outside_bytes;
    sim_free(&s);
    return rc;
}

/* ---- more degrees for a prediction ------------------------------------------------------ */

int dp_covered(const mm_prediction *p, uint32_t n)
{
    return point_for(p, n) != NULL;
}

int dp_per_degree(const mm_spec *sp)
{
    return spec_parallel(sp) != PAR_DDP;
}

/* a degree of a per-degree spec: the step simulated at n itself, once: its
 * log's run has the allocated peak a prediction at n finds (folding the
 * layers is exact, tests/unit/test_predict.c folding_is_exact) */
static int cover_direct(const mm_spec *sp, const resolved_model *rm, mm_prediction *p,
                        uint32_t n, mm_error *err)
{
    steplog L;
    uint64_t res;
    if (steplog_run(sp, rm, NULL, 0, n, 1, &L, err))
        return -1;
    int rc = steplog_reserved(&L, n, &res, err);
    uint64_t alloc = L.s.peak ? L.s.peak : 1, paged = L.s.outside_bytes;
    steplog_free(&L);
    if (!rc && dp_add_point(p, n, n, res, paged, alloc)) {
        mm_err(err, "out of memory");
        rc = -1;
    }
    return rc;
}

int dp_cover_at(const mm_spec *sp, const resolved_model *rm, const steplog *L, mm_prediction *p,
                uint32_t n, mm_error *err)
{
    if (L->per_degree)
        return cover_direct(sp, rm, p, n, err);
    uint64_t res, paged = L->s.outside_bytes;
    if (steplog_reserved(L, n, &res, err))
        return -1;
    if (L->n_dependent && L->s.outside_bytes &&
        dp_paged_at(sp, rm, &L->s, L->s.largest_param, n, &paged, err))
        return -1;
    int rc = n >= 2 && !L->n_dependent ? dp_add_point(p, 2, UINT32_MAX, res, paged, 0)
                                       : dp_add_point(p, n, n, res, paged, 0);
    if (rc)
        mm_err(err, "out of memory");
    return rc;
}

int mm_dp_cover(const mm_spec *sp, mm_prediction *p, const uint32_t *ns, size_t k, mm_error *err)
{
    size_t todo = 0;
    for (size_t i = 0; i < k; i++)
        todo += ns[i] >= 1 && !dp_covered(p, ns[i]);
    resolved_model rm; /* one for every degree: N is the step's (step_cfg.dp), not rm's */
    if (!todo)
        return 0;
    if (resolve_model(sp, &rm, err))
        return -1;
    int rc = 0;
    if (dp_per_degree(sp)) {
        for (size_t i = 0; i < k && !rc; i++)
            if (ns[i] >= 1 && !dp_covered(p, ns[i]))
                rc = cover_direct(sp, &rm, p, ns[i], err);
        resolved_free(&rm);
        return rc;
    }
    steplog L;
    if (steplog_run(sp, &rm, NULL, 0, sp->training.data_parallel, 0, &L, err)) {
        resolved_free(&rm);
        return -1;
    }
    for (size_t i = 0; i < k && !rc; i++)
        if (ns[i] >= 1 && !dp_covered(p, ns[i]))
            rc = dp_cover_at(sp, &rm, &L, p, ns[i], err);
    steplog_free(&L);
    resolved_free(&rm);
    return rc;
}
