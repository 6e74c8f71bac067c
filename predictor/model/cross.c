/* cross.c - Mllama's gated cross-attention decoder layer
 * (MllamaCrossAttentionDecoderLayer, MllamaTextCrossAttention): queries from
 * the text, keys and values from the projected vision states of every tile,
 * per-head RMSNorm on q and k, an attention mask over the tiles (so SDPA
 * takes the memory-efficient kernel), tanh gates on both residual branches. */
#include "block.h"
#include "ops.h"
#include "util.h"

static int32_t cross_attention(lctx *c, int32_t z)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, a = m->num_attention_heads,
             kv = m->num_key_value_heads, d = m->head_dim;
    uint64_t nv = c->vt.seq * c->vt.tiles * (c->B ? c->images / c->B : 0); /* keys per sample */
    uint64_t Tv = op_mul(c, c->B, nv);
    int32_t q = op_linear(c, "layers.cross_attn.q_proj", z, T, h, op_mul(c, a, d), 0, LT_Q);
    int32_t qn = op_norm(c, "layers.cross_attn.q_norm", q, op_mul(c, T, a), d, NORM_RMS, 1);
    op_drop(c, q);
    int32_t k = op_linear(c, "layers.cross_attn.k_proj", c->cross_states, Tv, h, op_mul(c, kv, d),
                          0, LT_K);
    int32_t v = op_linear(c, "layers.cross_attn.v_proj", c->cross_states, Tv, h, op_mul(c, kv, d),
                          0, LT_V);
    int32_t kn = op_norm(c, "layers.cross_attn.k_norm", k, op_mul(c, Tv, kv), d, NORM_RMS, 1);
    op_drop(c, k);
    uint32_t ra = op_row(c, "layers.cross_attn.attention", "attention");
    attn_opts o = {.B = c->B, .S = c->S, .heads = a, .kv = kv, .d = d, .Skv = nv,
                   .causal = 0, .mask = c->mask_cross, .softmax_fp32 = m->softmax_fp32};
    int32_t out = op_attention(c, ra, qn, kn, v, &o);
    op_drop(c, qn);
    op_drop(c, kn);
    op_drop(c, v);
    int32_t y = op_linear(c, "layers.cross_attn.o_proj", out, T, op_mul(c, a, d), h, 0, LT_O);
    op_drop(c, out);
    return y;
}

int32_t block_cross_layer(lctx *c, int32_t x)
{
    const module_spec *m = c->m;
    uint64_t Th = op_mul(c, c->T, m->hidden_size);
    uint32_t rres = op_row(c, "cross_layers.residual", "add");
    int32_t z = op_norm(c, "cross_layers.input_layernorm", x, c->T, m->hidden_size, m->norm, 1);
    int32_t a = cross_attention(c, z);
    op_drop(c, z);
    int32_t ga = op_tanh_gate(c, "cross_layers.cross_attn_attn_gate", a, Th);
    op_drop(c, a);
    int32_t h1 = op_add(c, rres, x, ga, Th, 0);
    op_drop(c, ga);
    int32_t z2 = op_norm(c, "cross_layers.post_attention_layernorm", h1, c->T, m->hidden_size,
                         m->norm, 1);
    int32_t f = block_dense_mlp(c, z2, m->intermediate_size);
    op_drop(c, z2);
    /* full_text_row_masked_out_mask[:, 0] * hidden_states */
    int32_t fm = op_plain(c, rres, f, -1, Th, f >= 0 ? c->s->t[f].esz : c->dt);
    op_drop(c, f);
    int32_t gf = op_tanh_gate(c, "cross_layers.cross_attn_mlp_gate", fm, Th);
    op_drop(c, fm);
    int32_t out = op_add(c, rres, h1, gf, Th, 0);
    op_drop(c, h1);
    op_drop(c, gf);
    return out;
}
