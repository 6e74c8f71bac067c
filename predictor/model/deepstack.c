/* deepstack.c - Qwen3-VL's DeepStack in the decoder's layer loop (stack.c):
 * the visual features tapped from vision layers (connector_deepstack) added to
 * the hidden states after the decoder's first layers.  Below the layer loop,
 * which the decoder (decoder.c) runs. */
#include "block.h"
#include "ops.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* Qwen3-VL _deepstack_process: clone, gather the visual rows, add, put back */
int32_t deepstack_add(lctx *c, int32_t x, uint64_t l)
{
    if (l >= c->ntaps || c->taps[l] < 0)
        return x;
    uint64_t h = c->m->hidden_size, Th = op_mul(c, c->T, h);
    uint64_t nv = op_mul(c, c->images, c->vt.llm_tokens), e = esz_of(c, x);
    uint32_t r = op_row(c, "deepstack", "add");
    op_label(c, "deepstack", r);
    int32_t cl = op_new(c, r, Th, e); /* hidden_states.clone() */
    sim_node *n = op_node(c, r, cl, x, -1, -1, 0);
    if (n)
        n->grad_views = 1;
    op_drop(c, x);
    int32_t g = op_plain(c, r, cl, -1, op_mul(c, nv, h), e);       /* hidden[mask, :] */
    int32_t a = op_add(c, r, g, c->taps[l], op_mul(c, nv, h), e);   /* + visual embeds */
    op_drop(c, g);
    op_drop(c, c->taps[l]);
    c->taps[l] = -1;
    int32_t out = op_view(c, r, cl, op_mul(c, Th, e)); /* index_put_: the same storage */
    n = op_node(c, r, out, cl, a, -1, 0);
    if (n)
        n->grad_views = 1;
    op_drop(c, a);
    op_drop(c, cl);
    return out;
}
