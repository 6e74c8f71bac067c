/* prog.c - the whole forward: vision -> connector -> decoder, with the
 * geometry each module runs at (tiles and patches of the worst-case image,
 * packed or batched), the grad and checkpoint mode of each, and the re-run of
 * a checkpointed layer in backward. */
#include "ops.h"
#include "util.h"

#include <string.h>

/* Qwen2.5-VL windows per image: window_size pixels, in patches per side */
static uint64_t windows_per_image(const lctx *c)
{
    const module_spec *m = c->m;
    if (!m->window_size || !m->patch_size)
        return 1;
    uint64_t w = m->window_size / m->patch_size;
    uint64_t a = (c->vt.grid_h + w - 1) / w, b = (c->vt.grid_w + w - 1) / w;
    return a && b ? a * b : 1;
}

void prog_enter_module(lctx *c, uint32_t mi)
{
    const mm_spec *sp = c->spec;
    const training_spec *t = &sp->training;
    c->mi = mi;
    c->m = &sp->modules[mi];
    c->attn = c->m->attention == ATT_INHERIT ? t->attention : c->m->attention;
    c->chunks = c->win_chunks = 0;
    const module_spec *v = mm_spec_module(sp, MOD_VISION);
    if (c->m->kind == MOD_VISION) {
        if (c->m->packed) { /* one sequence of every patch, attention per image */
            c->B = c->images;
            c->S = c->vt.patches;
            c->chunks = c->images;
            c->win_chunks = sim_mul(c->s, c->images, windows_per_image(c));
        } else {
            c->B = sim_mul(c->s, c->images, c->vt.tiles);
            c->S = c->vt.seq;
        }
    } else if (c->m->kind == MOD_CONNECTOR) {
        uint64_t per = c->vt.grid_h * c->vt.grid_w +
                       (v && v->class_token && v->keep_cls && !v->packed ? 1 : 0);
        c->B = v && v->packed ? c->images : sim_mul(c->s, c->images, c->vt.tiles);
        c->S = v && v->packed ? c->vt.patches : per;
    } else {
        c->B = t->micro_batch_size;
        c->S = t->seq_len;
    }
    c->T = sim_mul(c->s, c->B, c->S);
}

static int module_needs_grad(const module_spec *m)
{
    return m->trainable || m->lora.enabled;
}

int tower_input_grads(const lctx *c)
{
    return c->input_grads && c->spec->framework.tf_major >= 5 && !c->m->no_input_hook;
}

/* The forward in compute order.  Returns the loss. */
int32_t prog_forward(lctx *c)
{
    const mm_spec *sp = c->spec;
    const training_spec *t = &sp->training;
    int32_t feat = -1;
    mod_kind order[MOD_NKIND] = {MOD_VISION, MOD_CONNECTOR, MOD_DECODER};
    int images = t->images_per_sample > 0 && mm_spec_module(sp, MOD_VISION);
    /* gradient_checkpointing_enable() calls enable_input_require_grads()
     * (modeling_utils.py: main_input_name == "input_ids"), which in transformers 5
     * hooks the input embeddings of every sub-model, vision towers included */
    c->input_grads = t->ckpt.enabled;
    for (int k = 0; k < MOD_NKIND; k++) {
        const module_spec *m = mm_spec_module(sp, order[k]);
        if (!m)
            continue;
        prog_enter_module(c, (uint32_t)(m - sp->modules));
        c->grad = 1;
        c->ckpt = t->ckpt.enabled;
        if (m->kind != MOD_DECODER) {
            /* text-only samples: tower and connector never run, so they get no
             * gradient and AdamW never creates their state (counted frozen) */
            c->unused = !images;
            if (!images && !c->counting)
                continue;
            c->ckpt = c->ckpt && (module_needs_grad(m) || tower_input_grads(c));
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
    prog_enter_module(c, (uint32_t)(m - c->spec->modules));
    c->grad = 1;
    c->per_layer = 1;
    c->recompute = 1;
    c->early_stop = !c->spec->training.ckpt.reentrant;
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
    int32_t y = block_layer(c, x, ck->ckpt_layer);
    outer.amp_cache = c->amp_cache; /* the list may have grown (realloc) */
    outer.n_amp = c->n_amp;
    outer.cap_amp = c->cap_amp;
    *c = outer;
    return y;
}
