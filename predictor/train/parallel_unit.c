/* parallel_unit.c - what the strategy files (parallel_ddp.c, parallel_fsdp.c,
 * parallel_zero*.c, parallel_opt.c) and the dispatcher (parallel.c) share:
 * the strategy kind, the parameters of one wrapped layer unit, which
 * parameters require grad, dropping the step's own gradients, and backward
 * markers on the tape.  Below every strategy file, so none calls back into
 * the dispatcher. */
#include "parallel.h"
#include "util.h"

#include <string.h>

int par_is_fsdp(const par_state *ps)
{
    return ps->kind == PAR_FSDP1 || ps->kind == PAR_FSDP2;
}

/* Idefics3 / SmolVLM wrap only the vision attention (_no_split_modules =
 * Idefics3VisionAttention): the rest of those layers is in the root */
int par_attention_only(const par_state *ps, uint32_t module)
{
    return ps->rm->modules[module].unit_attention_only;
}

/* a row of the attention that par_attention_only wraps as each layer's unit */
int par_attention_row(const sim_row *R)
{
    return !strncmp(R->name, "layers.self_attn.", 17);
}

static uint64_t attention_params(const par_state *ps, uint32_t module, int trainable)
{
    const sim *s = ps->c->s;
    uint64_t n = 0;
    for (size_t r = 0; r < s->nrows; r++) {
        const sim_row *R = &s->rows[r];
        if (R->module == module && R->count && par_attention_row(R))
            n += (trainable ? R->trainable : R->params) / R->count;
    }
    return n;
}

/* fsdp.wrap_policy size: the layer's units (parallel_wrap.c) and the outer
 * units the model's events name (OP_UNIT_EMBED / HEAD / BASE) */
static int size_units(const par_state *ps)
{
    return ps->kind == PAR_FSDP1 && ps->rm->fsdp.wrap_size;
}

static uint64_t outer_unit(const par_state *ps, uint64_t unit, int trainable)
{
    if (unit == OP_UNIT_EMBED)
        return trainable ? ps->w_emb_tr : ps->w_emb;
    if (unit == OP_UNIT_HEAD)
        return trainable ? ps->w_head_tr : ps->w_head;
    if (unit == OP_UNIT_BASE)
        return trainable ? ps->w_base_tr : ps->w_base;
    return 0;
}

uint64_t par_unit_params(const par_state *ps, uint32_t module, uint64_t layer)
{
    const sim *s = ps->c->s;
    if (size_units(ps))
        return module != ps->llm ? 0 : layer < MM_MAX_LAYERS ? wrap_layer(ps, layer, 0)
                                                               : outer_unit(ps, layer, 0);
    if (module >= MM_MAX_MODULES || layer >= MM_MAX_LAYERS || !s->layer_p)
        return 0;
    if (par_attention_only(ps, module))
        return attention_params(ps, module, 0);
    return sim_layer_get(s, s->layer_p, module, layer);
}

uint64_t par_unit_trainable(const par_state *ps, uint32_t module, uint64_t layer)
{
    const sim *s = ps->c->s;
    if (size_units(ps))
        return module != ps->llm ? 0 : layer < MM_MAX_LAYERS ? wrap_layer(ps, layer, 1)
                                                               : outer_unit(ps, layer, 1);
    if (module >= MM_MAX_MODULES || layer >= MM_MAX_LAYERS || !s->layer_tp)
        return 0;
    if (par_attention_only(ps, module))
        return attention_params(ps, module, 1);
    return sim_layer_get(s, s->layer_tp, module, layer);
}

/* Parameters that require grad: the trainable ones, and in a trainable
 * module those that get no gradient (a vision layer past select_layer, a
 * tower with no images).  DeepSpeed flattens and partitions every one of
 * them (its fp32 master and Adam partitions, its gradient partitions);
 * torch's optimizers skip a parameter whose .grad stays None. */
uint64_t par_requires_grad(const par_state *ps, const sim_row *R)
{
    const resolved_module *m = &ps->rm->modules[R->module];
    return m->full_grads && !R->qbytes ? R->params : R->trainable;
}

void par_drop_grads(const par_state *ps, int32_t mark)
{
    sim *s = ps->c->s;
    for (size_t i = mark > 0 ? (size_t)mark : 0; i < s->nt; i++) {
        const sim_tensor *t = &s->t[i];
        int own = t->row == ps->r_bucket || t->row == ps->r_part || t->row == ps->r_grads;
        if (t->alive && t->cls == F_GRAD && t->sharded == SIM_FIXED && t->base < 0 && !own)
            sim_drop(s, (int32_t)i);
    }
}

size_t par_marker(sim *s, uint32_t row, void (*fn)(sim *, const sim_node *, void *), void *ctx,
                  uint32_t module, uint64_t layer, int kind, uint64_t count)
{
    size_t k = s->ntape;
    sim_node *n = sim_node_new(s, row, -1);
    if (!n)
        return k;
    n->marker = fn;
    n->marker_ctx = ctx;
    n->aux[0] = (int32_t)module;
    n->aux[1] = (int32_t)layer;
    n->aux[2] = -1;
    n->aux[3] = kind;
    n->aux[4] = (int32_t)count;
    n->aux[5] = (int32_t)k;
    return k;
}
