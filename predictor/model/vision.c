/* vision.c - the vision encoder: pixel values -> patch embedding (2-D conv,
 * or Qwen's 3-D conv over temporal patches) -> [class token] -> [learned
 * positions] -> [pre-norm] -> layers (batched tiles, or all images packed in one
 * sequence with attention per image / per window; Pixtral's entry, one
 * sequence behind a block mask, is vision_pixtral.c) -> the hidden state the
 * family feeds its connector.  Frozen towers save nothing: no input needs a
 * gradient and no weight does. */
#include "block.h"
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* the patch convolution: pixel_values cast to the weight dtype (the processor
 * hands fp32), ConvBackward keeps that input when the weight needs a gradient */
static int32_t patch_embed(lctx *c, uint64_t rows)
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size, p = m->patch_size;
    uint64_t t = m->temporal_patch_size ? m->temporal_patch_size : 1;
    uint64_t kin = op_mul3(c, m->num_channels, op_mul(c, p, p), t);
    uint32_t r = op_row(c, "embeddings.patch_embedding", "conv");
    int tw = op_trainable(c);
    op_param(c, r, sim_add(c->s, op_mul(c, h, kin), m->patch_bias ? h : 0), tw);
    op_label(c, "patch embedding", r);
    /* autocast runs the conv in bf16: the fp32 pixels and the weight are cast */
    uint64_t ce = c->amp ? c->dt : c->wdt;
    int32_t px = c->pixels;
    if (esz_of(c, px) != ce)
        px = op_plain(c, r, c->pixels, -1, op_mul(c, rows, kin), ce);
    else
        op_hold(c, px);
    int32_t wc = op_weight_cast(c, r, op_mul(c, h, kin), tw);
    int32_t pe = op_new(c, r, op_mul(c, rows, h), ce);
    sim_node *n = op_node(c, r, pe, -1, -1, -1, tw);
    if (n) {
        op_save(c, n, px);
        op_wgrad(c, n, sim_add(c->s, op_mul(c, h, kin), m->patch_bias ? h : 0));
    }
    op_drop(c, wc);
    op_drop(c, px);
    if (!tw && tower_input_grads(c) && !c->counting && pe >= 0)
        c->s->t[pe].rg = 1; /* output.requires_grad_(True): the frozen tower keeps a graph */
    return pe;
}

/* CLS token (cat: a copy), learned positions (+: a new tensor), pre-norm */
static int32_t embeddings(lctx *c)
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size, B = c->B;
    uint64_t P = c->vt.grid_h * c->vt.grid_w, tiles_rows = op_mul(c, B, P);
    int tw = op_trainable(c);
    int32_t x = patch_embed(c, m->packed ? c->T : tiles_rows);
    if (m->class_token) {
        uint32_t rc = op_row(c, "embeddings.class_embedding", "embedding");
        op_param(c, rc, h, tw);
        int32_t cat = op_new(c, rc, op_mul(c, c->T, h), esz_of(c, x));
        sim_node *n = op_node(c, rc, cat, x, -1, -1, tw);
        if (n) {
            n->grad_views = 1;
            if (tw)
                op_wgrad(c, n, h);
        }
        op_drop(c, x);
        x = cat;
    }
    if (m->pos == POS_LEARNED || m->pos == POS_LEARNED_ROPE2D) {
        uint32_t rp = op_row(c, "embeddings.position_embedding", "embedding");
        uint64_t g = m->image_size && m->patch_size ? m->image_size / m->patch_size : 0;
        uint64_t npos = m->pos == POS_LEARNED_ROPE2D ? m->num_position_embeddings
                                                     : op_mul(c, g, g) + (m->class_token ? 1 : 0);
        op_param(c, rp, op_mul(c, npos, h), tw);
        int32_t pos = op_new(c, rp, op_mul(c, m->packed ? c->T : c->S, h), c->wdt);
        sim_node *n = op_node(c, rp, pos, -1, -1, -1, tw);
        if (n && tw)
            op_wgrad(c, n, op_mul(c, npos, h));
        int32_t y = op_add(c, rp, x, pos, op_mul(c, c->T, h), 0);
        op_drop(c, x);
        op_drop(c, pos);
        x = y;
    }
    if (m->pre_layernorm) {
        int32_t y = op_norm(c, "pre_layrnorm", x, c->T, h, m->norm, 1);
        op_drop(c, x);
        x = y;
    }
    return x;
}

/* Qwen 2-D rotary: cos / sin (tokens x head_dim) in fp32 for the whole tower */
static void vision_rotary(lctx *c)
{
    const module_spec *m = c->m;
    if (m->pos != POS_ROPE2D && m->pos != POS_LEARNED_ROPE2D) {
        c->cos = c->sin = -1;
        return;
    }
    uint32_t r = op_row(c, "rotary_pos_emb", "rope");
    uint64_t e = op_mul(c, c->T, m->head_dim);
    c->cos = op_new(c, r, e, F32);
    c->sin = op_new(c, r, e, F32);
}

/* layers after the selected hidden state run but reach nothing: no gradient,
 * no optimizer state for them (and frozen towers keep nothing anyway) */
static int32_t run_layers(lctx *c, int32_t x, int64_t *sel_out)
{
    const module_spec *m = c->m;
    uint64_t L = m->num_hidden_layers;
    int64_t sel = m->select_layer < 0 ? (int64_t)L + 1 + m->select_layer : m->select_layer;
    *sel_out = sel;
    uint64_t live = (uint64_t)sel < L ? (uint64_t)sel : L;
    int grad_mode = c->grad;
    int32_t *hs = m->hidden_tuple ? c->scratch : NULL;
    if (hs)
        hs[0] = x;
    int32_t y = stack_run(c, x, 0, live, hs ? hs + 1 : NULL);
    if (live < L) { /* the rest run dead; their outputs are dropped */
        uint64_t ff = c->fold_from, ft = c->fold_to; /* the tuple's fold */
        c->dead = 1;
        c->grad = 0;
        op_hold(c, y);
        op_drop(c, stack_run(c, y, live, L - live, NULL));
        c->grad = grad_mode;
        c->dead = 0;
        c->fold_from = ff;
        c->fold_to = ft;
    } else if (hs) {
        op_hold(c, y);
    }
    return y;
}

/* what the tuple of hidden states still holds besides the feature */
static void release_tuple(lctx *c, int32_t feat, int64_t sel)
{
    if (!c->m->hidden_tuple)
        return;
    size_t n = (size_t)sel + 1;
    if (c->fold_to > c->fold_from && (uint64_t)sel >= c->fold_to)
        n -= (size_t)(c->fold_to - c->fold_from) - 1;
    for (size_t i = 0; i < n; i++)
        if (c->scratch[i] != feat)
            op_drop(c, c->scratch[i]);
    op_drop(c, feat); /* the tuple's own reference */
}

int32_t vision_module(lctx *c)
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size;
    if (m->img.kind == IMG_MLLAMA)
        return mllama_vision(c);
    c->per_layer = 0;
    int pixtral = m->img.kind == IMG_PIXTRAL;
    int32_t keep[2] = {-1, -1};
    /* Pixtral: patch_conv(pixel_values.to(weight dtype)) (modeling_pixtral.py:425-426);
     * the images share one size here (the worst image), so no padded patches */
    int32_t x = pixtral ? pixtral_embeddings(c, patch_embed(c, c->T), keep) : embeddings(c);
    if (!pixtral)
        vision_rotary(c);
    c->per_layer = 1;
    int64_t sel;
    int32_t feat = run_layers(c, x, &sel);
    c->per_layer = 0;
    if (pixtral) { /* PixtralVisionModel.forward returns: its locals go */
        op_drop(c, keep[0]);
        op_drop(c, keep[1]);
        op_drop(c, c->mask);
        c->mask = -1;
    }
    release_tuple(c, feat, sel);
    uint32_t rpost = op_row(c, "post_layernorm", "layernorm");
    if (m->post_layernorm && m->feature_post_norm) {
        int32_t y = op_norm(c, "post_layernorm", feat, c->T, h, m->norm, 1);
        op_drop(c, feat);
        feat = y;
    } else if (m->post_layernorm) { /* parameters only: never reaches the loss */
        int d = c->dead;
        c->dead = 1;
        op_param(c, rpost, 2 * h, op_trainable(c));
        c->dead = d;
    }
    if (m->pooling_head) { /* SiglipMultiheadAttentionPoolingHead: parameters only */
        int d = c->dead;
        c->dead = 1;
        uint64_t I = m->intermediate_size;
        op_param(c, op_row(c, "head", "pooling_head"),
                 sim_add(c->s, op_mul(c, 4 * h, h), op_mul(c, 2 * h, I)) + 8 * h + I,
                 op_trainable(c));
        c->dead = d;
    }
    op_drop(c, c->cos);
    op_drop(c, c->sin);
    c->cos = c->sin = -1;
    if (m->class_token && !m->keep_cls) { /* [:, 1:]: a view that keeps the whole */
        int32_t v = op_view(c, rpost, feat, op_mul3(c, c->B, c->S - 1, op_mul(c, h, esz_of(c, feat))));
        sim_node *nd = op_node(c, rpost, v, feat, -1, -1, 0);
        (void)nd; /* SliceBackward: a full-size gradient of the hidden state */
        op_drop(c, feat);
        feat = v;
    }
    return feat;
}
