/* moe.c - a routed mixture-of-experts MLP as transformers 5.17 runs it
 * (integrations/moe.py and the model's SparseMoeBlock / TopKRouter):
 *   router: logits = x W_r^T (T x E), softmax in fp32, top-k, renormalised
 *     (Mixtral always, Qwen3-MoE when norm_topk_prob; Qwen3 casts the weights
 *     back to the model dtype, Mixtral keeps them fp32);
 *   grouped_mm (default): the T*k (token, expert) pairs sorted by expert, one
 *     grouped matmul each for gate_up and down - memory does not depend on the
 *     routing;
 *   eager: a loop over experts with select()ed weight slices - the working set
 *     is the busiest expert's (moe_imbalance x the fair share), and each
 *     SelectBackward makes a full-size gradient of the stacked weights;
 *   transformers < 5: one nn.Linear per expert (no full-size select gradients).
 * Qwen2-MoE adds a shared expert with a sigmoid gate. */
#include "block.h"
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* returns the routing weights (T x k) and holds nothing else */
static int32_t router(lctx *c, int32_t z, uint32_t r)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, E = m->num_experts, k = m->experts_per_tok;
    int tw = op_trainable(c);
    op_param(c, r, op_mul(c, E, m->hidden_size), tw);
    int32_t wl = moe_lora_weight(c, "layers.mlp.gate", r, LT_ROUTER, 1, E, m->hidden_size, 1);
    op_label(c, "router", r);
    int32_t logits = op_new(c, r, op_mul(c, T, E), esz_of(c, z));
    sim_node *n = op_node(c, r, logits, z, wl, -1, tw);
    if (tw || wl >= 0)
        op_save(c, n, z);
    op_save(c, n, wl);
    op_drop(c, wl);
    if (tw)
        op_wgrad(c, n, op_mul(c, E, m->hidden_size));
    int32_t l32 = op_plain(c, r, logits, -1, op_mul(c, T, E), F32); /* input to fp32 */
    int32_t probs = op_new(c, r, op_mul(c, T, E), F32);
    n = op_node(c, r, probs, l32, -1, -1, 0);
    op_save(c, n, probs);
    op_drop(c, l32);
    if (m->router_logits)
        c->late_drop[3] = logits; /* kept for the load-balancing loss (late list) */
    else
        op_drop(c, logits);
    int32_t vals = op_new(c, r, op_mul(c, T, k), F32); /* topk values, renormalised in place */
    int32_t idx = op_new(c, r, op_mul(c, T, k), I64);
    n = op_node(c, r, vals, probs, -1, -1, 0);
    op_save(c, n, idx);
    op_drop(c, probs);
    op_drop(c, idx); /* the indices live on in the saved sets */
    if (m->router_fp32)
        return vals;
    int32_t w = op_plain(c, r, vals, -1, op_mul(c, T, k), c->dt);
    op_drop(c, vals);
    return w;
}

/* grouped_mm_experts_forward (integrations/moe.py) for S = T*k pairs */
static int32_t experts_grouped(lctx *c, int32_t z, int32_t w, uint32_t r)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, I = m->moe_intermediate_size;
    uint64_t S = op_mul(c, T, m->experts_per_tok), dt = esz_of(c, z), we = esz_of(c, w);
    int32_t perm = op_new(c, r, S, I64), ids = op_new(c, r, S, I64); /* sort */
    int32_t tok = op_new(c, r, S, I64);                               /* perm // k */
    int32_t sel = op_new(c, r, op_mul(c, S, h), dt);                  /* x[perm // k] */
    sim_node *n = op_node(c, r, sel, z, -1, -1, 0);
    op_save(c, n, tok);
    op_drop(c, tok);
    int32_t sw = op_new(c, r, S, we); /* sample_weights[perm] */
    n = op_node(c, r, sw, w, -1, -1, 0);
    op_save(c, n, perm);
    int32_t mask = op_new(c, r, S, 1); /* sentinel mask */
    op_drop(c, ids);
    n = op_node(c, r, sel, sel, -1, -1, 0); /* masked_fill_ in place */
    op_save(c, n, mask);
    uint32_t rgu = op_row(c, "layers.mlp.experts.gate_up_proj", "experts");
    uint32_t rdn = op_row(c, "layers.mlp.experts.down_proj", "experts");
    int tw = op_trainable(c);
    uint64_t Wgu = op_mul3(c, m->num_experts, 2 * I, h), Wdn = op_mul3(c, m->num_experts, h, I);
    op_param(c, rgu, Wgu, tw);
    op_param(c, rdn, Wdn, tw);
    /* PEFT converts w1 + w3 into gate_up_proj at rank 2r */
    int32_t lgu = moe_lora_weight(c, "layers.mlp.experts.gate_up_proj", rgu, LT_EXPERTS,
                                  m->num_experts, 2 * I, h, 2);
    int32_t gu = op_new(c, rgu, op_mul(c, S, 2 * I), dt);
    n = op_node(c, rgu, gu, sel, lgu, -1, tw);
    if (tw || lgu >= 0)
        op_save(c, n, sel);
    op_save(c, n, lgu);
    op_drop(c, lgu);
    if (tw)
        op_wgrad(c, n, Wgu);
    op_drop(c, sel);
    int32_t gu2 = op_plain(c, rgu, gu, -1, op_mul(c, S, 2 * I), dt); /* masked_fill */
    op_drop(c, gu);
    int32_t gate = op_view(c, rgu, gu2, op_mul3(c, S, I, dt)), up = op_view(c, rgu, gu2, op_mul3(c, S, I, dt));
    n = op_node(c, rgu, gate, gu2, -1, -1, 0); /* chunk(2): SplitBackward cats the two grads */
    sim_node_out(c->s, n, up);
    op_drop(c, gu2);
    int32_t act = op_activation(c, "layers.mlp.experts.act_fn", gate, op_mul(c, S, I), m->act);
    int32_t prod = op_mul_saved(c, rgu, act, up, op_mul(c, S, I), dt);
    op_drop(c, gate);
    op_drop(c, up);
    op_drop(c, act);
    int32_t ldn = moe_lora_weight(c, "layers.mlp.experts.down_proj", rdn, LT_EXPERTS,
                                  m->num_experts, h, I, 1);
    int32_t dn = op_new(c, rdn, op_mul(c, S, h), dt);
    n = op_node(c, rdn, dn, prod, ldn, -1, tw);
    if (tw || ldn >= 0)
        op_save(c, n, prod);
    op_save(c, n, ldn);
    op_drop(c, ldn);
    if (tw)
        op_wgrad(c, n, Wdn);
    op_drop(c, prod);
    int32_t dn2 = op_plain(c, rdn, dn, -1, op_mul(c, S, h), dt); /* masked_fill */
    op_drop(c, dn);
    op_drop(c, mask);
    uint64_t oe = dt > we ? dt : we;
    int32_t wo = op_mul_saved(c, rdn, dn2, sw, op_mul(c, S, h), oe); /* * weights */
    op_drop(c, dn2);
    op_drop(c, sw);
    int32_t inv = op_new(c, r, S, I64);
    op_drop(c, perm);
    int32_t ro = op_new(c, rdn, op_mul(c, S, h), oe); /* weighted_out[inv_perm] */
    n = op_node(c, rdn, ro, wo, -1, -1, 0);
    op_save(c, n, inv);
    op_drop(c, inv);
    op_drop(c, wo);
    int32_t sum = op_plain(c, rdn, ro, -1, op_mul(c, T, h), oe); /* view(T, k, h).sum(1) */
    op_drop(c, ro);
    if (oe == dt)
        return sum;
    int32_t y = op_plain(c, rdn, sum, -1, op_mul(c, T, h), dt);
    op_drop(c, sum);
    return y;
}

/* the expert loop (eager, and every transformers < 5): the saved sets add up
 * to the grouped ones; the working set is the busiest expert's; transformers 5
 * selects weight slices, so each expert's backward makes full-size gradients
 * of the stacked weights (SelectBackward: zeros + the slice) */
static int32_t experts_eager(lctx *c, int32_t z, int32_t w, uint32_t r)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, I = m->moe_intermediate_size, E = m->num_experts;
    uint64_t S = op_mul(c, T, m->experts_per_tok), dt = esz_of(c, z);
    uint64_t busy = (uint64_t)((double)S / (double)E * m->moe_imbalance + 0.999999);
    if (busy > T)
        busy = T;
    int tw = op_trainable(c);
    int stacked = c->rm->framework.tf_major >= 5;
    uint32_t rgu = op_row(c, stacked ? "layers.mlp.experts.gate_up_proj" : "layers.mlp.experts.w1_w3",
                          "experts");
    uint32_t rdn = op_row(c, stacked ? "layers.mlp.experts.down_proj" : "layers.mlp.experts.w2",
                          "experts");
    uint64_t Wgu = op_mul3(c, E, 2 * I, h), Wdn = op_mul3(c, E, h, I);
    op_param(c, rgu, Wgu, tw);
    op_param(c, rdn, Wdn, tw);
    int32_t fin = op_new(c, r, op_mul(c, T, h), dt);             /* zeros_like */
    int32_t onehot = op_new(c, r, op_mul(c, S, E), I64);         /* one_hot(top_k_index) */
    /* what every expert keeps: its tokens, gate_up output, activation, product,
     * down output, and the index_add indices */
    uint64_t keep = sim_add(c->s, op_mul3(c, S, h + 2 * I + I + I + h, dt), op_mul(c, S, I64));
    int32_t saved = op_new(c, rgu, keep, 1);
    sim_node *n = op_node(c, rgu, fin, z, w, -1, tw);
    op_save(c, n, saved);
    if (n) {
        if (tw) {
            op_wgrad(c, n, Wgu);
            op_wgrad(c, n, Wdn);
        }
        /* one expert's backward: its grads, and with stacked weights the
         * full-size select gradients of both weights */
        uint64_t one = op_mul3(c, busy, 2 * h + 4 * I, dt);
        if (stacked && tw)
            one = sim_add(c->s, one, op_mul(c, Wgu > Wdn ? Wgu : Wdn, c->gdt));
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp, one);
    }
    op_drop(c, saved);
    if (!c->counting) /* one expert's working set in forward */
        sim_transient(c->s, rgu, op_mul3(c, busy, 2 * h + 4 * I, dt));
    op_drop(c, onehot);
    (void)rdn;
    return fin;
}

/* Qwen2-MoE: shared_expert(x) * sigmoid(shared_expert_gate(x)) */
static int32_t shared_expert(lctx *c, int32_t z)
{
    const module_spec *m = c->m;
    uint64_t T = c->T;
    int32_t s = block_dense_mlp(c, z, m->shared_expert_intermediate_size);
    if (!m->shared_expert_gate)
        return s;
    int32_t g = op_linear(c, "layers.mlp.shared_expert_gate", z, T, m->hidden_size, 1, 0, 0);
    uint32_t r = op_row(c, "layers.mlp.shared_expert_gate", "linear");
    int32_t sg = op_new(c, r, T, esz_of(c, g));
    sim_node *n = op_node(c, r, sg, g, -1, -1, 0);
    op_save(c, n, sg);
    op_drop(c, g);
    int32_t y = op_mul_saved(c, r, s, sg, op_mul(c, T, m->hidden_size), esz_of(c, s));
    op_drop(c, s);
    op_drop(c, sg);
    return y;
}

int32_t moe_block(lctx *c, int32_t z)
{
    const module_spec *m = c->m;
    uint32_t r = op_row(c, "layers.mlp.gate", "router");
    int32_t sh = m->shared_expert_intermediate_size ? shared_expert(c, z) : -1;
    int32_t w = router(c, z, r);
    int grouped = m->experts == EXPERTS_GROUPED && c->rm->framework.tf_major >= 5;
    int32_t y = grouped ? experts_grouped(c, z, w, r) : experts_eager(c, z, w, r);
    op_drop(c, w);
    if (sh < 0)
        return y;
    int32_t s = op_add(c, r, y, sh, op_mul(c, c->T, m->hidden_size), 0);
    op_drop(c, y);
    op_drop(c, sh);
    return s;
}
