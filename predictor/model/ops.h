/* ops.h - the op formulas: what each PyTorch op of a training step allocates
 * and what autograd keeps for backward (ops.c), for the blocks to compose. */
#ifndef MM_OPS_H
#define MM_OPS_H

#include "prog.h"

#define F32 4u
#define I64 8u

/* bookkeeping helpers (ops_tensor.c) */
int op_trainable(const lctx *c);
uint32_t op_row(lctx *c, const char *name, const char *kind);
void op_param(lctx *c, uint32_t r, uint64_t n, int trainable);
int32_t op_new(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per);
int32_t op_view(lctx *c, uint32_t r, int32_t base, uint64_t vbytes);
static inline int op_rg(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].rg;
}
/* release / take a reference (no tensors while counting); inline: every op does */
static inline void op_drop(lctx *c, int32_t id)
{
    if (!c->counting)
        sim_drop(c->s, id);
}

static inline void op_hold(lctx *c, int32_t id)
{
    if (!c->counting)
        sim_hold(c->s, id);
}
sim_node *op_node(lctx *c, uint32_t r, int32_t out, int32_t in0, int32_t in1, int32_t in2,
                  int trainable_w);
void op_save(lctx *c, sim_node *n, int32_t id);
void op_wgrad(lctx *c, sim_node *n, uint64_t elems);
/* the same with a gradient of gdt bytes per element */
void op_wgrad_e(lctx *c, sim_node *n, uint64_t elems, uint64_t gdt);
/* selective checkpointing (torchtitan op policy): an output the policy saves
 * (MUST_SAVE) - kept from the layer's forward to its re-run, which takes it
 * back instead of computing it again; op_mm_new: an aten.mm output, saved
 * unless it is the layer's 2nd, 4th, ... mm */
int32_t op_sac_new(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per);
int32_t op_mm_new(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per);
/* a selectively checkpointed layer's forward starts / ends; its re-run starts / ends */
void op_sac_begin(lctx *c, uint64_t layer, int recompute);
void op_sac_end(lctx *c);
/* hold id until the forward ends */
void op_hold_forward(lctx *c, int32_t id);
/* autocast's cast of an fp32 weight to the compute dtype (-1 when none) */
int32_t op_weight_cast(lctx *c, uint32_t r, uint64_t np, int trainable);
void op_label(lctx *c, const char *l, uint32_t r);
uint64_t op_mul(lctx *c, uint64_t a, uint64_t b);
uint64_t op_mul3(lctx *c, uint64_t a, uint64_t b, uint64_t cc);

/* y = x W^T (+ b), PEFT LoRA around it when the module targets lora_bit */
/* a Linear keeps its input: its weight trains, or ZeRO-3's linear and x requires grad */
int op_linear_keeps_input(const lctx *c, int tw, int32_t x);
int32_t op_linear(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t in, uint64_t out,
                  int bias, uint32_t lora_bit);
/* ops_lora.c: PEFT's LoRA around a linear's output y; returns the result */
int32_t op_lora(lctx *c, const char *name, uint32_t r, int32_t x, int32_t y, uint64_t rows,
                uint64_t in, uint64_t out);
/* LoRA on the output layer (target lm_head) around its logits, and on the token
 * embedding (target embed_tokens) around its output: the result, or the input
 * when not targeted */
int32_t op_lora_head(lctx *c, int32_t z, int32_t logits, uint64_t rows, uint64_t h, uint64_t V);
int32_t op_lora_embedding(lctx *c, int32_t y, uint64_t T, uint64_t V, uint64_t h);
/* the LoRA adapters' parameter dtype, and their rows (name.lora_A / lora_B) of row r */
uint64_t op_lora_bytes(const lctx *c);
void op_lora_rows(lctx *c, const char *name, uint32_t r, uint64_t ae);
/* moe_lora.c: PEFT ParamWrapper on an (E, out, in) stack of row r: the
 * parametrized weight W' (a new tensor), or -1 when LoRA does not target it */
int32_t moe_lora_weight(lctx *c, const char *name, uint32_t r, uint32_t bit, uint64_t E,
                        uint64_t out, uint64_t in, uint64_t rank_mult);
/* elementwise, nothing saved (add, scalar mul, cast, copy) */
int32_t op_plain(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes);
/* a + b where backward passes the gradient through (residual connections) */
int32_t op_add(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes);
/* a * b, both need saving for the other's gradient */
int32_t op_mul_saved(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes);
/* tanh(gate) * x with a one-element gate parameter (Mllama) */
int32_t op_tanh_gate(lctx *c, const char *name, int32_t x, uint64_t elems);
/* a norm of kind k over `width` for `rows` rows (rms, layer, gemma rms) */
int32_t op_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t width,
                norm_kind k, int has_weight);
int32_t op_activation(lctx *c, const char *name, int32_t x, uint64_t elems, act_kind k);
/* rotary embedding of x (elems) with the shared cos/sin */
int32_t op_rope(lctx *c, uint32_t r, int32_t x, uint64_t elems, int fp32);
/* ops_liger.c: Liger-Kernel's kernels in the decoder (training.liger_kernel): whether
 * SwiGLU / RoPE are Liger's here; a decoder norm (Liger's RMSNorm when patched, else
 * op_norm); LigerSiLUMulFunction of gate and up; LigerRopeFunction on q or k */
int op_liger_swiglu(const lctx *c);
int op_liger_rope(const lctx *c);
int32_t op_decoder_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t w,
                        norm_kind k);
int32_t op_vision_post_norm(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t w,
                            norm_kind k);
int32_t op_liger_silu_mul(lctx *c, int32_t a, int32_t b, uint64_t elems);
int32_t op_liger_rotary(lctx *c, uint32_t r, int32_t x, uint64_t elems);
/* attention core: q (T x heads x d), k/v (T x kv x d); chunks of S tokens */
typedef struct attn_opts {
    uint64_t B, S, heads, kv, d;
    uint64_t Skv;           /* keys per sequence (cross-attention), 0 = S */
    uint64_t chunks;        /* packed sequences: B x chunks sequences run one chunk at a
                               time (attention per image), outputs concatenated */
    int causal;
    int32_t mask;           /* an explicit mask tensor (sdpa/eager), -1 none */
    int softmax_fp32;
    int float_bias;         /* the mask is an additive float tensor SDPA takes as it is */
    int32_t *weights;       /* eager: receives the probabilities it returns beside the
                               output, held for the caller to drop; NULL (or no eager
                               weights): -1, nothing held */
} attn_opts;
int32_t op_attention(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v, const attn_opts *o);
/* nn.Embedding lookup of T tokens into width h; V rows */
int32_t op_embedding(lctx *c, const char *name, uint64_t T, uint64_t V, uint64_t h, int tied,
                     uint64_t extra_bwd);
/* the loss over logits of the decoder's tokens (chunked / fused variants) */
int32_t op_lm_head_loss(lctx *c, int32_t z, uint64_t rows, uint64_t h, uint64_t V, int tied);
/* before (SIM_LAYER_BEGIN) or after (SIM_LAYER_END) unit OP_UNIT_* runs, when the
 * train layer asked (lctx.unit_events): its on_layer hook, as stack.c's layer loop */
void op_unit_event(lctx *c, uint64_t unit, int what);

#endif
