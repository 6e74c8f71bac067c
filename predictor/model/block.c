/* block.c - one transformer layer built from the module's blocks: norm ->
 * self-attention (separate or fused qkv, optional qk-norm, rotary) -> [post
 * norm] [layer scale] -> residual -> norm -> MLP (fc or gated) or MoE (moe.c)
 * -> [post norm] [layer scale] -> residual.  The same program serves vision
 * encoders (batched or packed sequences) and decoders (causal, sliding
 * window per layer); Mllama's gated cross-attention layers are here too. */
#include "block.h"
#include "ops.h"
#include "util.h"

static const char *norm_name(const lctx *c, int which)
{
    static const char *const dec[4] = {"layers.input_layernorm", "layers.post_attention_layernorm",
                                       "layers.pre_feedforward_layernorm",
                                       "layers.post_feedforward_layernorm"};
    static const char *const vis[4] = {"layers.norm1", "layers.norm2", "layers.norm3",
                                       "layers.norm4"};
    return c->m->kind == MOD_DECODER ? dec[which] : vis[which];
}

/* q, k, v: one qkv Linear whose output is split (reshape/permute/unbind:
 * views; UnbindBackward stacks their gradients) or three Linears */
static void project_qkv(lctx *c, int32_t z, int32_t *q, int32_t *k, int32_t *v)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, qd = op_mul(c, m->num_attention_heads, m->head_dim),
             kvd = op_mul(c, m->num_key_value_heads, m->head_dim);
    if (!m->qkv_fused) {
        *q = op_linear(c, "layers.self_attn.q_proj", z, T, h, qd, m->q_bias, LT_Q);
        *k = op_linear(c, "layers.self_attn.k_proj", z, T, h, kvd, m->k_bias, LT_K);
        *v = op_linear(c, "layers.self_attn.v_proj", z, T, h, kvd, m->v_bias, LT_V);
        return;
    }
    int32_t qkv = op_linear(c, "layers.self_attn.qkv", z, T, h, qd + 2 * kvd, m->q_bias, LT_QKV);
    uint32_t r = op_row(c, "layers.self_attn.qkv", "linear");
    uint64_t e = c->counting || qkv < 0 ? c->dt : c->s->t[qkv].esz;
    *q = op_view(c, r, qkv, op_mul(c, op_mul(c, T, qd), e));
    *k = op_view(c, r, qkv, op_mul(c, op_mul(c, T, kvd), e));
    *v = op_view(c, r, qkv, op_mul(c, op_mul(c, T, kvd), e));
    sim_node *n = op_node(c, r, *q, qkv, -1, -1, 0);
    sim_node_out(c->s, n, *k);
    sim_node_out(c->s, n, *v);
    op_drop(c, qkv);
}

/* per-head (Qwen3, Gemma 3: over head_dim) or whole-width (InternViT) norms of q, k */
static int32_t qk_norm(lctx *c, const char *name, int32_t x, uint64_t heads)
{
    const module_spec *m = c->m;
    norm_kind k = m->norm == NORM_RMS_GEMMA ? NORM_RMS_GEMMA : NORM_RMS;
    int32_t y = m->qk_norm == QKN_HEAD
                    ? op_decoder_norm(c, name, x, op_mul(c, c->T, heads), m->head_dim, k)
                    : op_decoder_norm(c, name, x, c->T, op_mul(c, heads, m->head_dim), k);
    op_drop(c, x);
    return y;
}

static int sliding_here(const lctx *c)
{
    return c->m->kind == MOD_DECODER && (resolved_layer_kind(c->rm, c->mi, c->layer) & LK_SLIDING) &&
           c->m->sliding_window < c->S;
}

/* the decoder's mask for this layer: eager always has one; SDPA only when
 * is_causal cannot say it (sliding window, bidirectional image tokens) */
static int32_t layer_mask(const lctx *c)
{
    if (c->m->kind != MOD_DECODER) /* Pixtral's block-diagonal image mask (vision_pixtral.c) */
        return c->m->img.kind == IMG_PIXTRAL ? c->mask : -1;
    return sliding_here(c) && c->mask_sliding >= 0 ? c->mask_sliding : c->mask;
}

/* the attention sublayer; *probs: eager's probabilities, which the layer holds
 * (-1 none) */
static int32_t self_attention(lctx *c, int32_t z, int32_t *probs)
{
    const module_spec *m = c->m;
    uint64_t a = m->num_attention_heads, kv = m->num_key_value_heads, d = m->head_dim;
    int32_t q, k, v;
    project_qkv(c, z, &q, &k, &v);
    if (m->qk_norm) {
        q = qk_norm(c, "layers.self_attn.q_norm", q, a);
        k = qk_norm(c, "layers.self_attn.k_norm", k, m->qk_norm == QKN_HEAD ? kv : kv);
    }
    uint32_t ra = op_row(c, "layers.self_attn.attention", "attention");
    if (m->pos == POS_ROPE || m->pos == POS_MROPE || m->pos == POS_ROPE2D ||
        m->pos == POS_LEARNED_ROPE2D) {
        uint32_t rr = op_row(c, "layers.self_attn.rotary", "rope");
        op_label(c, "rotary", rr);
        int fp32 = m->kind == MOD_VISION && m->rope_fp32, lg = op_liger_rope(c);
        int32_t qr = lg ? op_liger_rotary(c, rr, q, op_mul3(c, c->T, a, d))
                        : op_rope(c, rr, q, op_mul3(c, c->T, a, d), fp32);
        op_drop(c, q);
        int32_t kr = lg ? op_liger_rotary(c, rr, k, op_mul3(c, c->T, kv, d))
                        : op_rope(c, rr, k, op_mul3(c, c->T, kv, d), fp32);
        op_drop(c, k);
        q = qr;
        k = kr;
    }
    attn_opts o = {.B = c->B, .S = c->S, .heads = a, .kv = kv, .d = d,
                   .causal = m->kind == MOD_DECODER, .mask = layer_mask(c),
                   .softmax_fp32 = m->softmax_fp32, .chunks = c->chunks,
                   .float_bias = m->kind == MOD_VISION && m->img.kind == IMG_PIXTRAL,
                   .weights = probs};
    if (c->chunks) { /* packed: attention per image, or per window (Qwen2.5-VL) */
        o.chunks = c->chunks;
        if (c->win_chunks > c->chunks && !(resolved_layer_kind(c->rm, c->mi, c->layer) & LK_FULL_ATT))
            o.chunks = c->win_chunks;
        o.B = 1;
        o.S = c->T / o.chunks;
    }
    int32_t out = op_attention(c, ra, q, k, v, &o);
    op_drop(c, q);
    op_drop(c, k);
    op_drop(c, v);
    int32_t y = op_linear(c, m->kind == MOD_DECODER ? "layers.self_attn.o_proj"
                                                    : "layers.self_attn.out_proj",
                          out, c->T, op_mul(c, a, d), m->hidden_size, m->o_bias, LT_O);
    op_drop(c, out);
    return y;
}

static int moe_here(const lctx *c)
{
    return c->m->kind == MOD_DECODER && c->m->num_experts && !(resolved_layer_kind(c->rm, c->mi, c->layer) & LK_DENSE);
}

/* InternViT LayerScale: lambda * x (MulBackward0 keeps x for lambda's gradient) */
static int32_t layer_scale(lctx *c, const char *name, int32_t x)
{
    const module_spec *m = c->m;
    uint32_t r = op_row(c, name, "layer_scale");
    int tw = op_trainable(c);
    op_param(c, r, m->hidden_size, tw);
    uint64_t e = x >= 0 ? c->s->t[x].esz : c->dt;
    int32_t y = op_new(c, r, op_mul(c, c->T, m->hidden_size), e > c->wdt ? e : c->wdt);
    sim_node *n = op_node(c, r, y, x, -1, -1, tw);
    if (tw) {
        op_save(c, n, x);
        op_wgrad(c, n, m->hidden_size);
    }
    op_drop(c, x);
    return y;
}

/* sequence parallel: x (sequence-sharded) all-gathered, or f (a partial sum of
 * every token) reduce-scattered, around attention and the MLP (c->on_seq) */
static int32_t seq_redistribute(lctx *c, int32_t x, int gather)
{
    if (!c->on_seq || c->m->kind != MOD_DECODER)
        return x;
    int32_t y = c->on_seq(c, x, gather, c->m->hidden_size);
    op_drop(c, x);
    return y;
}

/* x + f(norm(x)) with the optional post norm and layer scale; under sequence
 * parallel the norm and the residual hold T / seq_shards tokens (SequenceParallel).
 * probs: the attention sublayer's eager probabilities (NULL for the MLP) */
static int32_t sublayer(lctx *c, int32_t x, int which, int32_t *probs)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size;
    if (c->on_seq && m->kind == MOD_DECODER && c->seq_shards > 1)
        T /= c->seq_shards;
    int32_t z = op_decoder_norm(c, norm_name(c, which == 0 ? 0 : m->sandwich_norm ? 2 : 1), x, T,
                                h, m->norm);
    z = seq_redistribute(c, z, 1);
    int32_t f = probs ? self_attention(c, z, probs)
                : moe_here(c) ? moe_block(c, z)
                              : block_dense_mlp(c, z, m->intermediate_size);
    op_drop(c, z);
    f = seq_redistribute(c, f, 0);
    if (m->sandwich_norm) {
        int32_t p = op_decoder_norm(c, norm_name(c, which == 0 ? 1 : 3), f, T, h, m->norm);
        op_drop(c, f);
        f = p;
    }
    if (m->layer_scale)
        f = layer_scale(c, which == 0 ? "layers.lambda_1" : "layers.lambda_2", f);
    if (c->gated) {
        int32_t g = op_tanh_gate(c, which == 0 ? "global_layers.gate_attn" : "global_layers.gate_ffn",
                                 f, op_mul(c, T, h));
        op_drop(c, f);
        f = g;
    }
    uint32_t rres = op_row(c, "layers.residual", "add");
    op_label(c, "residual", rres);
    /* a non-reentrant recompute stops at the last saved tensor: the layer's
     * final sum is never made again (a placeholder carries its gradient) */
    int last = c->early_stop && which == 1;
    int32_t y = op_add(c, rres, x, f, last ? 0 : op_mul(c, T, h), 0);
    op_drop(c, f);
    return y;
}

int32_t block_layer(lctx *c, int32_t x, uint64_t layer)
{
    c->layer = layer;
    if (c->m->kind == MOD_DECODER && (resolved_layer_kind(c->rm, c->mi, layer) & LK_CROSS))
        return block_cross_layer(c, x);
    /* `hidden_states, _ = self.self_attn(...)`: `_` keeps eager's probabilities
     * until the layer returns, after the MLP and the residual, the local freed
     * last (transformers 5.17 modeling_llama.py:308-324; CLIP, SigLIP, Pixtral,
     * InternVL and Mllama layers alike).  Qwen-VL's packed vision attention drops
     * them per chunk (qwen2_vl/modeling_qwen2_vl.py:425), eager() holds none then. */
    int32_t probs = -1;
    int32_t h1 = sublayer(c, x, 0, &probs);
    int32_t out = sublayer(c, h1, 1, NULL);
    op_drop(c, h1);
    op_drop(c, probs);
    return out;
}
