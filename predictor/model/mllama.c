/* mllama.c - Llama-3.2-Vision's vision encoder (MllamaVisionModel): every
 * image is max_num_tiles tiles of (image/patch)^2 + 1 patches, padded to a
 * multiple of 8, run as ONE sequence per image with a float aspect-ratio mask;
 * tile and position embeddings are gated; all hidden states are kept
 * (output_hidden_states) for the intermediate layers that are concatenated to
 * the output; a second, gated "global" encoder follows.  The output width is
 * hidden x (1 + taps). */
#include "block.h"
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* x + gate * embedding(aspect_ratio_ids): gather, scale, add */
static int32_t tile_embed(lctx *c, const char *name, int32_t x, uint64_t per_image, uint64_t rows,
                          int own_gate)
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size, R = m->aspect_ratio_ids + 1;
    uint32_t r = op_row(c, name, "embedding");
    int tw = op_trainable(c);
    op_param(c, r, sim_add(c->s, op_mul(c, R, per_image), own_gate ? 1 : 0), tw);
    uint64_t e = esz_of(c, x);
    int32_t g = op_new(c, r, op_mul(c, c->images, per_image), c->wdt);
    sim_node *n = op_node(c, r, g, -1, -1, -1, tw);
    if (n && tw)
        op_wgrad(c, n, op_mul(c, R, per_image));
    int32_t gs = op_plain(c, r, g, -1, op_mul(c, c->images, per_image), c->wdt);
    op_drop(c, g);
    int32_t y = op_add(c, r, x, gs, op_mul(c, rows, h), e);
    op_drop(c, gs);
    op_drop(c, x);
    return y;
}

static int32_t embeddings(lctx *c, uint64_t *seq_out)
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size, g = m->image_size / m->patch_size, P = g * g;
    uint64_t tiles = m->max_num_tiles, nt = op_mul(c, c->images, tiles);
    uint64_t kin = op_mul3(c, m->num_channels, m->patch_size, m->patch_size);
    int tw = op_trainable(c);
    uint32_t rp = op_row(c, "patch_embedding", "conv");
    op_param(c, rp, op_mul(c, h, kin), tw);
    op_label(c, "patch embedding", rp);
    int32_t px = op_plain(c, rp, c->pixels, -1, op_mul3(c, nt, P, kin), c->wdt);
    int32_t pe = op_new(c, rp, op_mul3(c, nt, P, h), c->wdt);
    sim_node *n = op_node(c, rp, pe, -1, -1, -1, tw);
    if (n && tw) {
        op_save(c, n, px);
        op_wgrad(c, n, op_mul(c, h, kin));
    }
    op_drop(c, px);
    if (!tw && tower_input_grads(c) && !c->counting && pe >= 0)
        c->s->t[pe].rg = 1; /* enable_input_require_grads() hooks patch_embedding */
    int32_t x = tile_embed(c, "pre_tile_positional_embedding", pe, op_mul(c, tiles, h),
                           op_mul(c, nt, P), 1);
    uint32_t rc = op_row(c, "class_embedding", "embedding");
    op_param(c, rc, h, tw);
    int32_t cat = op_new(c, rc, op_mul3(c, nt, P + 1, h), esz_of(c, x));
    n = op_node(c, rc, cat, x, -1, -1, 0);
    if (n)
        n->grad_views = 1;
    op_drop(c, x);
    uint32_t rg = op_row(c, "gated_positional_embedding", "embedding");
    op_param(c, rg, op_mul(c, P + 1, h) + 1, tw);
    int32_t pos = op_plain(c, rg, -1, -1, op_mul(c, P + 1, h), c->wdt);
    int32_t y = op_add(c, rg, cat, pos, op_mul3(c, nt, P + 1, h), 0);
    op_drop(c, pos);
    op_drop(c, cat);
    x = tile_embed(c, "gated_positional_embedding.tile_embedding", y,
                   op_mul3(c, tiles, P + 1, h), op_mul(c, nt, P + 1), 0);
    int32_t z = op_norm(c, "layernorm_pre", x, op_mul(c, nt, P + 1), h, NORM_LAYER, 1);
    op_drop(c, x);
    uint64_t seq = (P + 1 + 7) / 8 * 8;
    int32_t pad = op_new(c, rg, op_mul3(c, nt, seq, h), esz_of(c, z)); /* F.pad */
    n = op_node(c, rg, pad, z, -1, -1, 0);
    op_drop(c, z);
    *seq_out = seq;
    return pad;
}

int32_t mllama_vision(lctx *c)
{
    const module_spec *m = c->m;
    uint64_t h = m->hidden_size, seq, L = m->num_hidden_layers;
    c->per_layer = 0;
    int32_t x = embeddings(c, &seq);
    uint64_t S = op_mul(c, m->max_num_tiles, seq);
    /* one sequence per image, a float (images, 1, S, S) aspect-ratio mask made
     * from a mask @ mask^T product */
    uint32_t rm = op_row(c, "aspect_ratio_mask", "mask");
    uint64_t ss = op_mul3(c, c->images, S, S);
    int32_t tmp = op_new(c, rm, ss, c->dt);
    c->mask = op_plain(c, rm, tmp, -1, ss, c->dt);
    op_drop(c, tmp);
    c->B = c->images;
    c->S = S;
    c->T = op_mul(c, c->B, S);
    c->per_layer = 1;
    int32_t *hs = c->scratch;
    hs[0] = x;
    int32_t y = stack_run(c, x, 0, L, hs + 1); /* every hidden state kept */
    uint64_t ff = c->fold_from, ft = c->fold_to; /* the tuple's fold (the global run resets it) */
    c->per_layer = 0;
    int32_t post = op_norm(c, "layernorm_post", y, c->T, h, NORM_LAYER, 1);
    int32_t t = tile_embed(c, "post_tile_positional_embedding", post,
                           op_mul(c, m->max_num_tiles, h), c->T, 1);
    c->per_layer = 1;
    c->gated = 1;
    int32_t gl = stack_run(c, t, L, m->num_global_layers, NULL);
    c->gated = 0;
    c->per_layer = 0;
    uint64_t ntaps = 0;
    for (uint64_t l = 0; l < L; l++)
        ntaps += (resolved_layer_kind(c->rm, c->mi, l) & LK_TAP) != 0;
    uint32_t rs = op_row(c, "intermediate_hidden_states", "copy");
    int32_t st = op_plain(c, rs, -1, -1, op_mul3(c, c->T, h, ntaps), esz_of(c, gl)); /* stack */
    size_t n = (size_t)L + 1;
    if (ft > ff)
        n -= (size_t)(ft - ff) - 1;
    for (size_t i = 0; i < n; i++)
        op_drop(c, c->scratch[i]);
    int32_t out = op_new(c, rs, op_mul3(c, c->T, h, 1 + ntaps), esz_of(c, gl)); /* cat */
    sim_node *nd = op_node(c, rs, out, gl, st, -1, 0);
    if (nd)
        nd->grad_views = 1;
    op_drop(c, gl);
    op_drop(c, st);
    op_drop(c, c->mask);
    c->mask = -1;
    return out;
}
