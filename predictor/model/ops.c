/* ops.c - THE op formulas, one function per PyTorch op (or fused group): what
 * it allocates, in which dtype, and what autograd saves for backward
 * (torch 2.x, CUDA; transformers 5.x modeling code).  Blocks (block.c) and
 * modules compose these; nothing else in the predictor knows an op.
 * Notation in comments: T tokens, h hidden, V vocab, dt activation dtype
 * bytes.  Output dtypes follow PyTorch's promotion and autocast: a tensor
 * carries its element size, so an fp32 residual stream under autocast
 * (fp32 weights) stays fp32 while Linear outputs are bf16. */
#include "ops.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t esz(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* ---- activations ------------------------------------------------------------------ */

/* gelu / gelu_pytorch_tanh / silu keep their input; relu keeps its output.
 * quick_gelu (x * sigmoid(1.702 x)): the scalar product is a temporary,
 * SigmoidBackward keeps its output, MulBackward0 keeps x and the sigmoid. */
int32_t op_activation(lctx *c, const char *name, int32_t x, uint64_t elems, act_kind k)
{
    uint32_t r = op_row(c, name, "activation");
    uint64_t e = esz(c, x);
    op_label(c, name, r);
    if (k == ACT_QUICK_GELU) {
        int32_t t = op_plain(c, r, x, -1, elems, e);
        int32_t sg = op_new(c, r, elems, e);
        sim_node *n = op_node(c, r, sg, t, -1, -1, 0);
        op_save(c, n, sg);
        op_drop(c, t);
        int32_t y = op_mul_saved(c, r, x, sg, elems, e);
        op_drop(c, sg);
        return y;
    }
    int32_t y = op_new(c, r, elems, e);
    sim_node *n = op_node(c, r, y, x, -1, -1, 0);
    op_save(c, n, k == ACT_RELU ? y : x);
    return y;
}

/* ---- nn.Linear, PEFT LoRA, bitsandbytes 4/8-bit bases --------------------------------- */

/* bytes of a quantized weight: nf4/fp4 pack two values a byte plus an fp32
 * absmax per block (double quantization: a uint8 absmax per block plus an
 * fp32 one per 256 blocks); int8 (LLM.int8) one byte plus an fp32 scale per row
 * (bitsandbytes functional.quantize_4bit / Int8Params) */
static uint64_t quant_bytes(lctx *c, uint64_t in, uint64_t out)
{
    const module_spec *m = c->m;
    uint64_t n = op_mul(c, in, out);
    if (m->quant == QUANT_INT8)
        return sim_add(c->s, n, op_mul(c, out, F32));
    uint64_t blocks = (n + m->quant_block - 1) / m->quant_block;
    uint64_t absmax = m->double_quant ? sim_add(c->s, blocks, ((blocks + 255) / 256) * F32 + F32)
                                      : op_mul(c, blocks, F32);
    return sim_add(c->s, (n + 1) / 2, absmax);
}


/* Does the Linear keep its input x for backward?  aten's AddmmBackward / MmBackward
 * keeps x only when W needs a gradient.  Under ZeRO-3, DeepSpeed's Init(module=)
 * (runtime/zero/parameter_offload.py:270 _convert_to_zero_parameters) replaces
 * torch.nn.functional.linear with zero3_linear_wrap when memory_efficient_linear
 * (default true, zero/config.py:346; partition_parameters.py:1090-1091 and
 * :412-419), whose LinearFunctionForZeroStage3.setup_context calls
 * ctx.save_for_backward(input, weight, bias) whenever autograd records it
 * (zero/linear.py:100-105): any input or weight requiring grad.  So a frozen
 * weight whose input requires grad (a frozen tower under enable_input_require_grads,
 * a frozen LLM behind a trained connector, a LoRA base layer) keeps its input too. */
int op_linear_keeps_input(const lctx *c, int tw, int32_t x)
{
    return tw || (c->deepspeed && c->zero == 3 && op_rg(c, x));
}

/* y = x W^T (+ b).  AddmmBackward keeps x when W needs a gradient and W (a
 * parameter) when x needs one; under autocast the bf16 casts of W and of an
 * fp32 x are what it keeps.  Backward: dx (rows x in), dW (out x in, .grad),
 * db.  A quantized frozen base is dequantized to the compute dtype in forward
 * and again in backward (bitsandbytes MatMul4Bit). */
int32_t op_linear(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t in, uint64_t out,
                  int bias, uint32_t lora_bit)
{
    uint32_t r = op_row(c, name, "linear");
    int tw = op_trainable(c);
    uint64_t np = sim_add(c->s, op_mul(c, in, out), bias ? out : 0);
    op_param(c, r, np, tw);
    op_label(c, name, r);
    int quant = c->m->quant != QUANT_NONE;
    if (c->counting) {
        sim_row *R = &c->s->rows[r];
        R->mat_rows = out;
        R->mat_cols = in;
        if (quant)
            R->qbytes = sim_add(c->s, R->qbytes, sim_add(c->s, quant_bytes(c, in, out),
                                                       bias ? out * c->dt : 0));
    }
    int32_t wcast = quant ? op_new(c, r, op_mul(c, in, out), c->dt) : op_weight_cast(c, r, np, tw);
    int32_t xc = x;
    if (c->amp && esz(c, x) != c->dt) /* autocast: the input cast to bf16 */
        xc = op_new(c, r, op_mul(c, rows, in), c->dt);
    uint64_t oe = c->amp || quant ? c->dt : c->wdt;
    /* at::linear: a 3-D input with a bias is one addmm, without one a matmul's aten.mm */
    int32_t y = bias || quant ? op_new(c, r, op_mul(c, rows, out), oe)
                              : op_mm_new(c, r, op_mul(c, rows, out), oe);
    sim_node *n = op_node(c, r, y, xc != x ? x : xc, -1, -1, tw);
    if (n) {
        if (tw)
            op_save(c, n, xc);
        else if (op_linear_keeps_input(c, tw, x) && !quant)
            op_save(c, n, x); /* ZeRO-3's linear: the input as passed */
        if (op_rg(c, x) && !quant)
            op_save(c, n, wcast);
        if (tw)
            op_wgrad(c, n, np);
        if (quant && op_rg(c, x)) /* dequantized again for dx */
            n->bwd_tmp = sim_add(c->s, n->bwd_tmp, op_mul3(c, in, out, c->dt));
    }
    if (c->on_linear && !c->counting)
        c->on_linear(c, r, lora_bit, x, y, n, rows, out);
    if (xc != x)
        op_drop(c, xc);
    op_drop(c, wcast);
    const lora_spec *L = &c->m->lora;
    if (!L->enabled || !(L->targets & lora_bit))
        return y;
    return op_lora(c, name, r, x, y, rows, in, out);
}

/* ---- norms ------------------------------------------------------------------------- */

/* to(float32) when not fp32 already (ToCopyBackward keeps nothing) */
static int32_t to_fp32(lctx *c, uint32_t r, int32_t x, uint64_t elems)
{
    if (esz(c, x) == F32) {
        op_hold(c, x);
        return x;
    }
    return op_plain(c, r, x, -1, elems, F32);
}

/* x32 * rsqrt(x32.pow(2).mean(-1) + eps): PowBackward0 keeps x32, MeanBackward
 * keeps sizes, RsqrtBackward keeps its result, MulBackward0 keeps x32 and the
 * rsqrt (its rsqrt gradient is a (grad * x32) product, then summed).
 * PowBackward0's backward (torch/csrc/autograd/FunctionsManual.cpp pow_backward:
 * `return grad * (exp * self.pow(exp - 1)).conj()`) makes self.pow(1), exp * it and
 * the product with grad, three rows x width fp32 tensors; the first two are C++
 * temporaries of that one full-expression, so they die only after the product is
 * made: all three are alive together, beside the gradient MulBackward0 gave x32
 * before, into which the product is then added (in place: input_buffer.cpp
 * accumulate).  The truth trace of tests/truth/data/traces/
 * llama-tp-2-full-bf16-sdpa-eaedef1e3a.txt shows them at its peak, in the final
 * norm's backward: pow.Tensor_Scalar, mul.Scalar and two mul.Tensor of T x h x 4 B
 * beside MeanBackward's div.Scalar. */
static int32_t rms_core(lctx *c, uint32_t r, int32_t x32, uint64_t rows, uint64_t w)
{
    uint64_t Tw = op_mul(c, rows, w);
    int32_t p = op_new(c, r, Tw, F32);
    sim_node *n = op_node(c, r, p, x32, -1, -1, 0);
    op_save(c, n, x32);
    if (n)
        n->bwd_tmp = op_mul(c, Tw, 3 * F32);
    int32_t v = op_plain(c, r, p, -1, rows, F32); /* mean */
    op_drop(c, p);
    int32_t ve = op_plain(c, r, v, -1, rows, F32); /* + eps */
    op_drop(c, v);
    int32_t rs = op_new(c, r, rows, F32);
    n = op_node(c, r, rs, ve, -1, -1, 0);
    op_save(c, n, rs);
    op_drop(c, ve);
    int32_t y32 = op_new(c, r, Tw, F32);
    n = op_node(c, r, y32, x32, rs, -1, 0);
    op_save(c, n, x32);
    op_save(c, n, rs);
    if (n)
        n->bwd_tmp = op_mul(c, Tw, F32);
    op_drop(c, rs);
    return y32;
}

/* LlamaRMSNorm (and the Qwen/InternViT/Mixtral copies): weight * y.to(dtype) */
static int32_t rmsnorm(lctx *c, uint32_t r, int32_t x, uint64_t rows, uint64_t w, int weight)
{
    uint64_t Tw = op_mul(c, rows, w), e = esz(c, x);
    int tw = op_trainable(c) && weight;
    int32_t x32 = to_fp32(c, r, x, Tw);
    int32_t y32 = rms_core(c, r, x32, rows, w);
    op_drop(c, x32);
    int32_t y = y32;
    if (e != F32) {
        y = op_plain(c, r, y32, -1, Tw, e);
        op_drop(c, y32);
    }
    if (!weight)
        return y;
    uint64_t oe = e > c->wdt ? e : c->wdt;
    int32_t z = op_new(c, r, Tw, oe);
    sim_node *n = op_node(c, r, z, y, -1, -1, tw);
    if (tw) {
        op_save(c, n, y);
        op_wgrad(c, n, w);
        if (n) /* dW = (grad * y).sum(rows) */
            n->bwd_tmp = sim_add(c->s, n->bwd_tmp, op_mul(c, Tw, oe));
    }
    op_drop(c, y);
    return z;
}

/* Gemma3RMSNorm: (x.float() normalised * (1 + weight.float())).type_as(x) -
 * the product is fp32 and MulBackward0 keeps the fp32 normalised input */
static int32_t gemma_rmsnorm(lctx *c, uint32_t r, int32_t x, uint64_t rows, uint64_t w)
{
    uint64_t Tw = op_mul(c, rows, w), e = esz(c, x);
    int tw = op_trainable(c);
    int32_t x32 = to_fp32(c, r, x, Tw);
    int32_t n32 = rms_core(c, r, x32, rows, w);
    op_drop(c, x32);
    int32_t o = op_new(c, r, Tw, F32);
    sim_node *n = op_node(c, r, o, n32, -1, -1, tw);
    if (tw) {
        op_save(c, n, n32);
        op_wgrad(c, n, w);
        if (n)
            n->bwd_tmp = op_mul(c, Tw, F32);
    }
    op_drop(c, n32);
    if (e == F32)
        return o;
    int32_t y = op_plain(c, r, o, -1, Tw, e);
    op_drop(c, o);
    return y;
}

/* nn.LayerNorm (native_layer_norm): keeps its input, mean and rstd (fp32,
 * one per row) when input or weight needs a gradient.  CUDA autocast runs it
 * in fp32: an fp32 copy of a bf16 input, and an fp32 output. */
static int32_t layernorm(lctx *c, uint32_t r, int32_t x, uint64_t rows, uint64_t w)
{
    int tw = op_trainable(c);
    uint64_t Tw = op_mul(c, rows, w);
    int32_t xi = c->amp ? to_fp32(c, r, x, Tw) : x;
    int32_t mean = op_new(c, r, rows, F32), rstd = op_new(c, r, rows, F32);
    int32_t y = op_new(c, r, Tw, esz(c, xi));
    sim_node *n = op_node(c, r, y, xi, -1, -1, tw);
    op_save(c, n, xi);
    op_save(c, n, mean);
    op_save(c, n, rstd);
    if (tw)
        op_wgrad(c, n, 2 * w);
    op_drop(c, mean);
    op_drop(c, rstd);
    if (c->amp) /* to_fp32's copy, or its hold on an fp32 x */
        op_drop(c, xi);
    return y;
}

int32_t op_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t width, norm_kind k,
                int has_weight)
{
    if (k == NORM_NONE) {
        op_hold(c, x);
        return x;
    }
    uint32_t r = op_row(c, name, k == NORM_LAYER ? "layernorm" : "rmsnorm");
    op_param(c, r, k == NORM_LAYER ? 2 * width : has_weight ? width : 0, op_trainable(c));
    op_label(c, name, r);
    if (k == NORM_LAYER)
        return layernorm(c, r, x, rows, width);
    if (k == NORM_RMS_GEMMA)
        return gemma_rmsnorm(c, r, x, rows, width);
    return rmsnorm(c, r, x, rows, width, has_weight);
}

/* tanh(gate) * x: TanhBackward keeps the (scalar) result, MulBackward0 keeps x
 * for the gate's gradient */
int32_t op_tanh_gate(lctx *c, const char *name, int32_t x, uint64_t elems)
{
    uint32_t r = op_row(c, name, "gate");
    int tw = op_trainable(c);
    op_param(c, r, 1, tw);
    uint64_t e = x >= 0 ? c->s->t[x].esz : c->dt;
    int32_t y = op_new(c, r, elems, e);
    sim_node *n = op_node(c, r, y, x, -1, -1, tw);
    if (tw) {
        op_save(c, n, x);
        op_wgrad(c, n, 1);
    }
    return y;
}

