/* vision_pixtral.c - model layer: the entry of Pixtral's vision tower
 * (PixtralVisionModel.forward, transformers 5.17 models/pixtral/modeling_pixtral.py
 * :414-462) up to its layers: after the patch conv (vision.c's), every image's
 * patches cat'ed into ONE sequence, RMSNorm ln_pre, the 2-D positions and the axial
 * rotary tables, and generate_block_attention_mask's (1, 1, P, P) mask in the model
 * dtype.  The layers, the hidden-state tuple and what follows are vision.c's. */
#include "block.h"
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* PixtralVisionRotaryEmbedding.forward (:83-96, under no_grad):
 * position_ids[..., None].float() (T, 2, 1), freqs = that @ inv_freq (T, 2, d/2),
 * cos = freqs.cos() * attention_scaling (a temporary, then the product), the
 * same for sin; recomposition_frequencies (:98-105) cats the h and w halves
 * (T, d/2) and doubles them (T, d); .to(x.dtype) casts both at the return.
 * The fp32 locals die when forward returns.  cos / sin are shared by every
 * layer's apply_rotary_pos_emb (:211), which the block runs (block.c). */
static void axial_rotary(lctx *c, int32_t x)
{
    uint64_t T = c->T, d = c->m->head_dim, xe = esz_of(c, x), e = op_mul(c, T, d);
    uint32_t r = op_row(c, "patch_positional_embedding", "rope");
    op_label(c, "2-D rotary tables", r);
    int32_t pf = op_new(c, r, op_mul(c, T, 2), F32);
    int32_t fr = op_new(c, r, e, F32);
    int32_t t[2];
    for (int i = 0; i < 2; i++) { /* cos, sin: f(freqs) * attention_scaling */
        int32_t raw = op_new(c, r, e, F32);
        t[i] = op_new(c, r, e, F32);
        op_drop(c, raw);
    }
    for (int i = 0; i < 2; i++) { /* cat(h, w) then cat([hw, hw]) */
        int32_t hw = op_new(c, r, e / 2, F32);
        int32_t full = op_new(c, r, e, F32);
        op_drop(c, hw);
        op_drop(c, t[i]);
        t[i] = full;
    }
    c->cos = t[0];
    c->sin = t[1];
    if (xe != F32) { /* cos.to(x.dtype), sin.to(x.dtype) */
        c->cos = op_new(c, r, e, xe);
        c->sin = op_new(c, r, e, xe);
        op_drop(c, t[0]);
        op_drop(c, t[1]);
    }
    op_drop(c, fr);
    op_drop(c, pf);
}

/* generate_block_attention_mask (:371-384): torch.full((P, P), finfo.min) in the
 * dtype of patch_embeds (after ln_pre), zero blocks per image, expanded to
 * (1, 1, P, P) (a view).  flash_attention_2 gets none (:448-450). */
static void block_mask(lctx *c, int32_t x)
{
    uint32_t r = op_row(c, "block_attention_mask", "mask");
    c->mask = -1;
    if (c->attn == ATT_FLASH)
        return;
    op_label(c, "block attention mask", r);
    c->mask = op_new(c, r, op_mul(c, c->T, c->T), esz_of(c, x));
}

int32_t pixtral_embeddings(lctx *c, int32_t pe, int32_t keep[2])
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size, T = c->T;
    /* embed[..., :gh, :gw].flatten(1).T per image (views), torch.cat (:427-433): a
     * new (P, h); CatBackward hands views of its gradient back.  The views in
     * patch_embeds_list keep the conv output until the tower returns */
    uint32_t r = op_row(c, "patch_embeds", "cat");
    int32_t x = op_new(c, r, op_mul(c, T, h), esz_of(c, pe));
    sim_node *n = op_node(c, r, x, pe, -1, -1, 0);
    if (n)
        n->grad_views = 1;
    keep[0] = pe;
    int32_t y = op_norm(c, "ln_pre", x, T, h, m->norm, 1);
    op_drop(c, x);
    /* position_ids (:437-445): (P, 2) int64 per image stacked, then cat; the result
     * is passed down to the layers (a kwarg) and lives to the tower's end */
    uint32_t rp = op_row(c, "position_ids", "positions");
    int32_t lst = op_new(c, rp, op_mul(c, T, 2), 8);
    keep[1] = op_new(c, rp, op_mul(c, T, 2), 8);
    op_drop(c, lst);
    axial_rotary(c, y);
    block_mask(c, y);
    return y;
}
