/* step.c - one steady-state training step (see step.h).  The layer programs
 * (prog.c) give the forward and its backward tape; this file puts around them
 * what the training framework holds: parameters, gradients and optimizer
 * states per strategy, ZeRO buckets and partitions, FSDP's gathered units,
 * DDP's buckets, and the optimizer step's temporaries. */
#include "step.h"
#include "ops.h"
#include "parallel.h"
#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void ctx_init(lctx *c, const resolved_model *rm, sim *s, int32_t *scratch,
                     const step_cfg *cfg)
{
    const training_spec *t = &rm->training;
    memset(c, 0, sizeof *c);
    c->s = s;
    c->rm = rm;
    c->scratch = scratch;
    c->cos = c->sin = c->mask = c->mask_sliding = c->pixels = c->cross_states = -1;
    c->mask_cross = c->pos_ids = -1;
    for (int i = 0; i < 4; i++)
        c->late_drop[i] = -1;
    for (int i = 0; i < MAX_TAPS; i++)
        c->taps[i] = -1;
    c->zero = rm->zero_level;
    c->deepspeed = rm->parallel == PAR_ZERO;
    s->offload_acts = t->activation_offload;
    c->grads_accumulate = t->grad_accum > 1 || t->optimizer_in_backward;
    c->grads_sharded = rm->grads_sharded;
    c->nofold = cfg->nofold;
    c->dt = rm->dt;
    c->amp = t->autocast;
    c->wdt = rm->wdt;
    c->gdt = c->wdt;
    if (rm->has_images) {
        c->vt = rm->vt;
        c->images = sim_mul(s, t->micro_batch_size, t->images_per_sample);
    }
    if (rm->vision >= 0)
        c->ntaps = rm->modules[rm->vision].deepstack_taps;
}

/* room for the step's tensors (and their events) before the first: a layer
 * makes up to about 48 in forward (39 a decoder layer of LLaVA-1.5-7B or
 * Qwen2.5-VL-72B, 45 a Qwen2.5-VL vision block, 19 a CLIP one) and the step up
 * to 5 times the forward's (what stack.c reserves at a module's first layer).
 * Without it the arrays are copied as they grow: at each module's first layer,
 * the tensors before it.  Only a capacity: memory not used is never touched. */
static void reserve_step(sim *s, const resolved_model *rm)
{
    uint64_t layers = rm->total_layers;
    if (layers > MM_MAX_MODULES * (uint64_t)MM_MAX_LAYERS)
        layers = MM_MAX_MODULES * (uint64_t)MM_MAX_LAYERS;
    sim_reserve(s, 1024 + 5 * 48 * (size_t)layers);
}

/* one per-(module, layer) table (layer_tp, layer_p, layer_gb), zeroed */
static uint64_t *layer_table(const sim *s)
{
    return calloc((size_t)MM_MAX_MODULES * s->layer_stride, sizeof(uint64_t));
}

/* pass 1: rows and parameter counts (or an earlier run's: its rows copied,
 * its per-layer tables, which only a counting pass writes, borrowed) */
static int rows_pass(lctx *c, sim *s, const step_cfg *cfg)
{
    const sim *f = cfg->rows_from && cfg->rows_from->nrows ? cfg->rows_from : NULL;
    if (f && f->layer_tp && f->layer_p && f->layer_gb) {
        s->layer_tp = f->layer_tp;
        s->layer_p = f->layer_p;
        s->layer_gb = f->layer_gb;
        s->layer_stride = f->layer_stride;
        s->tables_borrowed = 1;
    } else {
        s->layer_stride = c->rm->layer_stride;
        s->layer_tp = layer_table(s);
        s->layer_p = layer_table(s);
        s->layer_gb = layer_table(s);
    }
    if (!s->layer_tp || !s->layer_p || !s->layer_gb)
        return -1;
    if (f) {
        s->rows = malloc(f->nrows * sizeof *s->rows);
        if (!s->rows)
            return -1;
        memcpy(s->rows, f->rows, f->nrows * sizeof *s->rows);
        s->nrows = s->caprows = f->nrows;
        memcpy(s->rcache, f->rcache, sizeof s->rcache); /* same rows, same ids */
        c->largest_param = cfg->largest_param;
        return 0;
    }
    c->counting = 1;
    prog_forward(c);
    c->counting = 0;
    return 0;
}

/* the batch: input_ids, labels, attention_mask (int64) and pixel_values (fp32,
 * as the processor makes them) */
static int32_t inputs(lctx *c, const resolved_model *rm, uint32_t llm)
{
    sim *s = c->s;
    const training_spec *t = &rm->training;
    uint32_t rin = sim_row_get(s, llm, "inputs", "inputs");
    sim_label(s, "inputs", rin);
    /* HF Trainer: the step's micro-batches are fetched to the device up front and
     * held until after optimizer.step() (trainer.py _inner_training_loop,
     * get_batch_samples; accelerate DataLoaderShard send_to_device) */
    uint64_t ga = t->grad_accum ? t->grad_accum : 1;
    uint64_t bs = sim_mul3(s, t->micro_batch_size, t->seq_len, ga);
    uint64_t ids = sim_mul(s, bs, 3 * 8);
    const resolved_module *v = rm->vision >= 0 ? &rm->modules[rm->vision] : NULL;
    if (v && c->images && v->img == IMG_SPLIT) /* Idefics3ImageProcessor's int64
                                                       pixel_attention_mask: every tile pixel */
        ids = sim_add(s, ids, sim_mul3(s, sim_mul(s, c->images, c->vt.tiles),
                                       sim_mul(s, v->image_size, v->image_size), 8 * ga));
    int32_t in = sim_alloc(s, rin, ids, F_TEMP, 0);
    if (v && c->images) {
        uint64_t tk = v->temporal_patch_size ? v->temporal_patch_size : 1;
        uint64_t px = sim_mul3(s, c->images, c->vt.patches, sim_mul3(s, v->num_channels,
                                                                    sim_mul(s, v->patch_size,
                                                                            v->patch_size),
                                                                    tk));
        c->pixels = sim_alloc(s, sim_row_get(s, (uint32_t)rm->vision, "pixel_values",
                                             "inputs"),
                              sim_mul3(s, px, 4, ga), F_TEMP, 0);
        if (c->pixels >= 0)
            s->t[c->pixels].esz = 4;
    }
    return in;
}

/* a tensor's bytes while it is alive (the batch's, which stays to the end) */
static uint64_t alive_bytes(const sim *s, int32_t id)
{
    return id >= 0 && s->t[id].alive ? s->t[id].bytes : 0;
}

static int finish(sim *s, const resolved_model *rm, int32_t *scratch, lctx *c, mm_error *err)
{
    free(scratch);
    free(c->amp_cache);
    if (c->sac) {
        free(c->sac->ids);
        free(c->sac->at);
        free(c->sac);
    }
    if (s->oom) {
        mm_err(err, "out of memory");
        return -1;
    }
    if (s->overflow) {
        mm_err(err, "%s: the predicted sizes overflow 64-bit byte counts (absurd dimensions?)",
               rm->path);
        return -1;
    }
    return 0;
}

/* under tensor parallel rm holds one rank's decoder widths (spec/resolve.c) */
int step_run(const resolved_model *rm, sim *s, const step_cfg *cfg, mm_error *err)
{
    sim_init(s, cfg->dp, cfg->symbolic);
    s->snap_at = cfg->snap_at;
    s->track_peak = cfg->track_peak;
    s->log = cfg->log;
    int32_t *scratch = malloc((MM_MAX_LAYERS + 2) * sizeof *scratch);
    lctx c;
    ctx_init(&c, rm, s, scratch, cfg);
    tp_attach(&c);
    if (rm->training.ckpt.enabled && rm->training.ckpt.granularity == CKPT_SELECTIVE_OP) {
        c.sac = calloc(1, sizeof *c.sac);
        if (c.sac && !(c.sac->at = calloc((size_t)MM_MAX_MODULES * MM_MAX_LAYERS, sizeof *c.sac->at)))
            s->oom = 1;
        if (!c.sac)
            s->oom = 1;
    }
    if (!scratch || s->oom || rows_pass(&c, s, cfg)) {
        s->oom = 1;
        return finish(s, rm, scratch, &c, err);
    }
    if (s->oom || s->overflow)
        return finish(s, rm, scratch, &c, err);
    reserve_step(s, rm);
    par_state ps;
    uint32_t llm = (uint32_t)rm->decoder;
    par_model_states(&ps, &c, rm, llm);
    s->step_ev = s->nev; /* model states above, the step below */
    int32_t in = inputs(&c, rm, llm);
    par_forward_begin(&ps, &c);
    int32_t loss = prog_forward(&c);
    par_forward_end(&ps, &c); /* the wrapper's post-forward, inside the model call */
    for (size_t i = 0; i < c.n_amp; i++) /* the autocast region ends */
        op_drop(&c, c.amp_cache[i]);
    c.n_amp = 0;
    for (int i = 0; i < 4; i++)
        op_drop(&c, c.late_drop[i]);
    if (s->oom || s->overflow)
        return finish(s, rm, scratch, &c, err);
    sim_set_phase(s, MM_PHASE_BACKWARD);
    /* the backward makes 1.6 (LLaVA-1.5-7B) to 2.2 (Qwen2.5-VL-72B ZeRO-3) times the
     * forward's tensors again (gradients, recomputed layers): room for the forward's and
     * 3 times as many again, so the arrays are not copied while they grow */
    sim_reserve(s, 4 * s->nt);
    par_backward_begin(&ps, &c);
    sim_backward(s, 0, s->ntape, prog_recompute, &c);
    sim_release_grads(s);
    sim_drop(s, loss);
    par_backward_end(&ps, &c);
    if (s->oom || s->overflow)
        return finish(s, rm, scratch, &c, err);
    sim_set_phase(s, MM_PHASE_OPTIMIZER);
    s->leftover = sim_alive_temp(s) - alive_bytes(s, in) - alive_bytes(s, c.pixels);
    par_optimizer(&ps, &c);
    sim_drop(s, in);
    sim_drop(s, c.pixels);
    s->largest_param = c.largest_param;
    return finish(s, rm, scratch, &c, err);
}
