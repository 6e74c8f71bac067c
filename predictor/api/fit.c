/* fit.c - "what would fit" on a card: the largest micro-batch, and whether
 * gradient checkpointing, expandable segments, a ZeRO stage or more GPUs make
 * the job run.  API layer: uses the spec, the allocated peak (predict.h) and
 * the capacity-aware verdict (verdict.h).
 *
 * Every answer is the capacity-aware verdict (verdict.c: the caching
 * allocator replayed at the capacity the card leaves it, freeing its cache
 * and retrying before it gives up, as DeviceCachingAllocator::malloc does) of
 * the very configuration it names - the same verdict `mmguard check` gives -,
 * never the uncapped peak against the usable bytes: a job whose uncapped
 * reserved peak exceeds the card usually still runs, with cache flushes.
 *
 * What keeps it cheap: one decoded copy of the spec, changed in place; the
 * live tensors (the allocated peak, a folded simulation without a replay)
 * bound every search from above - a configuration whose live bytes exceed
 * the allocator's capacity runs out of memory, judged without a replay.  The
 * micro-batch search starts from the spec's own verdict (the plugin's, passed
 * in), guesses the answer from its allocator cache (as it is, and grown
 * with the activations) and one more sample of the live bytes, and judges
 * the guess and its neighbour: two verdicts when the guess is right (the
 * LLaVA-1.5-7B preset on 8 H100s: 13.2 M instructions, 23.6 M before the
 * search shared one counting pass and the replay and steps got cheaper,
 * 58.9 M with the former secant search on the live bytes and bisection of
 * verdicts; docs/plugin.md, "Cost").  The micro-batch changes no parameter: the
 * search's first step (its sample of the live bytes) counts the rows and
 * parameters for all its later ones (fitctx.rows, step.h rows_from), and
 * mm_fit takes the verdict at the answer from the search.  Under
 * flush=reject only "fits without a flush" is asked, which the uncapped
 * replay stopped at the capacity answers (verdict_fits_clean).  The verdict
 * is not monotone in the micro-batch everywhere (fragmentation: llama-3.1-8b
 * at 80 GiB fits at 21 and 24, not at 22, 23 or 25); the answer is one that
 * fits while one more does not, as any search finds it, and which of several
 * such depends on where the search starts (tests/fit/fit_search.c). */
#include "dp.h"
#include "predict.h"
#include "util.h"
#include "verdict.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MM_MB_CAP 65536u

/* the verdict of the largest micro-batch a search found fitting so far */
typedef struct fit_best {
    uint64_t mb;      /* 0: none judged in full (judge) yet */
    mm_verdict v;
} fit_best;

typedef struct fitctx {
    mm_spec *s;       /* the working copy, changed in place */
    uint64_t gpu, usable;
    int no_flush;     /* a cache flush does not count as fitting (flush=reject) */
    fit_best *best;   /* where passes() keeps its fitting verdicts, or NULL */
    struct fit_rows *rows; /* within one micro-batch search, or NULL */
    resolved_model *rm; /* c->s resolved, within one search (where only the micro-batch
                           or N changes), or NULL: each verdict resolves its own */
} fitctx;

/* the micro-batch of the working copy, and of its resolved model (the one value of
 * it a micro-batch changes: resolve.h) */
static void set_mb(const fitctx *c, uint64_t x)
{
    c->s->training.micro_batch_size = x;
    if (c->rm)
        resolved_set_micro_batch(c->rm, x);
}

/* the first step a micro-batch search simulated (have: one is kept), whose
 * rows and parameter counts every later step borrows (step.h rows_from) */
typedef struct fit_rows {
    int have;
    sim s;
} fit_rows;

/* c resolved once for a search (where only the micro-batch or N changes;
 * without memory c->rm stays NULL and each verdict resolves its own), and
 * released */
static void search_resolve(fitctx *c, resolved_model *rm)
{
    mm_error e;
    c->rm = resolve_model(c->s, rm, &e) ? NULL : rm;
}

static void search_release(fitctx *c)
{
    if (c->rm)
        resolved_free(c->rm);
    c->rm = NULL;
}

/* the search's rows, when it has them */
static const sim *rows_of(const fitctx *c)
{
    return c->rows && c->rows->have ? &c->rows->s : NULL;
}

static int acceptable(const fitctx *c, mm_verdict_kind k)
{
    return k == MM_VERDICT_FITS || (k == MM_VERDICT_FLUSHES && !c->no_flush);
}

/* The verdict of c->s as it stands; whether it fits.  A configuration the
 * model refuses (sizes that overflow) never fits. */
static int judge(const fitctx *c, mm_verdict *v)
{
    mm_error e;
    if (verdict_quick(c->s, c->rm, c->gpu, c->usable, rows_of(c), v, &e)) {
        memset(v, 0, sizeof *v);
        v->kind = MM_VERDICT_OOM;
        snprintf(v->oom_event, sizeof v->oom_event, "%.150s", e.msg);
    }
    return acceptable(c, v->kind);
}

static void summarize(const mm_verdict *v, mm_fit_judged *out)
{
    out->judged = 1;
    out->kind = v->kind;
    out->retries_step = v->retries_step;
    out->retries = v->retries;
    out->live_bytes = v->allocated_peak;
    out->peak_bytes =
        v->kind == MM_VERDICT_OOM ? 0 : mm_sat_add(v->reserved_peak, v->context_bytes);
}

/* Live bytes of c->s at micro-batch x on the card: the allocated peak plus
 * what is outside the allocator (CUDA context, NCCL); UINT64_MAX when the
 * model refuses the size.  Above the usable bytes it runs out of memory. */
static uint64_t probe_live(const fitctx *c, uint64_t x)
{
    sim s;
    mm_error e;
    const sim *rows = rows_of(c);
    set_mb(c, x);
    /* the folded step, as mm_predict_peak's lower bound takes it */
    step_cfg cfg = {.dp = c->s->training.data_parallel, .rows_from = rows,
                    .largest_param = rows ? rows->largest_param : 0};
    if (step_run_spec(c->s, c->rm, &s, &cfg, &e)) {
        sim_free(&s);
        return UINT64_MAX;
    }
    uint64_t a = s.peak;
    if (c->rows && !rows) { /* the search's rows from now on */
        c->rows->s = s;
        c->rows->have = 1;
    } else {
        sim_free(&s);
    }
    mm_overheads o = predict_overheads(c->s);
    return mm_sat_add(a, verdict_outside(&o, a, mm_spec_data_parallel(c->s)));
}

/* Whether c->s at micro-batch x fits, as judge() says.  Under no_flush only
 * FITS counts, which the early-stopped uncapped replay decides
 * (verdict_fits_clean): a model that refuses the size never fits. */
static int passes(const fitctx *c, uint64_t x)
{
    mm_verdict v;
    mm_error e;
    set_mb(c, x);
    if (c->no_flush)
        return verdict_fits_clean_rows(c->s, c->rm, c->gpu, c->usable, rows_of(c), &e) == 1;
    int ok = judge(c, &v);
    if (ok && c->best && x > c->best->mb) { /* the search's answer: mm_fit's verdict at it */
        c->best->mb = x;
        c->best->v = v;
    }
    return ok;
}

/* The search's bracket: lo fits (0: none known), hi does not (0: none known,
 * then MM_MB_CAP is the ceiling). */
typedef struct span {
    uint64_t lo, hi;
} span;

static void judge_at(const fitctx *c, span *b, uint64_t x)
{
    if (passes(c, x))
        b->lo = x;
    else
        b->hi = x;
}

/* Largest x in the span that fits and whose successor does not, from two
 * guesses g[0] >= g[1] (0: none): g[0], then its neighbour above, then steps
 * doubling upwards until one fails; when g[0] fails, the one below it, then
 * g[1], and when that fails too (or there is none) steps doubling
 * downwards; then a bisection of what is left.  Where the
 * verdict is monotone in the micro-batch the answer is the one any bisection
 * finds; from a right guess it costs two verdicts (tests/fit/fit_search.c). */
static uint32_t search_from(const fitctx *c, span *b, const uint64_t g[2])
{
#define TOP (b->hi ? b->hi : (uint64_t)MM_MB_CAP + 1)
    uint64_t x = g[0];
    if (x > b->lo && x < TOP) {
        judge_at(c, b, x);
        for (uint64_t step = 1; b->lo == x && x + step < TOP; step *= 2) { /* upwards */
            judge_at(c, b, x + step);
            x = b->lo;
        }
        if (b->hi == x && x - 1 > b->lo) { /* the one below, then g[1] */
            judge_at(c, b, --x);
            if (b->hi == x && g[1] > b->lo && g[1] < x) {
                judge_at(c, b, g[1]);
                x = b->hi == g[1] ? g[1] : 0; /* it fits: the answer is between them */
            }
        }
        for (uint64_t step = 1; x && b->hi == x && x > b->lo + step; step *= 2) { /* downwards */
            judge_at(c, b, x - step);
            x = b->hi;
        }
    }
    if (!b->hi && b->lo < MM_MB_CAP) /* nothing above fails yet: the ceiling */
        judge_at(c, b, MM_MB_CAP);
    while (TOP > b->lo + 1)
        judge_at(c, b, b->lo + (TOP - b->lo) / 2);
#undef TOP
    return (uint32_t)b->lo;
}

/* Where the answer probably is, from the verdict v0 at x0 (fits: its
 * allocator cache, the uncapped reserved peak less the live bytes) and the
 * live bytes at x0 and x1 (they grow with the micro-batch, nearly linearly:
 * activations do, model states do not): g[0] the largest x whose live bytes
 * plus that cache fit the usable bytes, g[1] the same with the cache grown
 * as the live bytes' part that grows with x (the cache holds freed
 * activation blocks; the answer lies between the two on the presets).
 * Without a cache known (v0 does not fit) the largest whose live bytes fit.
 * Only guesses: every answer is judged.  0 when there is nothing to go on. */
static void guess(const fitctx *c, const mm_verdict *v0, uint64_t x0, uint64_t live0, uint64_t x1,
                  uint64_t live1, uint64_t g[2])
{
    g[0] = g[1] = 0;
    if (!live0 || live1 == UINT64_MAX || x1 == x0 ||
        (x1 > x0 ? live1 <= live0 : live1 >= live0))
        return;
    double slope = ((double)live1 - (double)live0) / ((double)x1 - (double)x0);
    double cache = 0, usable = (double)c->usable;
    if (v0->kind == MM_VERDICT_FITS && v0->reserved_uncapped > v0->allocated_peak)
        cache = (double)(v0->reserved_uncapped - v0->allocated_peak);
    double fixed = (double)live0 - slope * (double)x0; /* the line's value at 0 */
    double x[2] = {(double)x0 + (usable - cache - (double)live0) / slope,
                   (usable - fixed) / (slope + cache / (double)x0)};
    for (int i = 0; i < 2; i++)
        g[i] = x[i] >= (double)MM_MB_CAP ? MM_MB_CAP : x[i] >= 1 ? (uint64_t)x[i] : 1;
}

/* The largest micro-batch that fits, from the micro-batch c->s has (at_spec:
 * its verdict, found here when NULL): the spec's verdict, one sample of the
 * live bytes (a folded simulation, no replay), then verdicts from the guess
 * (search_from). */
static uint32_t search_max_batch(const fitctx *c, const mm_verdict *at_spec)
{
    uint64_t mb = c->s->training.micro_batch_size;
    uint64_t x0 = mb < 1 ? 1 : mb > MM_MB_CAP ? MM_MB_CAP : mb;
    mm_verdict own;
    span b = {0, 0};
    set_mb(c, x0);
    if (!at_spec || x0 != mb) {
        judge(c, &own);
        at_spec = &own;
    }
    if (acceptable(c, at_spec->kind))
        b.lo = x0;
    else
        b.hi = x0;
    /* a second sample of the live bytes, for their slope: twice x0 upwards
     * (half downwards); one whose live bytes exceed the card is out of
     * memory without a replay */
    uint64_t live0 = at_spec->allocated_peak ? mm_sat_add(at_spec->allocated_peak,
                                                          at_spec->context_bytes) : 0;
    uint64_t x1 = b.lo ? (x0 * 2 > MM_MB_CAP ? MM_MB_CAP : x0 * 2) : x0 / 2;
    uint64_t live1 = x1 && x1 != x0 ? probe_live(c, x1) : UINT64_MAX;
    if (x1 > x0 && live1 > c->usable)
        b.hi = x1;
    uint64_t g[2];
    guess(c, at_spec, x0, live0, x1, live1, g);
    if (!g[0])
        g[0] = x0;
    uint32_t r = search_from(c, &b, g);
    set_mb(c, mb);
    return r;
}

/* search_max_batch with the search's rows: the micro-batch changes no
 * parameter, so the first step it simulates (the sample of the live bytes)
 * counts the rows and parameters for every later one */
static uint32_t max_batch(const fitctx *c, const mm_verdict *at_spec)
{
    fit_rows rows;
    rows.have = 0; /* the sim only once a step fills it */
    fitctx in = *c;
    in.rows = &rows;
    resolved_model rm; /* once for the search: set_mb changes its micro-batch */
    search_resolve(&in, &rm);
    uint32_t r = search_max_batch(&in, at_spec);
    search_release(&in);
    if (rows.have)
        sim_free(&rows.s);
    return r;
}

/* mm_max_micro_batch, keeping in *best (or not, NULL) the verdict of the
 * largest micro-batch it judged fitting in full.  Not inlined: it is what
 * bench/instructions.sh counts as the plugin's search, in `mmguard fit` too. */
static __attribute__((noinline)) uint32_t fit_max_micro_batch(const mm_spec *spec,
                                                              uint64_t gpu_bytes, uint64_t usable,
                                                              int no_flush,
                                                              const mm_verdict *at_spec,
                                                              fit_best *best)
{
    fitctx c = {mm_spec_copy_decoded(spec), gpu_bytes, usable, no_flush, best, NULL, NULL};
    if (!c.s)
        return 0;
    uint32_t mb = max_batch(&c, at_spec);
    mm_spec_free(c.s);
    return mb;
}

uint32_t mm_max_micro_batch(const mm_spec *spec, uint64_t gpu_bytes, uint64_t usable,
                            int no_flush, const mm_verdict *at_spec)
{
    return fit_max_micro_batch(spec, gpu_bytes, usable, no_flush, at_spec, NULL);
}

/* the largest micro-batch without a flush, below the largest that runs
 * (max, its verdict at_max): max + 1 runs out of memory */
static uint32_t max_batch_no_flush(const fitctx *c, uint32_t max, const mm_verdict *at_max,
                                   const mm_verdict *at_spec, mm_verdict *out)
{
    fitctx nf = *c;
    uint64_t mb = c->s->training.micro_batch_size;
    nf.no_flush = 1;
    memset(out, 0, sizeof *out);
    if (!max)
        return 0;
    if (at_max->kind == MM_VERDICT_FITS) {
        *out = *at_max;
        return max;
    }
    span b = {0, max}; /* max itself needs a flush */
    if (at_spec->kind == MM_VERDICT_FITS && mb < max)
        b.lo = mb;
    else if (mb < max)
        b.hi = mb;
    const uint64_t g[2] = {b.hi - 1, 0};
    resolved_model rm; /* once for the search: set_mb changes its micro-batch */
    search_resolve(&nf, &rm);
    uint32_t r = search_from(&nf, &b, g);
    search_release(&nf);
    if (r) { /* its verdict, in full */
        set_mb(c, r);
        judge(c, out);
    }
    set_mb(c, mb);
    return r;
}

/* the allocated peak at n from the allocated figures q of c->s at N = 2: at
 * N = 2 itself a spec laid out per degree has its own (the dp point a full
 * prediction records, predict.c reserved_peak), elsewhere the dp terms */
static uint64_t allocated_at(const fitctx *c, const mm_prediction *q, uint32_t n)
{
    if (n == 2 && dp_per_degree(c->s) && q->allocated_peak_bytes)
        return q->allocated_peak_bytes;
    return dp_allocated(q, n);
}

/* Smallest N (1..1024) at which c->s fits, by its verdict at N; *at: that
 * verdict.  One folded run at N = 2 gives the allocated peak at every N (its
 * dp terms, when exact; mm_predict_allocated, no replay): an N whose live
 * tensors exceed the card is skipped without a replay.  0 if none. */
static uint32_t first_fitting_dp(const fitctx *c0, mm_verdict *at)
{
    mm_prediction q;
    mm_error e;
    uint32_t found = 0;
    fit_rows rows = {.have = 0};
    fitctx in = *c0; /* N changes no parameter: every verdict borrows that run's rows */
    const fitctx *c = &in;
    in.rows = &rows;
    resolved_model rm; /* N is the step's (step_cfg.dp), not the resolved model's */
    search_resolve(&in, &rm);
    c->s->training.data_parallel = 2;
    int have_q = mm_predict_allocated(c->s, &q, &rows.s, &e) == 0;
    rows.have = have_q;
    mm_overheads o = predict_overheads(c->s);
    for (uint32_t n = 1; n <= 1024 && !found; n++) {
        if (have_q && q.terms_exact) {
            uint64_t a = allocated_at(c, &q, n);
            if (mm_sat_add(a, verdict_outside(&o, a, n)) > c->usable)
                continue;
        }
        c->s->training.data_parallel = n;
        if (judge(c, at))
            found = n;
    }
    if (have_q) {
        mm_prediction_free(&q);
        sim_free(&rows.s);
    }
    search_release(&in);
    return found;
}

/* DeepSpeed (and the spec's own mixed precision) keeps fp32 master weights */
static void set_zero(mm_spec *s, const mm_spec *spec, int z)
{
    s->training.zero_stage = z;
    s->training.master_weights =
        (z >= 1 || spec->training.zero_stage >= 1) && s->training.precision != PREC_FP32
            ? MASTER_FP32
            : spec->training.master_weights;
    spec_derive(s);
}

/* Smallest N at which c->s fits with a ZeRO stage from `from` up (only `from`
 * when only_from); its stage in *stage, 0 if none. */
static uint32_t smallest_dp(const fitctx *c, const mm_spec *spec, int from, int only_from,
                            int *stage, mm_verdict *at)
{
    for (int z = from; z <= 3; z++) {
        set_zero(c->s, spec, z);
        uint32_t n = first_fitting_dp(c, at);
        if (n) {
            *stage = z;
            return n;
        }
        if (only_from)
            break; /* only the spec's own stage when it already uses ZeRO */
    }
    return 0;
}

/* the smallest ZeRO stage that fits at the spec's N, -1 none */
static int smallest_zero(const fitctx *c, const mm_spec *spec, mm_verdict *at)
{
    for (int z = 0; z <= 3; z++) {
        set_zero(c->s, spec, z);
        if (judge(c, at))
            return z;
    }
    return -1;
}

/* back to the spec as given */
static void reset(const fitctx *c, const mm_spec *spec)
{
    *c->s = *spec;
    c->s->doc = NULL;
}

/* With checkpointing on (the spec has it off): its verdict at the spec's
 * micro-batch and the largest micro-batch then. */
static void with_checkpointing(const fitctx *c, const mm_spec *spec, mm_fit_result *out)
{
    mm_verdict v;
    c->s->training.ckpt.enabled = 1;
    judge(c, &v);
    summarize(&v, &out->ckpt);
    out->max_micro_batch_ckpt = max_batch(c, &v);
    out->checkpointing_helps = !out->fits && acceptable(c, v.kind);
    reset(c, spec);
}

/* With PYTORCH_CUDA_ALLOC_CONF expandable_segments:True added to the job's
 * (when it does not use them): the same model, its pages unmapped instead of
 * segments freed when the cache is flushed. */
static void with_expandable(const fitctx *c, const mm_spec *spec, mm_fit_result *out)
{
    mm_verdict v;
    char *conf = c->s->device.alloc_conf;
    size_t used = strlen(conf);
    /* not with max_split_size_mb: the allocator model's capped replay of that
     * pair does not finish (release_available on expandable blocks; left to
     * the engine), and a suggestion must not hang fit or the plugin */
    if (strstr(conf, "expandable_segments:True") || strstr(conf, "max_split_size_mb") ||
        used + sizeof ",expandable_segments:True" > sizeof c->s->device.alloc_conf)
        return;
    snprintf(conf + used, sizeof c->s->device.alloc_conf - used, "%sexpandable_segments:True",
             used ? "," : "");
    judge(c, &v);
    summarize(&v, &out->expandable);
    out->expandable_helps = !out->fits && acceptable(c, v.kind);
    out->max_micro_batch_expandable = max_batch(c, &v);
    reset(c, spec);
}

/* the smallest N at max(zero, 1), first with the spec's checkpointing; if no
 * N fits and it was off, with it on: ZeRO shards model states, never
 * activations */
static void more_gpus(const fitctx *c, const mm_spec *spec, mm_fit_result *out)
{
    mm_verdict at;
    int from = spec->training.zero_stage >= 1 ? spec->training.zero_stage : 1;
    int only_from = spec->training.zero_stage >= 1;
    int stage = -1;
    if (spec->fsdp.version) { /* FSDP shards by itself; ZeRO would exclude it */
        from = spec->training.zero_stage;
        only_from = 1;
        out->min_data_parallel_fsdp = spec->fsdp.version;
    }
    uint32_t n = smallest_dp(c, spec, from, only_from, &stage, &at);
    if (!n && !spec->training.ckpt.enabled) {
        c->s->training.ckpt.enabled = 1;
        n = smallest_dp(c, spec, from, only_from, &stage, &at);
        out->min_data_parallel_ckpt = n != 0;
    }
    out->min_data_parallel = n;
    out->min_data_parallel_zero = n ? stage : -1;
    if (n)
        summarize(&at, &out->dp);
    reset(c, spec);
}

int mm_fit(const mm_spec *spec, uint64_t gpu_bytes, uint64_t usable, int no_flush,
           mm_fit_result *out, mm_error *err)
{
    mm_verdict at, at_nf;
    memset(out, 0, sizeof *out);
    if (mm_verdict_for(spec, gpu_bytes, usable, 0, &out->verdict, err))
        return -1;
    fit_best best = {0};
    fitctx c = {mm_spec_copy_decoded(spec), gpu_bytes, usable, no_flush, NULL, NULL, NULL};
    if (!c.s) {
        mm_err(err, "out of memory");
        return -1;
    }
    const mm_verdict *v = &out->verdict;
    out->fits = acceptable(&c, v->kind);
    out->peak_bytes = v->kind == MM_VERDICT_OOM ? 0 : mm_sat_add(v->reserved_peak,
                                                                 v->context_bytes);
    /* the plugin's own search (mm_max_micro_batch: what it publishes for an
     * accepted job is the same answer), then the verdict at the answer: the
     * one the search judged it by, when it judged it in full (passes) */
    out->max_micro_batch = fit_max_micro_batch(spec, gpu_bytes, usable, no_flush, v, &best);
    memset(&at, 0, sizeof at);
    set_mb(&c, out->max_micro_batch);
    if (out->max_micro_batch && best.mb == out->max_micro_batch)
        at = best.v;
    else if (out->max_micro_batch)
        judge(&c, &at);
    reset(&c, spec);
    if (out->max_micro_batch)
        summarize(&at, &out->at_max);
    out->max_micro_batch_no_flush = max_batch_no_flush(&c, out->max_micro_batch, &at, v, &at_nf);
    if (out->max_micro_batch_no_flush)
        summarize(&at_nf, &out->at_max_no_flush);
    if (!spec->training.ckpt.enabled)
        with_checkpointing(&c, spec, out);
    else
        out->max_micro_batch_ckpt = out->max_micro_batch;
    with_expandable(&c, spec, out);
    /* tensor parallel is modelled alone (spec_tp.c): no ZeRO stage, no data
     * parallel beside it to suggest */
    int tp = spec->training.tensor_parallel > 1;
    out->min_zero_stage = spec->fsdp.version || tp ? -1 : smallest_zero(&c, spec, &at);
    if (out->min_zero_stage >= 0)
        summarize(&at, &out->zero);
    reset(&c, spec);
    if (!tp)
        more_gpus(&c, spec, out);
    else
        out->min_data_parallel_zero = -1;
    mm_spec_free(c.s);
    return 0;
}

void mm_fit_judged_text(const mm_fit_judged *j, char *buf, size_t n)
{
    char pk[32], lv[32];
    mm_format_bytes(j->peak_bytes, pk, sizeof pk);
    mm_format_bytes(j->live_bytes, lv, sizeof lv);
    if (j->kind == MM_VERDICT_FITS)
        snprintf(buf, n, "fits, peak %s", pk);
    else if (j->kind == MM_VERDICT_FLUSHES && !j->retries_step)
        snprintf(buf, n, "fits with cache flushes (cudaMalloc retries in the first step only), "
                 "peak %s", pk);
    else if (j->kind == MM_VERDICT_FLUSHES)
        snprintf(buf, n, "fits with cache flushes (%" PRIu64 " cudaMalloc retr%s per step: "
                 "slower), peak %s", j->retries_step, j->retries_step == 1 ? "y" : "ies", pk);
    else
        snprintf(buf, n, "out of memory (live tensors %s)", lv);
}
