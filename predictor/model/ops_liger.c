/* ops_liger.c - model layer: Liger-Kernel's Triton kernels in place of the
 * transformers ops they replace in the decoder, and in the towers and projector where
 * the apply function patches them (training.liger_kernel,
 * spec/spec_liger.c says for which models): what each kernel's Python wrapper
 * allocates around its launch, what it saves for backward, and which gradients
 * it writes in place.  Source: linkedin/Liger-Kernel ead96b61 (2026-08-21),
 * src/liger_kernel/ops/{rms_norm,swiglu,geglu,rope,layer_norm}.py; line numbers are of that
 * commit.  The kernels compute in registers: no intermediate is a tensor. */
#include "ops.h"

/* rms_norm.py:519-521 sizes the fp32 dW partial sums by the device's SM count
 * (multi_processor_count): 132 on an H100 / H200 SXM, the GPUs the defaults
 * are measured on (the truth harness's emulation, tests/truth/emul_liger.py, uses
 * the same) */
#define LIGER_SM_COUNT 132u

static uint64_t esz(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* LigerSwiGLUMLP on a SiLU-gated MLP, LigerGEGLUMLP on Gemma's tanh-GELU one: the same
 * allocations (op_liger_silu_mul) */
int op_liger_swiglu(const lctx *c)
{
    const liger_spec *l = &c->rm->training.liger;
    const module_spec *m = c->m;
    return m->kind == MOD_DECODER && m->mlp == MLP_GATED &&
           ((l->swiglu && m->act == ACT_SILU) || (l->geglu && m->act == ACT_GELU_TANH));
}

int op_liger_rope(const lctx *c)
{
    return c->m->kind == MOD_DECODER && c->rm->training.liger.rope &&
           c->m->pos == POS_ROPE;
}

/* LigerRMSNormFunction (casting_mode llama, offset 0, in_place true: monkey_patch.py:68
 * _patch_rms_norm_module's defaults; Gemma 3: casting gemma, offset 1, in_place false,
 * :1099-1101: the same tensors, fp32 math in registers, and dX a new tensor).  forward (rms_norm_forward :436-510): Y empty in X's
 * dtype (:449), RSTD one fp32 per row (:452-453); saves X, W, RSTD (:657).  backward
 * (rms_norm_backward :513-609): _dW (sm_count, H) fp32 (:529), dX written over dY in place
 * (:540-541), dW = _dW.sum(0).to(W.dtype) (:605) whether or not W needs it (a frozen
 * weight's is made and dropped). */
static int32_t liger_rms_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t w,
                              int in_place)
{
    uint32_t r = op_row(c, name, "rmsnorm");
    int tw = op_trainable(c);
    op_param(c, r, w, tw);
    op_label(c, name, r);
    int32_t y = op_new(c, r, op_mul(c, rows, w), esz(c, x));
    int32_t rstd = op_new(c, r, rows, F32);
    sim_node *n = op_node(c, r, y, x, -1, -1, tw);
    op_save(c, n, x);
    op_save(c, n, rstd);
    if (n) {
        n->grad_views = (uint8_t)in_place; /* else dX = torch.zeros_like(dY) (:543): a new gradient */
        uint64_t tmp = op_mul3(c, LIGER_SM_COUNT, w, F32);
        if (c->wdt != F32) /* the fp32 sum before .to(W.dtype) */
            tmp = sim_add(c->s, tmp, op_mul(c, w, F32));
        if (tw)
            op_wgrad(c, n, w);
        else
            tmp = sim_add(c->s, tmp, op_mul(c, w, c->wdt));
        n->bwd_tmp = tmp;
    }
    op_drop(c, rstd);
    return y;
}

/* LigerLayerNormFunction (ops/layer_norm.py:307-320; _patch_layer_norm_module,
 * monkey_patch.py:103).  forward (layer_norm_forward :169-227): Y empty in X's dtype
 * (:189), Mean and RSTD one per row in X's dtype, not fp32 (:190-191); saves X, W, B,
 * Mean, RSTD (:312).  backward (layer_norm_backward :230-304): _DW and _DB (sm_count, H)
 * fp32 (:257-258), DX a new tensor (:268: the ordinary input gradient), DW / DB =
 * _D*.sum(0).to(dtype) (:301-302) whether or not the weights need them. */
static int32_t liger_layer_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t w)
{
    uint32_t r = op_row(c, name, "layernorm");
    int tw = op_trainable(c);
    op_param(c, r, op_mul(c, 2, w), tw);
    op_label(c, name, r);
    uint64_t e = esz(c, x);
    int32_t y = op_new(c, r, op_mul(c, rows, w), e);
    int32_t mean = op_new(c, r, rows, e), rstd = op_new(c, r, rows, e);
    sim_node *n = op_node(c, r, y, x, -1, -1, tw);
    op_save(c, n, x);
    op_save(c, n, mean);
    op_save(c, n, rstd);
    if (n) {
        uint64_t tmp = op_mul3(c, 2 * LIGER_SM_COUNT, w, F32);
        if (c->wdt != F32) /* one fp32 sum alive before its .to(W.dtype) */
            tmp = sim_add(c->s, tmp, op_mul(c, w, F32));
        if (tw)
            op_wgrad(c, n, op_mul(c, 2, w));
        else
            tmp = sim_add(c->s, tmp, op_mul3(c, 2, w, c->wdt));
        n->bwd_tmp = tmp;
    }
    op_drop(c, mean);
    op_drop(c, rstd);
    return y;
}

/* a block's pre-norm (decoder input / post-attention, the vision blocks' norm1 / norm2)
 * and the decoder's final norm: Liger's where it patches them, else transformers'.
 * Decoder RMSNorms: _patch_rms_norm_module on the base model's norm and every layer's two
 * (monkey_patch.py:278, :284-285; Qwen-VL :1944-1952, :2034-2041).  Vision blocks
 * (liger.vision_norms): Qwen2-VL's LayerNorms (_patch_layer_norm_module, :1937-1939),
 * Qwen2.5-VL's RMSNorms (:2027-2030); the tower's merger ln_q and MLP keep transformers'. */
int32_t op_decoder_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t w,
                        norm_kind k)
{
    const liger_spec *l = &c->rm->training.liger;
    mod_kind mk = c->m->kind;
    int here = mk == MOD_DECODER || (mk == MOD_VISION && l->vision_norms) ||
               (mk == MOD_CONNECTOR && l->connector_norm);
    if (here && k == NORM_RMS && l->rms_norm)
        return liger_rms_norm(c, name, x, rows, w, 1);
    if (here && k == NORM_RMS_GEMMA && l->rms_norm) /* q_norm / k_norm and sandwich norms too */
        return liger_rms_norm(c, name, x, rows, w, 0);
    if (here && k == NORM_LAYER && l->layer_norm)
        return liger_layer_norm(c, name, x, rows, w);
    return op_norm(c, name, x, rows, w, k, 1);
}

/* a vision tower's post_layernorm: Liger's LayerNorm where the apply function patches it
 * whatever layer_norm says (apply_liger_kernel_to_gemma3 :1217), else transformers' */
int32_t op_vision_post_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t w,
                            norm_kind k)
{
    if (k == NORM_LAYER && c->m->kind == MOD_VISION && c->rm->training.liger.vision_post_ln)
        return liger_layer_norm(c, name, x, rows, w);
    return op_norm(c, name, x, rows, w, k, 1);
}

/* LigerSiLUMulFunction (swiglu.py:230-296; LigerGELUMulFunction, geglu.py:87-146, allocates
 * the same: c = empty_like(a), a and b saved, da / db written over them; LigerSwiGLUMLP.forward is
 * down_proj(LigerSiLUMulFunction.apply(gate_proj(x), up_proj(x)))).  forward
 * (swiglu_forward :149-188): c = empty_like(a) (:155), saves a and b (:262), no silu(a)
 * product.  backward (swiglu_backward :191-227): the kernel recomputes silu(a) and writes
 * da over a and db over b (:145, :212, :227), returned as the gradients: the saved pair's storage
 * becomes the two gradients, modelled as the pair released before the two are made
 * (the same bytes live at every point). */
int32_t op_liger_silu_mul(lctx *c, int32_t a, int32_t b, uint64_t elems)
{
    uint32_t r = op_row(c, "layers.mlp.act_fn", "activation");
    op_label(c, "layers.mlp.act_fn (liger swiglu)", r);
    int32_t y = op_new(c, r, elems, esz(c, a));
    sim_node *n = op_node(c, r, y, a, b, -1, 0);
    op_save(c, n, a);
    op_save(c, n, b);
    if (n)
        n->free_first = 1;
    return y;
}

/* LigerRopeFunction (rope.py:204-239; liger_rotary_pos_emb replaces the modeling
 * module's apply_rotary_pos_emb, monkey_patch.py:253).  forward (rope_forward :115-158): q, k transposed to
 * (b, s, h, d), the layout the projection wrote, so .contiguous() copies nothing
 * (:131-132), and rotated in place: the output is the projection's storage; saves cos
 * and sin (:226).  backward (rope_backward :161-201, dq.contiguous() :176): dq, dk rotated in place. */
int32_t op_liger_rotary(lctx *c, uint32_t r, int32_t x, uint64_t elems)
{
    int32_t y = op_view(c, r, x, op_mul(c, elems, esz(c, x)));
    sim_node *n = op_node(c, r, y, x, -1, -1, 0);
    op_save(c, n, c->cos);
    op_save(c, n, c->sin);
    if (n)
        n->grad_views = 1;
    return y;
}
