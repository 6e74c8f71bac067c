/* resolve.c - spec layer: a checked spec read once into the resolved model
 * (resolve.h): what the step program and the parallel layouts read, per module
 * and per model, instead of re-deriving it from the spec at each use. */
#include "resolve.h"
#include "family.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* the rank's copy of the spec under tensor parallel: the decoder's heads, kv heads
 * and intermediate width per rank (train/parallel_tp.c), NULL without memory */
static mm_spec *tp_copy(const mm_spec *sp)
{
    uint64_t tp = sp->training.tensor_parallel;
    mm_spec *l = mm_spec_copy_decoded(sp);
    if (!l)
        return NULL;
    for (size_t m = 0; m < l->n_modules; m++) {
        module_spec *d = &l->modules[m];
        if (d->kind != MOD_DECODER)
            continue;
        /* head_dim stays the global one (spec_check.c derived it already) */
        d->num_attention_heads /= tp;
        d->num_key_value_heads /= tp;
        d->intermediate_size /= tp;
        /* sequence parallel: torchtitan shards the embedding (RowwiseParallel: weight
         * Shard(0)) and the output head (ColwiseParallel: weight Shard(0)) on the
         * vocabulary, apply_tp lines 173-188; spec_tp.c asks for a divisible one */
        if (sp->training.sequence_parallel)
            d->vocab_size /= tp;
    }
    return l;
}

/* the LK_* bits of each layer of ms into k (n entries) */
static void layer_kinds(const module_spec *ms, uint8_t *k, uint64_t n)
{
    for (uint64_t l = 0; l < n; l++)
        k[l] = (uint8_t)(lset_has(&ms->sliding, l) * LK_SLIDING | lset_has(&ms->dense, l) * LK_DENSE |
                         lset_has(&ms->cross, l) * LK_CROSS |
                         lset_has(&ms->full_attention, l) * LK_FULL_ATT |
                         lset_has(&ms->deepstack, l) * LK_DEEPSTACK | lset_has(&ms->taps, l) * LK_TAP);
}

static void resolve_module(const module_spec *ms, resolved_module *r)
{
    memset(r, 0, sizeof *r);
    r->role = ms->kind;
    r->spec = ms;
    r->layers = ms->num_hidden_layers + ms->num_global_layers;
    r->hidden_size = ms->hidden_size;
    r->num_hidden_layers = ms->num_hidden_layers;
    r->num_attention_heads = ms->num_attention_heads;
    r->num_key_value_heads = ms->num_key_value_heads;
    r->head_dim = ms->head_dim;
    r->intermediate_size = ms->intermediate_size;
    r->vocab_size = ms->vocab_size;
    r->tie_word_embeddings = ms->tie_word_embeddings;
    r->trainable = ms->trainable;
    r->lora = ms->lora.enabled;
    r->full_grads = ms->trainable && !ms->lora.enabled;
    r->quant = ms->quant;
    r->image_size = ms->image_size;
    r->patch_size = ms->patch_size;
    r->num_channels = ms->num_channels;
    r->temporal_patch_size = ms->temporal_patch_size;
    r->img = ms->img.kind;
    r->packed = ms->packed;
    r->feature_cls = ms->class_token && ms->keep_cls && !ms->packed;
    /* _no_split_modules: transformers 5.17 modeling_clip.py:397 CLIPVisionEmbeddings,
     * modeling_siglip.py:366-371 SiglipVisionEmbeddings and
     * SiglipMultiheadAttentionPoolingHead, Idefics3VisionAttention */
    const family_def *f = ms->kind == MOD_VISION ? family_at(ms->kind, ms->family) : NULL;
    int clip = f && !strcmp(f->name, "clip"), siglip = f && !strcmp(f->name, "siglip");
    r->unit_embeddings = clip || siglip;
    r->unit_head = siglip;
    r->unit_attention_only = f && !strcmp(f->name, "idefics3");
    r->has_sliding = lset_first_from(&ms->sliding, 0) < ms->num_hidden_layers;
    if (ms->kind == MOD_VISION)
        for (uint64_t l = 0; l < ms->num_hidden_layers && r->deepstack_taps < 16; l++)
            r->deepstack_taps += (uint64_t)lset_has(&ms->deepstack, l);
}

/* the dtypes the step computes in and reads weights in (lctx dt, wdt) */
static void resolve_dtypes(resolved_model *m)
{
    const training_spec *t = &m->training;
    int fsdp = m->parallel == PAR_FSDP1 || m->parallel == PAR_FSDP2;
    m->dt = mm_dtype_bytes(t->precision);
    /* FSDP MixedPrecision computes in param_dtype: activations follow it */
    if (fsdp && m->fsdp.mixed_precision && !t->autocast)
        m->dt = mm_dtype_bytes(m->fsdp.param_dtype);
    if (t->autocast)
        m->wdt = 4;
    else if (fsdp)
        m->wdt = mm_dtype_bytes(m->fsdp.param_dtype);
    else
        m->wdt = m->dt;
    m->store = mm_dtype_bytes(m->fsdp.model_dtype);
}

static void resolve_strategy(const mm_spec *sp, resolved_model *m)
{
    const training_spec *t = &sp->training;
    m->training = sp->training;
    m->training.data_parallel = 0; /* N reaches the step by step_cfg.dp, never from here */
    m->deepspeed = sp->deepspeed;
    m->fsdp = sp->fsdp;
    m->ddp = sp->ddp;
    m->framework = sp->framework;
    m->parallel = spec_parallel(sp);
    m->zero_level = m->parallel == PAR_ZERO ? t->zero_stage : m->parallel == PAR_DDP ? 0 : 3;
    m->grads_sharded = m->parallel == PAR_ZERO && t->zero_stage == 2 &&
                       !sp->deepspeed.contiguous_gradients && !sp->deepspeed.offload_optimizer &&
                       t->grad_accum == 1;
    resolve_dtypes(m);
}

/* every module, its layer kinds in one allocation; -1 without memory */
static int resolve_modules(const mm_spec *sp, resolved_model *m)
{
    m->vision = m->connector = m->decoder = -1;
    m->n_modules = sp->n_modules < MM_MAX_MODULES ? sp->n_modules : MM_MAX_MODULES;
    m->layer_stride = 1;
    uint64_t n[MM_MAX_MODULES] = {0}, all = 0;
    for (size_t i = 0; i < m->n_modules; i++) {
        resolved_module *r = &m->modules[i];
        resolve_module(&sp->modules[i], r);
        int *role = r->role == MOD_VISION ? &m->vision : r->role == MOD_CONNECTOR ? &m->connector
                                                                                 : &m->decoder;
        if (*role < 0)
            *role = (int)i;
        m->total_layers += r->layers;
        n[i] = r->layers < MM_MAX_LAYERS ? r->layers : MM_MAX_LAYERS;
        if (n[i] > m->layer_stride)
            m->layer_stride = n[i];
        all += n[i];
    }
    m->kinds = malloc(all ? all : 1);
    if (!m->kinds)
        return -1;
    for (size_t i = 0, at = 0; i < m->n_modules; at += n[i], i++) {
        m->modules[i].layer_kind = m->kinds + at;
        layer_kinds(&sp->modules[i], m->kinds + at, n[i]);
    }
    return 0;
}

int resolve_model(const mm_spec *sp, resolved_model *m, mm_error *err)
{
    memset(m, 0, sizeof *m);
    if (sp->training.tensor_parallel > 1 && !(m->tp_copy = tp_copy(sp))) {
        mm_err(err, "out of memory");
        return -1;
    }
    m->spec = m->tp_copy ? m->tp_copy : sp;
    m->path = sp->path;
    resolve_strategy(m->spec, m);
    if (resolve_modules(m->spec, m)) {
        resolved_free(m);
        mm_err(err, "out of memory");
        return -1;
    }
    const resolved_module *v = m->vision >= 0 ? &m->modules[m->vision] : NULL;
    /* modeling_utils.py _set_gradient_checkpointing counts every
     * GradientCheckpointingLayer in module order (the tower's before the LLM's) */
    if (m->decoder >= 0 && v && !v->spec->no_ckpt)
        m->modules[m->decoder].ckpt_base = v->layers;
    m->has_images = v && m->training.images_per_sample;
    if (m->has_images) {
        uint64_t h, w;
        mm_error e;
        tokens_worst_image(m->spec, v->spec, &h, &w);
        tokens_per_image(m->spec, h, w, &m->vt, &e);
    }
    return 0;
}

void resolved_free(resolved_model *m)
{
    free(m->kinds);
    if (m->tp_copy)
        mm_spec_free(m->tp_copy);
    memset(m, 0, sizeof *m);
}

void resolved_set_micro_batch(resolved_model *m, uint64_t micro_batch)
{
    m->training.micro_batch_size = micro_batch;
    if (m->tp_copy)
        m->tp_copy->training.micro_batch_size = micro_batch;
}
