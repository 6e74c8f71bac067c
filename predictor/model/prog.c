/* prog.c - the whole forward: vision -> connector -> decoder, the grad and
 * checkpoint mode of each, and the re-run of a checkpointed layer in backward.
 * The top of the model layer: it runs the module runners (vision.c,
 * connector.c, decoder.c), which never call it; the geometry of a module
 * (prog_enter_module) is in prog_module.c, below them. */
#include "ops.h"
#include "util.h"

#include <string.h>

static int module_needs_grad(const resolved_module *m)
{
    return m->trainable || m->lora;
}

/* The forward in compute order.  Returns the loss. */
int32_t prog_forward(lctx *c)
{
    const resolved_model *rm = c->rm;
    const training_spec *t = &rm->training;
    int32_t feat = -1;
    mod_kind order[MOD_NKIND] = {MOD_VISION, MOD_CONNECTOR, MOD_DECODER};
    int images = t->images_per_sample > 0 && rm->vision >= 0;
    /* gradient_checkpointing_enable() calls enable_input_require_grads()
     * (modeling_utils.py: main_input_name == "input_ids"), which in transformers 5
     * hooks the input embeddings of every sub-model, vision towers included */
    c->input_grads = t->ckpt.enabled;
    for (int k = 0; k < MOD_NKIND; k++) {
        int mi = order[k] == MOD_VISION ? rm->vision : order[k] == MOD_CONNECTOR ? rm->connector
                                                                                 : rm->decoder;
        if (mi < 0)
            continue;
        const module_spec *m = rm->modules[mi].spec;
        prog_enter_module(c, (uint32_t)mi);
        c->grad = 1;
        c->ckpt = t->ckpt.enabled;
        c->input_grads = t->ckpt.enabled;
        if (m->tower_ckpt_given) {
            /* ms-swift vit_gradient_checkpointing (swift/trainers/mixin.py
             * _prepare_gradient_checkpointing): vision_tower.gradient_checkpointing_enable()
             * + enable_input_require_grads(), or _disable() + disable_input_require_grads() */
            c->ckpt = m->tower_ckpt;
            c->input_grads = m->tower_ckpt;
        }
        if (m->kind != MOD_DECODER) {
            /* text-only samples: tower and connector never run, so they get no
             * gradient and AdamW never creates their state (counted frozen) */
            c->unused = !images;
            if (!images && !c->counting)
                continue;
            /* frozen_rg: a flat parameter's view may make the tower's input need a
             * gradient (FSDP1); with none, a checkpoint of a frozen layer records nothing */
            c->ckpt = c->ckpt && (module_needs_grad(&rm->modules[mi]) || tower_input_grads(c) || c->frozen_rg);
            feat = m->kind == MOD_VISION ? vision_module(c) : connector_module(c, feat);
            continue;
        }
        c->unused = 0;
        return decoder_module(c, images ? feat : -1);
    }
    return -1;
}

/* re-run a checkpointed layer with grad enabled, with the shared tensors it
 * saved; non-reentrant checkpoints stop at the last saved tensor */
int32_t prog_recompute(sim *s, const sim_node *ck, void *ctx)
{
    (void)s;
    lctx *c = ctx;
    const module_spec *m = ck->ckpt_prog;
    lctx outer = *c;
    prog_enter_module(c, (uint32_t)(m - c->rm->spec->modules));
    c->grad = 1;
    c->per_layer = 1;
    c->recompute = 1;
    c->early_stop = !c->rm->training.ckpt.reentrant;
    c->cos = ck->aux[1];
    c->sin = ck->aux[2];
    c->mask = ck->aux[3];
    c->mask_sliding = ck->aux[4];
    c->cross_states = ck->aux[5];
    c->mask_cross = ck->aux[6];
    int32_t x = ck->aux[0];
    if ((ck->host_saved & 1) && x >= 0) { /* the input comes back from the host */
        x = op_new(c, ck->row, sim_grad_bytes(c->s, ck->aux[0]), c->s->t[ck->aux[0]].esz);
        if (x >= 0)
            c->s->t[x].rg = 1;
        c->s->ckpt_extra = x;
    }
    if (c->rm->training.ckpt.granularity == CKPT_SELECTIVE_OP)
        op_sac_begin(c, ck->ckpt_layer, 1); /* the forward's saved outputs come back */
    int32_t y = block_layer(c, x, ck->ckpt_layer);
    op_sac_end(c);
    outer.amp_cache = c->amp_cache; /* the list may have grown (realloc) */
    outer.n_amp = c->n_amp;
    outer.cap_amp = c->cap_amp;
    *c = outer;
    return y;
}
