/* predict.c - one steady-state training step, end to end: model states
 * (parameters, optimizer states per precision and ZeRO stage), the forward,
 * backward and optimizer phases on the timeline engine, the data-parallel
 * envelope, the device-level overheads, and the JSON rendering.
 *
 * Device-level constants live here, in one place (overheads_default); the
 * context is measured on an H100, NCCL is not; a spec's `device:` block
 * overrides each of them. */
#include "predict.h"
#include "dp.h"
#include "tokens.h"
#include "util.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)

/* CUDA context + cuBLAS/cuDNN workspaces + kernel images: what nvidia-smi sees
 * beyond max_memory_reserved, 750.8-770.8 MiB over the 93 runs of
 * tests/gpu_data/h100-80gb.jsonl (H100, torch 2.11, CUDA 13; the largest kept,
 * contrib/calibrate/fit.py).  NCCL buffers for one data-parallel group with
 * default NCCL_BUFFSIZE and channels: not measured yet (one-GPU machine). */
static const mm_overheads overheads_default = {
    .cuda_context = 771 * MiB,
    .nccl = 1024 * MiB,
    .alloc_fixed = 0,   /* the allocator model (reserve.c) gives the slack */
    .alloc_frac = 0,
};

const char *mm_phase_name(mm_phase p)
{
    switch (p) {
    case MM_PHASE_FORWARD: return "forward";
    case MM_PHASE_BACKWARD: return "backward";
    case MM_PHASE_OPTIMIZER: return "optimizer";
    default: return "?";
    }
}

static void set_factor(mm_factors *f, const uint64_t *v)
{
    f->parameters = v[F_PARAM];
    f->gradients = v[F_GRAD];
    f->optimizer_states = v[F_OPT];
    f->activations = v[F_ACT];
    f->temporaries = v[F_TEMP];
}

/* the worst image, for users and the presets table */
static void image_info(const mm_spec *sp, mm_prediction *out)
{
    const module_spec *v = mm_spec_module(sp, MOD_VISION);
    uint64_t h, w;
    vis_tokens vt;
    mm_error e;
    if (!v || !sp->training.images_per_sample)
        return;
    tokens_worst_image(sp, v, &h, &w);
    if (tokens_per_image(sp, h, w, &vt, &e))
        return;
    out->image_height = (uint32_t)h;
    out->image_width = (uint32_t)w;
    out->image_tiles = vt.tiles;
    out->image_patches = vt.patches;
    out->image_tokens = vt.llm_tokens;
}

mm_overheads predict_overheads(const mm_spec *sp)
{
    mm_overheads o = overheads_default;
    if (sp->device.has_context)
        o.cuda_context = sp->device.cuda_context;
    if (sp->device.has_nccl)
        o.nccl = sp->device.nccl;
    if (sp->device.has_afix)
        o.alloc_fixed = sp->device.allocator_fixed;
    if (sp->device.has_afrac)
        o.alloc_frac = sp->device.allocator_fraction;
    return o;
}

/* What the first (symbolic) run leaves for the rest of a prediction. */
typedef struct run1 {
    sim rows;              /* its rows and parameter counts, for the later runs */
    uint64_t largest, host, outside;
} run1;

static void run1_free(run1 *r)
{
    free(r->rows.snap_row_fact);
    free(r->rows.rows);
    free(r->rows.layer_tp);
    free(r->rows.layer_p);
    free(r->rows.layer_gb);
    memset(r, 0, sizeof *r);
}

/* One run gives the spec's allocated peak, where it happens, the N = 1 peak,
 * the dp terms for N >= 2 and the breakdown at the peak (r->rows.snap_*). */
static int first_run(const mm_spec *sp, const resolved_model *rm, mm_prediction *out, run1 *r,
                     int nofold, mm_error *err)
{
    sim s;
    step_cfg cfg = {.dp = sp->training.data_parallel, .symbolic = 1, .nofold = nofold,
                    .track_peak = 1};
    memset(r, 0, sizeof *r);
    if (step_run(rm, &s, &cfg, err)) {
        sim_free(&s);
        return -1;
    }
    if (sim_peak_snapshot(&s)) {
        mm_err(err, s.oom ? "out of memory" : "internal error: peak snapshot missing");
        sim_free(&s);
        return -1;
    }
    memcpy(r->rows.snap_fact, s.snap_fact, sizeof r->rows.snap_fact);
    r->rows.snap_row_fact = s.snap_row_fact;
    r->rows.snap_nrows = s.snap_nrows;
    s.snap_row_fact = NULL;
    out->allocated_peak_bytes = s.peak;
    out->peak_phase = s.peak_phase;
    memcpy(out->phase_peak, s.phase_peak, sizeof out->phase_peak);
    const char *mod = s.peak_row < s.nrows ? sp->modules[s.rows[s.peak_row].module].name : "";
    const char *rowname = s.peak_row < s.nrows ? s.rows[s.peak_row].name : "";
    snprintf(out->peak_event, sizeof out->peak_event, "%s %s %s%s%s", mm_phase_name(s.peak_phase),
             mod, rowname, s.peak_label ? ": " : "", s.peak_label ? s.peak_label : "");
    out->allocated_dp1 = s.peak_dp1;
    out->n_terms = dp_envelope(s.terms, s.nterms, out->terms, &out->terms_exact);
    /* the later runs reuse the rows and parameter counts of this one */
    r->rows.rows = s.rows;
    r->rows.nrows = s.nrows;
    r->rows.layer_tp = s.layer_tp;
    r->rows.layer_p = s.layer_p;
    r->rows.layer_gb = s.layer_gb;
    r->rows.layer_stride = s.layer_stride;
    memcpy(r->rows.rcache, s.rcache, sizeof r->rows.rcache);
    s.rows = NULL;
    s.layer_tp = s.layer_p = s.layer_gb = NULL;
    s.nrows = s.caprows = 0;
    r->host = sim_add(&s, s.host_bytes, s.host_act_peak);
    r->outside = s.outside_bytes;
    r->largest = s.largest_param;
    sim_free(&s);
    return 0;
}

/* The reserved peak: the step's allocation log (every layer run) replayed
 * through the caching-allocator model with the job's PYTORCH_CUDA_ALLOC_CONF;
 * recorded as the dp point of the spec's N (of every N >= 2 when N does not
 * change the replay). */
static int reserved_peak(const mm_spec *sp, const resolved_model *rm, const run1 *r, int own_log,
                         mm_prediction *out, predict_keep *keep, mm_error *err)
{
    uint64_t N = sp->training.data_parallel;
    steplog L;
    reserve_result rr;
    if (steplog_run(sp, rm, &r->rows, r->largest, N, own_log, &L, err))
        return -1;
    int rc = steplog_replay(&L, N, &rr, err);
    uint64_t res = rc ? 0 : rr.reserved_peak;
    int all = !rc && N >= 2 && !L.n_dependent;
    if (keep && !rc) { /* the caller's verdict replays this log (verdict.c) */
        keep->L = L;
        keep->free_run = rr;
    } else {
        steplog_free(&L);
    }
    if (rc)
        return -1;
    if (dp_add_point(out, all ? 2 : (uint32_t)N, all ? UINT32_MAX : (uint32_t)N, res, r->outside,
                     dp_per_degree(sp) ? out->allocated_peak_bytes : 0)) {
        mm_err(err, "out of memory");
        return -1;
    }
    /* the model never reserves less than the sim's allocated peak */
    out->reserved_peak_bytes = res > out->allocated_peak_bytes ? res : out->allocated_peak_bytes;
    return 0;
}

/* modules and their layer rows, with the factors of the peak snapshot */
static int fill_modules(const mm_spec *sp, const sim *s, mm_prediction *out)
{
    out->modules = calloc(sp->n_modules, sizeof *out->modules);
    if (!out->modules)
        return -1;
    out->n_modules = sp->n_modules;
    for (size_t mi = 0; mi < sp->n_modules; mi++) {
        mm_module_result *M = &out->modules[mi];
        const module_spec *ms = &sp->modules[mi];
        mm_strlcpy(M->name, ms->name, sizeof M->name);
        static const char *const legacy[MOD_NKIND] = {"vit", "mlp", "llama"};
        static const char *const kinds[MOD_NKIND] = {"vision", "connector", "decoder"};
        mm_strlcpy(M->type, ms->legacy ? legacy[ms->kind] : kinds[ms->kind], sizeof M->type);
        size_t nl = 0;
        for (size_t r = 0; r < s->nrows; r++)
            if (s->rows[r].module == mi)
                nl++;
        M->layers = calloc(nl ? nl : 1, sizeof *M->layers);
        if (!M->layers)
            return -1;
        for (size_t r = 0; r < s->nrows; r++) {
            if (s->rows[r].module != mi)
                continue;
            mm_layer_result *L = &M->layers[M->n_layers++];
            const sim_row *R = &s->rows[r];
            mm_strlcpy(L->name, R->name, sizeof L->name);
            mm_strlcpy(L->kind, R->kind, sizeof L->kind);
            L->count = R->count ? R->count : 1;
            L->parameters_count = R->params;
            L->trainable_count = R->trainable;
            if (r < s->snap_nrows) /* rows made after the peak hold nothing at it */
                set_factor(&L->factors, &s->snap_row_fact[r * F_NFACT]);
            M->parameters_count += R->params;
            M->trainable_count += R->trainable;
            M->factors.parameters += L->factors.parameters;
            M->factors.gradients += L->factors.gradients;
            M->factors.optimizer_states += L->factors.optimizer_states;
            M->factors.activations += L->factors.activations;
            M->factors.temporaries += L->factors.temporaries;
        }
        out->parameters_count += M->parameters_count;
        out->trainable_count += M->trainable_count;
    }
    return 0;
}

/* the device-level figures at the spec's N */
static void device_figures(const mm_spec *sp, const run1 *r, mm_prediction *out)
{
    const training_spec *t = &sp->training;
    out->overheads = predict_overheads(sp);
    out->allocator_slack = out->reserved_peak_bytes - out->allocated_peak_bytes;
    out->paged_bytes = r->outside;
    out->host_peak_bytes = r->host;
    out->peak_bytes = mm_sat_add(dp_device_level(&out->overheads, out->allocated_peak_bytes,
                                                 out->allocator_slack,
                                                 (uint32_t)t->data_parallel),
                                 r->outside);
    mm_strlcpy(out->name, sp->name, sizeof out->name);
    out->data_parallel = (uint32_t)t->data_parallel;
    out->micro_batch_size = (uint32_t)t->micro_batch_size;
    out->seq_len = (uint32_t)t->seq_len;
    image_info(sp, out);
}

int mm_predict_allocated(const mm_spec *sp, mm_prediction *out, sim *rows, mm_error *err)
{
    run1 r;
    memset(out, 0, sizeof *out);
    if (err)
        err->msg[0] = '\0';
    resolved_model rm;
    if (resolve_model(sp, &rm, err))
        return -1;
    int rc = first_run(sp, &rm, out, &r, 0, err);
    resolved_free(&rm);
    if (!rc && rows) { /* the run's rows, parameter counts and tables, moved */
        free(r.rows.snap_row_fact);
        r.rows.snap_row_fact = NULL;
        r.rows.largest_param = r.largest;
        *rows = r.rows;
        memset(&r.rows, 0, sizeof r.rows);
    }
    run1_free(&r);
    return rc;
}

int mm_predict(const mm_spec *sp, mm_prediction *out, mm_error *err)
{
    return mm_predict_ex(sp, out, err, 0);
}

int mm_predict_ex(const mm_spec *sp, mm_prediction *out, mm_error *err, unsigned flags)
{
    return mm_predict_keep(sp, out, err, flags, NULL);
}

void predict_keep_free(predict_keep *k)
{
    steplog_free(&k->L);
    free(k->rows.rows);
    free(k->rows.layer_tp);
    free(k->rows.layer_p);
    free(k->rows.layer_gb);
    memset(k, 0, sizeof *k);
}

int mm_predict_keep(const mm_spec *sp, mm_prediction *out, mm_error *err, unsigned flags,
                    predict_keep *keep)
{
    if (keep)
        memset(keep, 0, sizeof *keep);
    int nofold = (flags & MM_PREDICT_NOFOLD) != 0;
    memset(out, 0, sizeof *out);
    if (err)
        err->msg[0] = '\0';
    run1 r;
    resolved_model rm; /* once for the prediction: its two steps read it */
    if (resolve_model(sp, &rm, err))
        return -1;
    int failed = first_run(sp, &rm, out, &r, nofold, err) ||
                 reserved_peak(sp, &rm, &r, (flags & MM_PREDICT_OWN_LOG) != 0, out, keep, err);
    resolved_free(&rm);
    if (failed) {
        run1_free(&r);
        if (keep)
            predict_keep_free(keep);
        mm_prediction_free(out);
        return -1;
    }
    /* the breakdown at the peak, from the first run */
    device_figures(sp, &r, out);
    const char *bound = mm_spec_bound(sp);
    snprintf(out->bound, sizeof out->bound, "%s", bound ? bound : "");
    set_factor(&out->factors, r.rows.snap_fact);
    out->factors.overhead = out->peak_bytes - out->allocated_peak_bytes;
    int rc = 0;
    if (fill_modules(sp, &r.rows, out)) {
        mm_err(err, "out of memory");
        rc = -1;
    }
    free(r.rows.snap_row_fact); /* the keep's rows are rows only */
    r.rows.snap_row_fact = NULL;
    if (keep && !rc) { /* the first run's rows, peak and paged bytes: the verdict's step */
        keep->rows = r.rows;
        keep->rows.peak = out->allocated_peak_bytes;
        keep->rows.outside_bytes = r.outside;
        keep->rows.largest_param = r.largest;
        memset(&r.rows, 0, sizeof r.rows);
    } else if (keep) {
        predict_keep_free(keep);
    }
    run1_free(&r);
    if (rc)
        mm_prediction_free(out);
    return rc;
}

/* the device-level peak of a step whose allocator reserved `res` at its peak */
static uint64_t peak_at(const mm_overheads *o, const sim *s, uint64_t res, uint32_t n)
{
    uint64_t slack = res > s->peak ? res - s->peak : 0;
    return mm_sat_add(dp_device_level(o, s->peak, slack, n), s->outside_bytes);
}

/* the largest reserved peak whose device-level peak fits `usable` (peak_at is
 * monotone in it; its lower bound, at s->peak, fits); UINT64_MAX: any */
static uint64_t reserved_bound(const mm_overheads *o, const sim *s, uint64_t usable, uint32_t n)
{
    uint64_t lo = s->peak, hi = UINT64_MAX;
    if (peak_at(o, s, hi, n) <= usable)
        return UINT64_MAX;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (peak_at(o, s, mid, n) <= usable)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* mm_predict_peak; with `usable` (UINT64_MAX: none) out->peak may instead be
 * UINT64_MAX when it is known to exceed usable before the replay ends */
static int predict_peak(const mm_spec *sp, mm_peak_only *out, int lower_only, uint64_t usable,
                        mm_error *err)
{
    const training_spec *t = &sp->training;
    sim s;
    step_cfg cfg = {.dp = t->data_parallel};
    memset(out, 0, sizeof *out);
    resolved_model rm; /* once for both steps */
    if (resolve_model(sp, &rm, err))
        return -1;
    if (step_run(&rm, &s, &cfg, err)) {
        resolved_free(&rm);
        sim_free(&s);
        return -1;
    }
    mm_overheads o = predict_overheads(sp);
    uint32_t n = (uint32_t)t->data_parallel;
    out->allocated = s.peak;
    out->paged = s.outside_bytes;
    out->lower = mm_sat_add(dp_device_level(&o, s.peak, 0, n), s.outside_bytes);
    int rc = 0;
    if (!lower_only && usable != UINT64_MAX && out->lower > usable) {
        out->peak = UINT64_MAX; /* never below its lower bound */
    } else if (!lower_only) {
        steplog L;
        reserve_result r = {0};
        uint64_t stop = usable == UINT64_MAX ? UINT64_MAX : reserved_bound(&o, &s, usable, n);
        rc = steplog_run(sp, &rm, &s, s.largest_param, n, 0, &L, err);
        if (!rc) {
            if (reserve_replay_until(&L.s, n, &L.conf, L.per_param, L.pairs, stop, &r)) {
                mm_err(err, "out of memory");
                rc = -1;
            }
            steplog_free(&L);
        }
        out->peak = r.stopped ? UINT64_MAX : peak_at(&o, &s, rc ? 0 : r.reserved_peak, n);
    }
    resolved_free(&rm);
    sim_free(&s);
    return rc;
}

int mm_predict_peak(const mm_spec *sp, mm_peak_only *out, int lower_only, mm_error *err)
{
    return predict_peak(sp, out, lower_only, UINT64_MAX, err);
}

int mm_predict_peak_fits(const mm_spec *sp, mm_peak_only *out, uint64_t usable, mm_error *err)
{
    return predict_peak(sp, out, 0, usable, err);
}

void mm_prediction_free(mm_prediction *p)
{
    if (!p)
        return;
    for (size_t i = 0; p->modules && i < p->n_modules; i++)
        free(p->modules[i].layers);
    free(p->modules);
    p->modules = NULL;
    p->n_modules = 0;
    free(p->dp_points);
    p->dp_points = NULL;
    p->n_dp_points = 0;
}

/* ---- JSON ------------------------------------------------------------------------ */

const char *const mm_factor_names[MM_NFACTORS] = {
    "parameters", "gradients", "optimizer_states", "activations", "temporaries", "overhead"
};

void mm_factor_values(const mm_factors *f, uint64_t v[MM_NFACTORS])
{
    v[0] = f->parameters;
    v[1] = f->gradients;
    v[2] = f->optimizer_states;
    v[3] = f->activations;
    v[4] = f->temporaries;
    v[5] = f->overhead;
}

static json_object *j_u64(uint64_t v)
{
    return json_object_new_uint64(v);
}

static json_object *factors_json(const mm_factors *f)
{
    json_object *o = json_object_new_object();
    uint64_t v[MM_NFACTORS];
    mm_factor_values(f, v);
    for (int i = 0; i < MM_NFACTORS; i++)
        json_object_object_add(o, mm_factor_names[i], j_u64(v[i]));
    return o;
}

/* dp_model: allocated(N) from allocated_dp1 and the terms, and the degrees
 * the allocator was replayed at (README "JSON output") */
static json_object *dp_model_json(const mm_prediction *p)
{
    json_object *dp = json_object_new_object();
    json_object_object_add(dp, "allocated_dp1", j_u64(p->allocated_dp1));
    json_object *terms = json_object_new_array();
    for (size_t i = 0; i < p->n_terms; i++) {
        json_object *t = json_object_new_object();
        json_object_object_add(t, "fixed", j_u64(p->terms[i].fixed));
        json_object_object_add(t, "sharded", j_u64(p->terms[i].sharded));
        json_object_array_add(terms, t);
    }
    json_object_object_add(dp, "terms", terms);
    json_object_object_add(dp, "terms_exact", json_object_new_boolean(p->terms_exact));
    json_object *pts = json_object_new_array();
    for (size_t i = 0; i < p->n_dp_points; i++) {
        const mm_dp_point *q = &p->dp_points[i];
        json_object *t = json_object_new_object();
        json_object_object_add(t, "n_from", j_u64(q->n_from));
        json_object_object_add(t, "n_to", j_u64(q->n_to));
        json_object_object_add(t, "reserved", j_u64(q->reserved));
        json_object_object_add(t, "paged", j_u64(q->paged));
        json_object_array_add(pts, t);
    }
    json_object_object_add(dp, "replayed", pts);
    return dp;
}

/* the worst image of a prediction (README "JSON output") */
static json_object *image_json(const mm_prediction *p)
{
    json_object *im = json_object_new_object();
    json_object_object_add(im, "height", j_u64(p->image_height));
    json_object_object_add(im, "width", j_u64(p->image_width));
    json_object_object_add(im, "tiles", j_u64(p->image_tiles));
    json_object_object_add(im, "patches", j_u64(p->image_patches));
    json_object_object_add(im, "tokens", j_u64(p->image_tokens));
    return im;
}

char *mm_prediction_json(const mm_prediction *p, int pretty)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "name", json_object_new_string(p->name));
    json_object_object_add(o, "peak_bytes", j_u64(p->peak_bytes));
    json_object_object_add(o, "allocated_peak_bytes", j_u64(p->allocated_peak_bytes));
    json_object_object_add(o, "reserved_peak_bytes", j_u64(p->reserved_peak_bytes));
    json_object_object_add(o, "host_peak_bytes", j_u64(p->host_peak_bytes));
    json_object_object_add(o, "paged_bytes", j_u64(p->paged_bytes));
    json_object_object_add(o, "peak_phase", json_object_new_string(mm_phase_name(p->peak_phase)));
    json_object_object_add(o, "peak_event", json_object_new_string(p->peak_event));
    if (p->bound[0]) /* the peak is a bound, not a model (bound.c) */
        json_object_object_add(o, "bound", json_object_new_string(p->bound));
    json_object *pp = json_object_new_object();
    for (int i = 0; i < MM_PHASE_COUNT; i++)
        json_object_object_add(pp, mm_phase_name((mm_phase)i), j_u64(p->phase_peak[i]));
    json_object_object_add(o, "phase_peak_bytes", pp);
    json_object_object_add(o, "factors", factors_json(&p->factors));
    json_object_object_add(o, "parameters_count", j_u64(p->parameters_count));
    json_object_object_add(o, "trainable_count", j_u64(p->trainable_count));
    json_object_object_add(o, "data_parallel", j_u64(p->data_parallel));
    json_object_object_add(o, "micro_batch_size", j_u64(p->micro_batch_size));
    json_object_object_add(o, "seq_len", j_u64(p->seq_len));
    if (p->image_height)
        json_object_object_add(o, "image", image_json(p));
    json_object *ov = json_object_new_object();
    json_object_object_add(ov, "cuda_context", j_u64(p->overheads.cuda_context));
    json_object_object_add(ov, "nccl", j_u64(p->overheads.nccl));
    json_object_object_add(ov, "allocator_fixed", j_u64(p->overheads.alloc_fixed));
    json_object_object_add(ov, "allocator_fraction",
                           json_object_new_double(p->overheads.alloc_frac));
    json_object_object_add(o, "overheads", ov);
    json_object_object_add(o, "dp_model", dp_model_json(p));
    json_object *mods = json_object_new_array();
    for (size_t i = 0; i < p->n_modules; i++) {
        const mm_module_result *M = &p->modules[i];
        json_object *m = json_object_new_object();
        json_object_object_add(m, "name", json_object_new_string(M->name));
        json_object_object_add(m, "type", json_object_new_string(M->type));
        json_object_object_add(m, "parameters_count", j_u64(M->parameters_count));
        json_object_object_add(m, "trainable_count", j_u64(M->trainable_count));
        json_object_object_add(m, "factors", factors_json(&M->factors));
        json_object *ls = json_object_new_array();
        for (size_t k = 0; k < M->n_layers; k++) {
            const mm_layer_result *L = &M->layers[k];
            json_object *l = json_object_new_object();
            json_object_object_add(l, "name", json_object_new_string(L->name));
            json_object_object_add(l, "kind", json_object_new_string(L->kind));
            json_object_object_add(l, "count", j_u64(L->count));
            json_object_object_add(l, "parameters_count", j_u64(L->parameters_count));
            json_object_object_add(l, "trainable_count", j_u64(L->trainable_count));
            json_object_object_add(l, "factors", factors_json(&L->factors));
            json_object_array_add(ls, l);
        }
        json_object_object_add(m, "layers", ls);
        json_object_array_add(mods, m);
    }
    json_object_object_add(o, "modules", mods);
    const char *s = json_object_to_json_string_ext(
        o, pretty ? JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED : JSON_C_TO_STRING_PLAIN);
    char *r = s ? strdup(s) : NULL;
    json_object_put(o);
    return r;
}
