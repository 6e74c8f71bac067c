/* timeline.c - the predicted step's live bytes over its events (timeline.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "dp.h"
#include "timeline.h"
#include "util.h"

const char *const mm_tl_factor_names[MM_TL_FACTORS] = {
    "parameters", "gradients", "optimizer states", "saved activations", "activations, temps"
};

typedef struct walk {
    uint64_t fact[MM_TL_FACTORS], mod[MM_TL_MODULES], live;
    mm_allocator *a;
    int64_t *handle;                    /* per tensor id, -1 none */
    uint64_t *cls_of;                   /* factor each tensor counted under */
} walk;

static size_t module_of(const mm_spec *sp, const sim *s, uint32_t row)
{
    uint32_t m = row < s->nrows ? s->rows[row].module : MM_TL_MODULES;
    return m < sp->n_modules ? m : MM_TL_MODULES - 1;
}

/* one event: live bytes, the allocator model */
static void apply(const mm_spec *sp, const sim *s, walk *w, const sim_ev *e)
{
    size_t f = e->cls < MM_TL_FACTORS ? e->cls : MM_TL_FACTORS - 1;
    size_t m = module_of(sp, s, e->row);
    if (!e->is_free) {
        w->cls_of[e->id] = f;
        w->fact[f] += e->bytes;
        w->mod[m] += e->bytes;
        w->live += e->bytes;
        if (w->a && w->handle[e->id] < 0)
            w->handle[e->id] = mm_allocator_malloc(w->a, e->bytes);
        return;
    }
    f = w->cls_of[e->id];
    w->fact[f] -= e->bytes < w->fact[f] ? e->bytes : w->fact[f];
    w->mod[m] -= e->bytes < w->mod[m] ? e->bytes : w->mod[m];
    w->live -= e->bytes < w->live ? e->bytes : w->live;
    if (w->a && w->handle[e->id] >= 0) {
        mm_allocator_release(w->a, w->handle[e->id]);
        w->handle[e->id] = -1;
    }
}

static void sample(const walk *w, mm_tl_point *p, uint64_t ev, uint8_t phase)
{
    p->event = ev;
    memcpy(p->factor, w->fact, sizeof p->factor);
    memcpy(p->module, w->mod, sizeof p->module);
    p->reserved = w->a ? mm_allocator_stats(w->a)->reserved : 0;
    p->phase = phase;
}

/* Walk every event; each bucket of events keeps its largest total. */
static void run_walk(const mm_spec *sp, const sim *s, walk *w, mm_timeline *tl)
{
    uint64_t per = s->nev / MM_TL_POINTS + 1, best = 0;
    mm_tl_point cur;
    int have = 0;
    for (size_t i = 0; i < s->nev; i++) {
        apply(sp, s, w, &s->ev[i]);
        if (w->live > tl->peak_live) {
            tl->peak_live = w->live;
            tl->peak_event = i;
        }
        if (!have || w->live >= best) {
            sample(w, &cur, i, s->ev[i].phase);
            best = w->live;
            have = 1;
        }
        if ((i + 1) % per == 0 || i + 1 == s->nev) {
            if (cur.event <= tl->peak_event && tl->peak_event <= i)
                tl->peak_point = tl->n;
            tl->pts[tl->n++] = cur;
            have = 0;
        }
    }
    if (w->a)
        tl->reserved_peak = mm_allocator_stats(w->a)->reserved_peak;
}

int mm_timeline_build(const mm_spec *sp, mm_timeline *tl, mm_error *err)
{
    sim s;
    walk w;
    mm_alloc_conf conf;
    uint32_t dp = mm_spec_data_parallel(sp);
    step_cfg cfg = {.dp = dp ? dp : 1, .nofold = 1, .log = 1};
    int rc = -1;
    memset(tl, 0, sizeof *tl);
    memset(&w, 0, sizeof w);
    memset(&s, 0, sizeof s);
    tl->data_parallel = (uint32_t)cfg.dp;
    mm_alloc_conf_default(&conf);
    if (sp->device.alloc_conf[0] && mm_alloc_conf_parse(&conf, sp->device.alloc_conf, err) < 0)
        return -1;
    if (step_run_spec(sp, NULL, &s, &cfg, err))
        return -1;
    w.handle = malloc((s.nt + 1) * sizeof *w.handle);
    w.cls_of = calloc(s.nt + 1, sizeof *w.cls_of);
    w.a = mm_allocator_new(&conf, 0, 0);
    if (!w.handle || !w.cls_of || !w.a) {
        mm_err(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i <= s.nt; i++)
        w.handle[i] = -1;
    tl->events = s.nev;
    tl->n_modules = sp->n_modules;
    for (size_t m = 0; m < sp->n_modules && m < MM_TL_MODULES - 1; m++)
        memcpy(tl->module_names[m], sp->modules[m].name, MM_MAX_NAME);
    snprintf(tl->module_names[MM_TL_MODULES - 1], MM_MAX_NAME, "other");
    run_walk(sp, &s, &w, tl);
    rc = 0;
out:
    mm_allocator_free(w.a);
    free(w.handle);
    free(w.cls_of);
    sim_free(&s);
    return rc;
}
