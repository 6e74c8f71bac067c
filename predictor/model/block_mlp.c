/* block_mlp.c - the dense MLP of a transformer layer, shared by the layer
 * (block.c), the MoE's shared expert (moe.c) and Mllama's cross-attention
 * layer (cross.c): below all three, so none of them calls back into another. */
#include "block.h"
#include "ops.h"

/* a dense MLP: fc1 -> act -> fc2, or down(act(gate(x)) * up(x)) (SiluBackward
 * keeps gate's output, MulBackward0 keeps both factors, down keeps the product;
 * Liger's SwiGLU keeps gate's and up's outputs only) */
int32_t block_dense_mlp(lctx *c, int32_t z, uint64_t I)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, TI = op_mul(c, T, I);
    if (m->mlp == MLP_FC) {
        int32_t f1 = op_linear(c, "layers.mlp.fc1", z, T, h, I, m->mlp_bias, LT_FC1);
        int32_t ac = op_activation(c, "layers.mlp.act", f1, TI, m->act);
        op_drop(c, f1);
        int32_t y = op_linear(c, "layers.mlp.fc2", ac, T, I, h, m->mlp_bias, LT_FC2);
        op_drop(c, ac);
        return y;
    }
    int32_t g = op_linear(c, "layers.mlp.gate_proj", z, T, h, I, m->mlp_bias, LT_GATE);
    int32_t u = op_linear(c, "layers.mlp.up_proj", z, T, h, I, m->mlp_bias, LT_UP);
    if (op_liger_swiglu(c)) { /* LigerSwiGLUMLP (ops_liger.c) */
        int32_t lp = op_liger_silu_mul(c, g, u, TI);
        op_drop(c, g);
        op_drop(c, u);
        int32_t ly = op_linear(c, "layers.mlp.down_proj", lp, T, I, h, m->mlp_bias, LT_DOWN);
        op_drop(c, lp);
        return ly;
    }
    int32_t sg = op_activation(c, "layers.mlp.act_fn", g, TI, m->act);
    op_drop(c, g);
    uint32_t r = op_row(c, "layers.mlp.act_fn", "activation");
    uint64_t e = sg >= 0 ? c->s->t[sg].esz : c->dt;
    int32_t p = op_mul_saved(c, r, sg, u, TI, e);
    op_drop(c, sg);
    op_drop(c, u);
    int32_t y = op_linear(c, "layers.mlp.down_proj", p, T, I, h, m->mlp_bias, LT_DOWN);
    op_drop(c, p);
    return y;
}
