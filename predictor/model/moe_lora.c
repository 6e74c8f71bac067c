/* moe_lora.c - LoRA on a stacked parameter: PEFT's ParamWrapper (peft 0.21,
 * tuners/lora/layer.py), what "all-linear" becomes on the MoE models PEFT
 * converts from their transformers-v4 layout (utils/transformers_weight_conversion
 * .py: the router `gate.weight`, and `gate_up_proj` at rank 2r, `down_proj`).
 *
 *   lora_A: Linear(in, r * E), lora_B: Linear(r * E, out)   (in/out swapped for
 *   a 3-D (E, out, in) stack that is not transposed)
 *   forward, inside _activate_lora: the parameter is replaced by a
 *   parametrization computed once per forward (parametrize.cached()):
 *     E > 1: W' = baddbmm(W, B.view(E, out, r), A.view(E, r, in), alpha=scaling)
 *            with the factors .to(W.dtype) (_LoraFactorsProxy)
 *     E = 1: W' = W + (B @ A) * scaling                     (_LoraParameterProxy)
 *   W' has W's full size and dtype; the matmul that uses it keeps it (and its
 *   input) for backward, which makes a full-size gradient of W' before the
 *   factors' gradients. */
#include "ops.h"

/* W' for the (E, out, in) stack of row r, or -1 when LoRA does not target it */
int32_t moe_lora_weight(lctx *c, const char *name, uint32_t r, uint32_t bit, uint64_t E,
                        uint64_t out, uint64_t in, uint64_t rank_mult)
{
    const lora_spec *L = &c->m->lora;
    if (!L->enabled || !(L->targets & bit))
        return -1;
    uint64_t ae = op_lora_bytes(c), pe = c->wdt, rk = op_mul(c, L->r, rank_mult);
    op_lora_rows(c, name, r, ae);
    uint32_t ra = c->s->rows[r].lora_a, rb = c->s->rows[r].lora_b;
    int live = !c->dead && !c->unused;
    uint64_t na = op_mul3(c, rk, E, in), nb = op_mul3(c, out, rk, E);
    op_param(c, ra, na, live);
    op_param(c, rb, nb, live);
    op_label(c, "lora (parametrized weight)", r);
    int32_t lhs = -1, rhs = -1;
    if (E > 1 && ae != pe) { /* get_delta_factors: lhs / rhs .to(param.dtype) */
        lhs = op_new(c, rb, nb, pe);
        rhs = op_new(c, ra, na, pe);
    }
    int32_t w = op_new(c, r, op_mul3(c, E, out, in), pe);
    sim_node *n = op_node(c, r, w, -1, -1, -1, live);
    op_save(c, n, lhs);
    op_save(c, n, rhs);
    if (live && n) {
        n->wgrad_row = ra;
        op_wgrad_e(c, n, sim_add(c->s, na, nb), ae);
        /* the factors' gradients in W's dtype (bmm), then cast back to ae */
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp, op_mul(c, sim_add(c->s, na, nb), pe));
    }
    op_drop(c, lhs);
    op_drop(c, rhs);
    return w;
}
