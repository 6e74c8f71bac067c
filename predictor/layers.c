/* layers.c - THE layer formulas.  Every op a training step runs, in order,
 * with what PyTorch (>= 2.1, CUDA) and transformers (>= 4.46) allocate and what
 * autograd keeps alive for backward.  Check this file against the paper's
 * four factors: parameters (param()), gradients (node->wgrad_bytes),
 * optimizer states (predict.c), activations (sim_save) - the timeline engine
 * (sim.c) turns them into a peak.  Notation in comments: T tokens (b*s),
 * h hidden, i intermediate, a heads, kv key/value heads, d head_dim, V vocab,
 * dt bytes of the activation dtype.
 *
 * Programs run twice: once counting parameters (c->counting: no tensors),
 * once simulating.  Identical decoder layers share one breakdown row each. */
#include "layers.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define F32 4u
#define I64 8u

/* ---- small op helpers ------------------------------------------------------ */

/* trainable here: the module is, and this layer's output reaches the loss
 * (CLIP layers after select_layer get no gradient and so no optimizer state) */
static int trainable(const lctx *c)
{
    return c->m->trainable && !c->dead && !c->unused;
}

static uint32_t row(lctx *c, const char *name, const char *kind)
{
    return sim_row_get(c->s, c->mi, name, kind);
}

/* register parameters of a row (counting pass only) */
static void param(lctx *c, uint32_t r, uint64_t n, int trainable, int per_layer)
{
    if (!c->counting)
        return;
    sim_row *R = &c->s->rows[r];
    R->params = sim_add(c->s, R->params, n);
    if (trainable) {
        R->trainable = sim_add(c->s, R->trainable, n);
        R->trainable_count++;
    }
    R->count = per_layer ? (uint32_t)c->m->num_hidden_layers : 1;
    if (n > c->largest_param)
        c->largest_param = n;
}

static int32_t new_t(lctx *c, uint32_t r, uint64_t elems, uint64_t bytes_per)
{
    if (c->counting)
        return -1;
    return sim_alloc(c->s, r, sim_mul(c->s, elems, bytes_per), F_TEMP, 0);
}

static int rg(lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].rg;
}

static void drop(lctx *c, int32_t id)
{
    if (!c->counting)
        sim_drop(c->s, id);
}

/* Record a backward node when autograd would: grad mode and some input needs
 * a gradient (or the op owns trainable weights). */
static sim_node *node(lctx *c, uint32_t r, int32_t out, int32_t in0, int32_t in1, int32_t in2,
                      int trainable_w)
{
    if (c->counting || !c->grad)
        return NULL;
    int32_t ins[3] = {in0, in1, in2};
    int any = trainable_w;
    for (int i = 0; i < 3; i++)
        any |= rg(c, ins[i]);
    if (!any)
        return NULL;
    sim_node *n = sim_node_new(c->s, r, out);
    if (!n)
        return NULL;
    for (int i = 0; i < 3; i++)
        if (rg(c, ins[i]) && n->nin < SIM_MAX_IN)
            n->in[n->nin++] = ins[i];
    return n;
}

static void save(lctx *c, sim_node *n, int32_t id)
{
    if (n)
        sim_save(c->s, n, id);
}

/* a weight gradient of `elems` parameters in the gradient dtype */
static void wgrad(lctx *c, sim_node *n, uint64_t elems)
{
    if (!n)
        return;
    n->wgrad_bytes = sim_add(c->s, n->wgrad_bytes, sim_mul(c->s, elems, c->gdt));
    if (c->amp) /* autocast: bf16 grad first, then AccumulateGrad into fp32 .grad */
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp, sim_mul(c->s, elems, c->dt));
    /* ZeRO-2/3 reduce it into a bucket; with gradient accumulation it is added
     * into the .grad of the previous micro-step: a temporary either way */
    n->wgrad_transient = (uint8_t)(c->zero >= 2 || c->grads_accumulate);
}

static void label(lctx *c, const char *l, uint32_t r)
{
    if (!c->counting)
        sim_label(c->s, l, r);
}

/* ---- nn.Linear (and PEFT LoRA around it) ---------------------------------------
 * y = x W^T (+ b).  Addmm/MmBackward keeps x when W needs a gradient and W (a
 * parameter, no new bytes) when x needs one.  Under autocast (fp32 master
 * weights at ZeRO 0) W is first cast to bf16: that copy is kept for x's grad.
 * Backward: dx = dy W (T*in), dW = dy^T x (in*out, persistent .grad), db = sum dy.
 *
 * LoRA (peft.tuners.lora.Linear.forward): result = base(x) + B(A(dropout(x))) * s.
 * nn.Dropout(p>0) makes a new tensor and NativeDropoutBackward keeps its bool
 * mask (1 byte/element); A keeps the dropout output, B keeps A's output (T*r);
 * the scaled B output and the sum are temporaries.  p == 0 uses nn.Identity. */
static int32_t linear(lctx *c, const char *name, int32_t x, uint64_t rows, uint64_t in,
                      uint64_t out, int bias, uint32_t lora_bit)
{
    uint32_t r = row(c, name, "linear");
    int tw = trainable(c);
    uint64_t np = sim_add(c->s, sim_mul(c->s, in, out), bias ? out : 0);
    param(c, r, np, tw, c->per_layer);
    label(c, name, r);
    /* autocast's weight cast (bf16 copy of W), cached for trainable leaves */
    int32_t wcast = c->amp ? new_t(c, r, np, c->dt) : -1;
    int32_t y = new_t(c, r, sim_mul(c->s, rows, out), c->dt);
    sim_node *n = node(c, r, y, x, -1, -1, tw);
    if (n) {
        if (tw)
            save(c, n, x);
        if (rg(c, x))
            save(c, n, wcast);
        if (tw)
            wgrad(c, n, np);
    }
    drop(c, wcast);
    const lora_spec *L = &c->m->lora;
    if (!L->enabled || !(L->targets & lora_bit))
        return y;
    /* LoRA branch */
    if (!c->s->rows[r].lora_a) { /* first use: create the adapter rows once */
        char an[MM_MAX_NAME], bn[MM_MAX_NAME];
        snprintf(an, sizeof an, "%s.lora_A", name);
        snprintf(bn, sizeof bn, "%s.lora_B", name);
        uint32_t a_row = sim_row_get_tmp(c->s, c->mi, an, "lora");
        uint32_t b_row = sim_row_get_tmp(c->s, c->mi, bn, "lora");
        c->s->rows[r].lora_a = a_row;
        c->s->rows[r].lora_b = b_row;
    }
    uint32_t ra = c->s->rows[r].lora_a, rb = c->s->rows[r].lora_b;
    param(c, ra, sim_mul(c->s, in, L->r), 1, c->per_layer);
    param(c, rb, sim_mul(c->s, L->r, out), 1, c->per_layer);
    int32_t xd = x;
    if (L->dropout > 0) {
        xd = new_t(c, ra, sim_mul(c->s, rows, in), c->dt);
        int32_t mask = new_t(c, ra, sim_mul(c->s, rows, in), 1);
        sim_node *dn = node(c, ra, xd, x, -1, -1, 0);
        save(c, dn, mask); /* NativeDropoutBackward keeps the mask */
        drop(c, mask);
    }
    int32_t ya = new_t(c, ra, sim_mul(c->s, rows, L->r), c->dt);
    sim_node *na = node(c, ra, ya, xd, -1, -1, 1);
    save(c, na, xd); /* lora_A keeps its input */
    wgrad(c, na, sim_mul(c->s, in, L->r));
    if (xd != x)
        drop(c, xd);
    int32_t yb = new_t(c, rb, sim_mul(c->s, rows, out), c->dt);
    sim_node *nb = node(c, rb, yb, ya, -1, -1, 1);
    save(c, nb, ya); /* lora_B keeps A's output */
    wgrad(c, nb, sim_mul(c->s, L->r, out));
    drop(c, ya);
    int32_t ys = new_t(c, rb, sim_mul(c->s, rows, out), c->dt); /* * scaling: keeps nothing */
    node(c, rb, ys, yb, -1, -1, 0);
    drop(c, yb);
    int32_t sum = new_t(c, r, sim_mul(c->s, rows, out), c->dt); /* result + lora: keeps nothing */
    node(c, r, sum, y, ys, -1, 0);
    drop(c, y);
    drop(c, ys);
    return sum;
}

/* elementwise op with no saved tensors (add, scalar mul, cast, copy) */
static int32_t plain(lctx *c, uint32_t r, int32_t a, int32_t b, uint64_t elems, uint64_t bytes)
{
    int32_t y = new_t(c, r, elems, bytes);
    node(c, r, y, a, b, -1, 0);
    return y;
}

/* ---- norms ----------------------------------------------------------------------- */

/* LlamaRMSNorm (HF eager):
 *   x32 = x.to(float32)            new fp32 copy unless already fp32 (ToCopy keeps nothing)
 *   v = x32.pow(2).mean(-1, True)  PowBackward0 keeps x32; MeanBackward (torch 2.x) keeps sizes
 *   y32 = x32 * rsqrt(v + eps)     RsqrtBackward keeps its result (T fp32); MulBackward0 keeps both
 *   z = weight * y32.to(dt)        MulBackward0 keeps y (the cast) when weight needs a grad
 * Saved per norm: x32 (4Th), rsqrt (4T), y (dt*Th if trainable). */
static int32_t rmsnorm(lctx *c, const char *name, int32_t x)
{
    uint32_t r = row(c, name, "rmsnorm");
    uint64_t h = c->m->hidden_size, T = c->T, Th = sim_mul(c->s, T, h);
    int tw = trainable(c);
    param(c, r, h, tw, c->per_layer);
    label(c, name, r);
    int32_t x32 = x;
    if (c->dt != F32) {
        x32 = plain(c, r, x, -1, Th, F32);
    } else if (!c->counting) {
        sim_hold(c->s, x);
    }
    int32_t p = new_t(c, r, Th, F32);
    sim_node *n = node(c, r, p, x32, -1, -1, 0);
    save(c, n, x32);
    if (n) /* pow backward: grad * 2 * x: two Th fp32 temporaries */
        n->bwd_tmp = sim_mul(c->s, Th, 2 * F32);
    int32_t v = plain(c, r, p, -1, T, F32); /* mean */
    drop(c, p);
    int32_t ve = plain(c, r, v, -1, T, F32); /* + eps */
    drop(c, v);
    int32_t rs = new_t(c, r, T, F32);
    n = node(c, r, rs, ve, -1, -1, 0);
    save(c, n, rs);
    drop(c, ve);
    int32_t y32 = new_t(c, r, Th, F32);
    n = node(c, r, y32, x32, rs, -1, 0);
    save(c, n, x32);
    save(c, n, rs);
    if (n) /* d(rsqrt) = (grad * x32).sum(-1): a Th fp32 product */
        n->bwd_tmp = sim_mul(c->s, Th, F32);
    drop(c, x32);
    drop(c, rs);
    int32_t y = y32;
    if (c->dt != F32) {
        y = plain(c, r, y32, -1, Th, c->dt);
        drop(c, y32);
    }
    int32_t z = new_t(c, r, Th, c->dt);
    n = node(c, r, z, y, -1, -1, tw);
    if (tw) {
        save(c, n, y);
        wgrad(c, n, h);
        if (n) /* dW = (grad * y).sum(tokens): a Th product */
            n->bwd_tmp = sim_add(c->s, n->bwd_tmp, sim_mul(c->s, Th, c->dt));
    }
    drop(c, y);
    return z;
}

/* nn.LayerNorm (CLIP): native_layer_norm keeps its input, mean and rstd (fp32,
 * T each) when input or weight needs a gradient; output Th. */
static int32_t layernorm(lctx *c, const char *name, int32_t x, uint64_t T, uint64_t h)
{
    uint32_t r = row(c, name, "layernorm");
    int tw = trainable(c);
    param(c, r, 2 * h, tw, c->per_layer);
    label(c, name, r);
    int32_t mean = new_t(c, r, T, F32), rstd = new_t(c, r, T, F32);
    int32_t y = new_t(c, r, sim_mul(c->s, T, h), c->dt);
    sim_node *n = node(c, r, y, x, -1, -1, tw);
    save(c, n, x);
    save(c, n, mean);
    save(c, n, rstd);
    if (tw)
        wgrad(c, n, 2 * h);
    drop(c, mean);
    drop(c, rstd);
    return y;
}

/* ---- activations --------------------------------------------------------------- */

/* gelu / silu / relu: the backward keeps the input (relu keeps its output).
 * quick_gelu (CLIP): x * sigmoid(1.702 x): the scalar product is a temporary,
 * SigmoidBackward keeps its output, MulBackward0 keeps x and the sigmoid. */
static int32_t activation(lctx *c, const char *name, int32_t x, uint64_t elems, act_kind k)
{
    uint32_t r = row(c, name, "activation");
    label(c, name, r);
    if (k == ACT_QUICK_GELU) {
        int32_t t = plain(c, r, x, -1, elems, c->dt);
        int32_t sg = new_t(c, r, elems, c->dt);
        sim_node *n = node(c, r, sg, t, -1, -1, 0);
        save(c, n, sg);
        drop(c, t);
        int32_t y = new_t(c, r, elems, c->dt);
        n = node(c, r, y, x, sg, -1, 0);
        save(c, n, x);
        save(c, n, sg);
        drop(c, sg);
        return y;
    }
    int32_t y = new_t(c, r, elems, c->dt);
    sim_node *n = node(c, r, y, x, -1, -1, 0);
    save(c, n, k == ACT_RELU ? y : x);
    return y;
}

/* ---- attention -------------------------------------------------------------------- */

/* rotary embedding (apply_rotary_pos_emb): (x * cos) + (rotate_half(x) * sin).
 * Mul keeps cos / sin (shared per forward, no new bytes); rotate_half makes
 * -x2 (half size) and a cat (full size); all temporaries. */
static int32_t rope(lctx *c, uint32_t r, int32_t x, uint64_t elems)
{
    int32_t t1 = new_t(c, r, elems, c->dt);
    sim_node *n = node(c, r, t1, x, -1, -1, 0);
    save(c, n, c->cos);
    int32_t ng = plain(c, r, x, -1, elems / 2, c->dt);
    int32_t rh = plain(c, r, ng, x, elems, c->dt);
    drop(c, ng);
    int32_t t2 = new_t(c, r, elems, c->dt);
    n = node(c, r, t2, rh, -1, -1, 0);
    save(c, n, c->sin);
    drop(c, rh);
    int32_t o = plain(c, r, t1, t2, elems, c->dt);
    drop(c, t1);
    drop(c, t2);
    return o;
}

/* Attention core for q (B,a,S,d), k/v (B,kv,S,d).
 *  eager (HF eager_attention_forward): repeat_kv materialises k,v when kv < a;
 *    scores = q k^T (keeps q, k) -> * scale -> + causal mask (decoder only)
 *    -> softmax(dtype=float32) (bf16: a fp32 copy first; SoftmaxBackward keeps the
 *    fp32 result) -> .to(dt) -> dropout(p=0) is the identity -> p v (keeps p, v).
 *    s^2 bytes saved: 4 (fp32 probs) + dt (probs in dt) per element, bf16.
 *  sdpa (torch SDPA flash / mem-efficient kernel, HF sdpa path): repeat_kv as
 *    eager; keeps q, k, v, the output and an fp32 logsumexp (B*a*S); backward
 *    keeps an fp32 dq accumulator.  No S^2 tensor.
 *    The kernel's output is a transposed view of (B,S,a,d) storage, so the
 *    following transpose(1, 2).contiguous() is free and o_proj keeps it.
 *  flash (HF flash_attention_2): as sdpa but native GQA (no repeat). */
static int32_t attention_core(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v, int causal)
{
    uint64_t B = c->B, S = c->S, a = c->m->num_attention_heads, d = c->m->head_dim;
    uint64_t kvh = c->m->type == MOD_LLAMA ? c->m->num_key_value_heads : a;
    uint64_t qe = sim_mul3(c->s, B, S, sim_mul(c->s, a, d));
    attn_kind ak = c->attn;
    label(c, ak == ATT_EAGER ? "attention (eager)" : ak == ATT_SDPA ? "attention (sdpa)"
                                                                   : "attention (flash)", r);
    int32_t kr = k, vr = v;
    if (ak != ATT_FLASH && kvh < a) { /* repeat_kv: expand + reshape copies */
        kr = plain(c, r, k, -1, qe, c->dt);
        vr = plain(c, r, v, -1, qe, c->dt);
    } else if (!c->counting) {
        sim_hold(c->s, k);
        sim_hold(c->s, v);
    }
    int32_t out;
    if (ak == ATT_EAGER) {
        uint64_t ss = sim_mul3(c->s, B, a, sim_mul(c->s, S, S));
        int32_t sc = new_t(c, r, ss, c->dt);
        sim_node *n = node(c, r, sc, q, kr, -1, 0);
        save(c, n, q);
        save(c, n, kr);
        int32_t sc2 = plain(c, r, sc, -1, ss, c->dt); /* * scaling */
        drop(c, sc);
        if (causal) {
            int32_t sc3 = plain(c, r, sc2, -1, ss, c->dt); /* + causal_mask */
            drop(c, sc2);
            sc2 = sc3;
        }
        /* attn_weights = softmax(attn_weights, dtype=float32).to(dt): the old
         * attn_weights stays referenced until the whole expression assigns, so
         * the scores, their fp32 copy and the fp32 softmax coexist */
        int32_t f = sc2;
        if (c->dt != F32 && c->m->type == MOD_LLAMA) /* softmax(dtype=float32) */
            f = plain(c, r, sc2, -1, ss, F32);
        uint64_t pb = c->m->type == MOD_LLAMA ? F32 : c->dt;
        int32_t p32 = new_t(c, r, ss, pb);
        n = node(c, r, p32, f, -1, -1, 0);
        save(c, n, p32);
        if (f != sc2)
            drop(c, f);
        int32_t p = p32;
        if (pb != c->dt) { /* .to(query.dtype) */
            p = plain(c, r, p32, -1, ss, c->dt);
            drop(c, p32);
        }
        drop(c, sc2);
        out = new_t(c, r, qe, c->dt);
        n = node(c, r, out, p, vr, -1, 0);
        save(c, n, p);
        save(c, n, vr);
        drop(c, p);
    } else {
        uint64_t lse = sim_mul3(c->s, B, a, S);
        out = new_t(c, r, qe, c->dt);
        int32_t l = new_t(c, r, lse, F32);
        sim_node *n = node(c, r, out, q, kr, vr, 0);
        save(c, n, q);
        save(c, n, kr);
        save(c, n, vr);
        save(c, n, out);
        save(c, n, l);
        if (n) { /* fp32 dq accumulator + softmax_d (B*a*S fp32) */
            n->bwd_tmp = sim_add(c->s, sim_mul(c->s, qe, F32), sim_mul(c->s, lse, F32));
            if (ak == ATT_FLASH && kvh < a) /* GQA: dk, dv expanded then summed */
                n->bwd_tmp = sim_add(c->s, n->bwd_tmp, sim_mul(c->s, 2 * qe, c->dt));
        }
        drop(c, l);
    }
    drop(c, kr);
    drop(c, vr);
    if (ak != ATT_EAGER)
        return out; /* flash-attn and torch's SDPA kernels write the output in
                       (B,S,a,d) storage: transpose(1, 2).contiguous() is free */
    /* eager: transpose(1, 2).contiguous() / reshape is a copy that o_proj keeps */
    int32_t oc = plain(c, r, out, -1, qe, c->dt);
    drop(c, out);
    return oc;
}

/* ---- LLaMA decoder layer ----------------------------------------------------------- */

static int32_t llama_attention(lctx *c, int32_t z)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, a = m->num_attention_heads,
             kv = m->num_key_value_heads, d = m->head_dim;
    uint64_t qd = sim_mul(c->s, a, d), kvd = sim_mul(c->s, kv, d);
    int32_t q = linear(c, "layers.self_attn.q_proj", z, T, h, qd, 0, LT_Q);
    int32_t k = linear(c, "layers.self_attn.k_proj", z, T, h, kvd, 0, LT_K);
    int32_t v = linear(c, "layers.self_attn.v_proj", z, T, h, kvd, 0, LT_V);
    uint32_t ra = row(c, "layers.self_attn.attention", "attention");
    uint32_t rr = row(c, "layers.self_attn.rotary", "rope");
    label(c, "rotary", rr);
    int32_t qr = rope(c, rr, q, sim_mul(c->s, T, qd));
    drop(c, q);
    int32_t kr = rope(c, rr, k, sim_mul(c->s, T, kvd));
    drop(c, k);
    int32_t o = attention_core(c, ra, qr, kr, v, 1);
    drop(c, qr);
    drop(c, kr);
    drop(c, v);
    int32_t y = linear(c, "layers.self_attn.o_proj", o, T, qd, h, 0, LT_O);
    drop(c, o);
    return y;
}

/* LlamaMLP: down(silu(gate(x)) * up(x)).  SiluBackward keeps gate's output,
 * MulBackward0 keeps both silu(gate) and up; down keeps the product. */
static int32_t llama_mlp(lctx *c, int32_t z)
{
    uint64_t T = c->T, h = c->m->hidden_size, I = c->m->intermediate_size;
    uint64_t Ti = sim_mul(c->s, T, I);
    int32_t g = linear(c, "layers.mlp.gate_proj", z, T, h, I, 0, LT_GATE);
    int32_t u = linear(c, "layers.mlp.up_proj", z, T, h, I, 0, LT_UP);
    int32_t sg = activation(c, "layers.mlp.act_fn", g, Ti, c->m->act);
    drop(c, g);
    uint32_t r = row(c, "layers.mlp.act_fn", "activation");
    int32_t p = new_t(c, r, Ti, c->dt);
    sim_node *n = node(c, r, p, sg, u, -1, 0);
    save(c, n, sg);
    save(c, n, u);
    drop(c, sg);
    drop(c, u);
    int32_t y = linear(c, "layers.mlp.down_proj", p, T, I, h, 0, LT_DOWN);
    drop(c, p);
    return y;
}

/* LlamaDecoderLayer: x + attn(norm(x)), then + mlp(norm(.)).  The residual
 * adds keep nothing; the layer input stays alive until the layer returns. */
static int32_t llama_layer(lctx *c, int32_t x, uint32_t layer)
{
    (void)layer;
    uint32_t rres = row(c, "layers.residual", "add");
    int32_t z = rmsnorm(c, "layers.input_layernorm", x);
    int32_t at = llama_attention(c, z);
    drop(c, z);
    label(c, "residual", rres);
    int32_t h1 = plain(c, rres, x, at, sim_mul(c->s, c->T, c->m->hidden_size), c->dt);
    drop(c, at);
    int32_t z2 = rmsnorm(c, "layers.post_attention_layernorm", h1);
    int32_t ml = llama_mlp(c, z2);
    drop(c, z2);
    label(c, "residual", rres);
    int32_t out = plain(c, rres, h1, ml, sim_mul(c->s, c->T, c->m->hidden_size), c->dt);
    drop(c, h1);
    drop(c, ml);
    return out;
}

/* ---- CLIP encoder layer --------------------------------------------------------------- */

static int32_t clip_layer(lctx *c, int32_t x, uint32_t layer)
{
    (void)layer;
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, I = m->intermediate_size;
    uint64_t Th = sim_mul(c->s, T, h);
    int32_t n1 = layernorm(c, "layers.layer_norm1", x, T, h);
    int32_t q0 = linear(c, "layers.self_attn.q_proj", n1, T, h, h, 1, LT_Q);
    uint32_t ra = row(c, "layers.self_attn.attention", "attention");
    int32_t q = plain(c, ra, q0, -1, Th, c->dt); /* q_proj(x) * scale */
    drop(c, q0);
    int32_t k = linear(c, "layers.self_attn.k_proj", n1, T, h, h, 1, LT_K);
    int32_t v = linear(c, "layers.self_attn.v_proj", n1, T, h, h, 1, LT_V);
    drop(c, n1);
    int32_t o = attention_core(c, ra, q, k, v, 0);
    drop(c, q);
    drop(c, k);
    drop(c, v);
    int32_t ao = linear(c, "layers.self_attn.out_proj", o, T, h, h, 1, LT_O);
    drop(c, o);
    uint32_t rres = row(c, "layers.residual", "add");
    int32_t h1 = plain(c, rres, x, ao, Th, c->dt);
    drop(c, ao);
    int32_t n2 = layernorm(c, "layers.layer_norm2", h1, T, h);
    int32_t f1 = linear(c, "layers.mlp.fc1", n2, T, h, I, 1, LT_FC1);
    drop(c, n2);
    int32_t ac = activation(c, "layers.mlp.activation", f1, sim_mul(c->s, T, I), m->act);
    drop(c, f1);
    int32_t f2 = linear(c, "layers.mlp.fc2", ac, T, I, h, 1, LT_FC2);
    drop(c, ac);
    int32_t out = plain(c, rres, h1, f2, Th, c->dt);
    drop(c, h1);
    drop(c, f2);
    return out;
}

/* ---- gradient checkpointing ------------------------------------------------------------ *
 * HF gradient_checkpointing_enable() -> torch.utils.checkpoint (use_reentrant=True):
 * the layer runs under no_grad; CheckpointFunction keeps its tensor arguments
 * (the layer input, cos/sin, the causal mask).  In backward the layer is re-run
 * with grad enabled (its saved tensors exist again, one layer at a time) and
 * backpropagated at once. */
typedef int32_t (*layer_fn)(lctx *, int32_t, uint32_t);

static int32_t run_layer(lctx *c, layer_fn fn, int32_t x, uint32_t layer)
{
    if (c->counting || !c->grad || !c->ckpt)
        return fn(c, x, layer);
    c->grad = 0;
    int32_t y = fn(c, x, layer);
    c->grad = 1;
    sim_node *n = node(c, row(c, "layers.checkpoint", "checkpoint"), y, x, -1, -1,
                       c->m->trainable || c->m->lora.enabled);
    if (n) {
        n->ckpt = 1;
        n->ckpt_layer = layer;
        n->ckpt_prog = (const void *)c->m;
        save(c, n, x);
        save(c, n, c->cos);
        save(c, n, c->sin);
        save(c, n, c->mask);
    }
    return y;
}

/* ---- folding identical layers ---------------------------------------------------------- *
 * In a run of identical layers every event's live bytes are a per-layer base,
 * which changes by the same amount from one layer to the next, plus the same
 * profile.  The maximum over the middle layers is therefore always reached in
 * an end layer: simulating layers 0, 1 and the last one in full, and standing
 * in for the M layers between with a ballast (what each layer leaves alive in
 * forward; in backward swapped for each layer's weight gradients), gives the
 * same peak exactly at a fraction of the cost.  Rows of the folded layers are
 * reported under "layers.folded". */
typedef struct fold_state {
    uint64_t before, delta;  /* live (fixed) around layer 1's forward */
    int32_t ballast;
    uint32_t M;
    sim_row *rows_before;    /* counting pass: rows before layer 1 */
    size_t nrows_before;
} fold_state;

static int fold_enabled(const lctx *c, uint64_t run)
{
    return !c->nofold && run >= 5;
}

/* counting pass: what layer 1 added to each row, M more times */
static void fold_count_begin(lctx *c, fold_state *f)
{
    f->nrows_before = c->s->nrows;
    f->rows_before = malloc(f->nrows_before * sizeof *f->rows_before + 1);
    if (!f->rows_before)
        c->s->oom = 1;
    else
        memcpy(f->rows_before, c->s->rows, f->nrows_before * sizeof *f->rows_before);
}

static void fold_count_insert(lctx *c, fold_state *f, uint64_t run)
{
    uint32_t M = (uint32_t)(run - 3);
    for (size_t r = 0; f->rows_before && r < f->nrows_before && r < c->s->nrows; r++) {
        sim_row *R = &c->s->rows[r];
        const sim_row *B = &f->rows_before[r];
        R->params = sim_add(c->s, R->params, sim_mul(c->s, R->params - B->params, M));
        R->trainable = sim_add(c->s, R->trainable, sim_mul(c->s, R->trainable - B->trainable, M));
        R->trainable_count += (R->trainable_count - B->trainable_count) * M;
    }
    free(f->rows_before);
    f->rows_before = NULL;
}

/* per-layer persistent weight-gradient bytes of the current module */
static uint64_t layer_wgrad_bytes(lctx *c)
{
    if (c->zero >= 2 || c->grads_accumulate)
        return 0;
    uint64_t per = 0;
    for (size_t r = 0; r < c->s->nrows; r++) {
        const sim_row *R = &c->s->rows[r];
        if (R->module == c->mi && R->count > 1 && R->trainable_count)
            per = sim_add(c->s, per, R->trainable / R->trainable_count);
    }
    return sim_mul(c->s, per, c->gdt);
}

static void fold_insert(lctx *c, fold_state *f, uint64_t run)
{
    f->M = (uint32_t)(run - 3);
    uint32_t r = row(c, "layers.folded", "folded");
    label(c, "folded layers", r);
    f->ballast = sim_alloc(c->s, r, sim_mul(c->s, f->delta, f->M), F_TEMP, 0);
    if (f->ballast < 0)
        return;
    if (c->grad) {
        sim_node *n = sim_node_new(c->s, r, -1);
        if (n) {
            n->free_first = 1;
            sim_save(c->s, n, f->ballast);
            n->wgrad_bytes = sim_mul(c->s, layer_wgrad_bytes(c), f->M);
        }
        sim_drop(c->s, f->ballast); /* now held by the node alone */
        f->ballast = -1;
    }
}

/* Call before running layer l of a run of `run` identical layers; returns the
 * layer to run (l, or the last one when the middle was folded). */
static uint32_t fold_before(lctx *c, fold_state *f, int fold, uint32_t l, uint64_t run)
{
    if (!fold)
        return l;
    if (l == 1) {
        if (c->counting)
            fold_count_begin(c, f);
        else
            f->before = sim_live_fixed(c->s);
    } else if (l == 2) {
        if (c->counting)
            fold_count_insert(c, f, run);
        else
            fold_insert(c, f, run);
        f->M = (uint32_t)(run - 3);
        return (uint32_t)run - 1;
    }
    return l;
}

/* Call after running layer l. */
static void fold_after(lctx *c, fold_state *f, int fold, uint32_t l)
{
    if (fold && l == 1 && !c->counting)
        f->delta = sim_live_fixed(c->s) - f->before;
}

/* ---- modules -------------------------------------------------------------------------- */

/* CLIP vision tower (CLIPVisionModel, output_hidden_states=True as LLaVA asks):
 * conv patch embedding (no bias) -> cat CLS -> + position embedding ->
 * pre_layrnorm -> L encoder layers; every layer input is held in the
 * hidden_states tuple until the tower returns; features = hidden_states[sel]
 * with CLS dropped.  A frozen tower runs under no_grad (LLaVA): nothing saved. */
static int32_t vit_module(lctx *c)
{
    const module_spec *m = c->m;
    uint64_t g = m->image_size / m->patch_size, P = g * g, h = m->hidden_size;
    uint64_t Bv = c->B;
    int tw = trainable(c);
    c->per_layer = 0;
    uint32_t rpe = row(c, "embeddings.patch_embedding", "conv2d");
    param(c, rpe, sim_mul3(c->s, h, m->num_channels, sim_mul(c->s, m->patch_size, m->patch_size)),
          tw, 0);
    uint32_t rcls = row(c, "embeddings.class_embedding", "embedding");
    param(c, rcls, h, tw, 0);
    uint32_t rpos = row(c, "embeddings.position_embedding", "embedding");
    param(c, rpos, sim_mul(c->s, P + 1, h), tw, 0);
    label(c, "patch embedding", rpe);
    int32_t pe = new_t(c, rpe, sim_mul3(c->s, Bv, P, h), c->dt);
    sim_node *n = node(c, rpe, pe, -1, -1, -1, tw);
    if (n) {
        save(c, n, c->pixels);
        wgrad(c, n, c->s->rows[rpe].params);
    }
    int32_t cat = plain(c, rcls, pe, -1, sim_mul3(c->s, Bv, P + 1, h), c->dt);
    drop(c, pe);
    int32_t pos = new_t(c, rpos, sim_mul(c->s, P + 1, h), c->dt);
    n = node(c, rpos, pos, -1, -1, -1, tw);
    if (n)
        wgrad(c, n, sim_mul(c->s, P + 1, h));
    int32_t emb = plain(c, rpos, cat, pos, sim_mul3(c->s, Bv, P + 1, h), c->dt);
    drop(c, cat);
    drop(c, pos);
    int32_t x = layernorm(c, "pre_layrnorm", emb, c->T, h);
    drop(c, emb);
    /* hidden_states tuple: held until the tower returns */
    uint64_t L = m->num_hidden_layers;
    int64_t sel = m->select_layer < 0 ? (int64_t)L + 1 + m->select_layer : m->select_layer;
    int32_t *hs = c->scratch;
    size_t nhs = 0;
    hs[nhs++] = x;
    c->per_layer = 1;
    int grad_mode = c->grad;
    uint64_t live_run = (uint64_t)sel < L ? (uint64_t)sel : L; /* layers before select_layer */
    fold_state fs = {0, 0, -1, 0, NULL, 0};
    int fold = fold_enabled(c, live_run);
    for (uint32_t l = 0; l < L; l++) {
        /* layers after select_layer run, but their output is discarded with the
         * tuple: autograd frees what they saved at once and they get no grad */
        c->dead = (int64_t)l >= sel;
        c->grad = grad_mode && !c->dead;
        l = fold_before(c, &fs, fold, l, live_run);
        int32_t y = run_layer(c, clip_layer, x, l);
        hs[nhs++] = y; /* the tuple holds every hidden state */
        x = y;
        fold_after(c, &fs, fold, l);
    }
    if (fold) /* hs[] lost the folded layers: renumber select_layer */
        sel -= (int64_t)fs.M;
    c->grad = grad_mode;
    c->dead = 1; /* post_layernorm only sees the CLS token of the last layer */
    c->per_layer = 0;
    uint32_t rpost = row(c, "post_layernorm", "layernorm");
    param(c, rpost, 2 * h, trainable(c), 0);
    c->dead = 0;
    int32_t feat = hs[sel];
    for (size_t i = 0; i < nhs; i++)
        if ((int64_t)i != sel)
            drop(c, hs[i]);
    if (fs.ballast >= 0)
        drop(c, fs.ballast); /* no_grad: the tuple held those outputs, now released */
    return feat; /* (Bv, P+1, h); [:, 1:] is a view */
}

/* mlp2x_gelu projector.  The first Linear gets the non-contiguous [:, 1:]
 * slice: matmul folds it with reshape, i.e. a contiguous copy, which the
 * Linear keeps for its weight gradient. */
static int32_t mlp_module(lctx *c, int32_t feat)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, in = m->input_size, h = m->hidden_size;
    c->per_layer = 0;
    uint32_t rc = row(c, "input_copy", "copy");
    int32_t x = feat;
    if (c->has_vit) {
        x = plain(c, rc, feat, -1, sim_mul(c->s, T, in), c->dt);
        drop(c, feat);
    }
    static const char *const names[] = {"linear_1", "linear_2", "linear_3", "linear_4",
                                        "linear_5", "linear_6", "linear_7", "linear_8"};
    static const char *const acts[] = {"act_1", "act_2", "act_3", "act_4",
                                       "act_5", "act_6", "act_7", "act_8"};
    for (uint64_t l = 0; l < m->num_layers; l++) {
        const char *nm = l < 8 ? names[l] : "linear_n";
        int32_t y = linear(c, nm, x, T, l == 0 ? in : h, h, 1, LT_MLP_ALL);
        drop(c, x);
        x = y;
        if (l + 1 < m->num_layers) {
            int32_t a = activation(c, l < 8 ? acts[l] : "act_n", x, sim_mul(c->s, T, h), m->act);
            drop(c, x);
            x = a;
        }
    }
    return x;
}

/* LLaMA language model + lm_head + loss. */
static int32_t llama_module(lctx *c, int32_t image_features)
{
    const module_spec *m = c->m;
    uint64_t T = c->T, h = m->hidden_size, V = m->vocab_size, B = c->B, S = c->S;
    uint64_t Th = sim_mul(c->s, T, h), TV = sim_mul(c->s, T, V);
    int tw = trainable(c);
    c->per_layer = 0;
    uint32_t re = row(c, "embed_tokens", "embedding");
    param(c, re, sim_mul(c->s, V, h), tw, 0);
    label(c, "embed_tokens", re);
    /* Embedding keeps the indices (input_ids, already alive).  Backward:
     * embedding_dense_backward allocates the V*h gradient and sorts indices. */
    int32_t emb = new_t(c, re, Th, c->dt);
    sim_node *n = node(c, re, emb, -1, -1, -1, tw);
    if (n) {
        wgrad(c, n, sim_mul(c->s, V, h));
        /* LLaVA (prepare_inputs_labels_for_multimodal) embeds each sample's text
         * separately: with images and B > 1 each later sample's V x h gradient
         * is a temporary while AccumulateGrad adds it into .grad */
        if (image_features >= 0 && B > 1)
            n->bwd_tmp = sim_add(c->s, n->bwd_tmp, sim_mul3(c->s, V, h, c->gdt));
        /* CUDA embedding_backward_cuda_kernel: sorted/segment index buffers and
         * fp32 partial sums per segment (<= T rows of h) */
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp,
                             sim_add(c->s, sim_mul(c->s, T, 4 * I64), sim_mul3(c->s, T, h, F32)));
        /* tied lm_head: its gradient (earlier in backward) is already .grad;
         * this one is added into it */
        if (m->tie_word_embeddings)
            n->wgrad_transient = 1;
    }
    int32_t x = emb;
    if (image_features >= 0 || c->counting) {
        /* inputs_embeds.masked_scatter(image_mask, image_features): a new
         * tensor; backward keeps the (B,S,1) bool mask */
        uint32_t rm = row(c, "merge_image_features", "masked_scatter");
        label(c, "merge image features", rm);
        x = plain(c, rm, emb, image_features, Th, c->dt);
        if (c->pretrain_input_grads && !rg(c, emb) && !c->counting)
            c->s->t[x].rg = 1;
        drop(c, emb);
        drop(c, image_features);
    } else if (c->pretrain_input_grads && !c->counting) {
        /* enable_input_require_grads(): the embedding output requires grad */
        c->s->t[x].rg = 1;
    }
    /* rotary cos/sin (B, S, d) in dt, computed once per forward */
    uint32_t rr = row(c, "rotary_emb", "rope");
    c->cos = new_t(c, rr, sim_mul3(c->s, B, S, m->head_dim), c->dt);
    c->sin = new_t(c, rr, sim_mul3(c->s, B, S, m->head_dim), c->dt);
    c->mask = -1;
    if (c->attn == ATT_EAGER) /* 4-D causal mask (B,1,S,S) in dt for eager */
        c->mask = new_t(c, row(c, "causal_mask", "mask"), sim_mul3(c->s, B, S, S), c->dt);
    c->per_layer = 1;
    fold_state fs = {0, 0, -1, 0, NULL, 0};
    int fold = fold_enabled(c, m->num_hidden_layers);
    for (uint32_t l = 0; l < m->num_hidden_layers; l++) {
        l = fold_before(c, &fs, fold, l, m->num_hidden_layers);
        int32_t y = run_layer(c, llama_layer, x, l);
        drop(c, x);
        x = y;
        fold_after(c, &fs, fold, l);
    }
    c->per_layer = 0;
    /* the forward's own references to cos/sin and the mask end here; layers
     * (or checkpoints) that saved them keep them alive until their backward */
    drop(c, c->cos);
    drop(c, c->sin);
    drop(c, c->mask);
    int32_t z = rmsnorm(c, "norm", x);
    drop(c, x);
    /* lm_head: logits (B,S,V) in dt; keeps the normed hidden state if trainable */
    int tied = m->tie_word_embeddings;
    uint32_t rh = row(c, tied ? "embed_tokens" : "lm_head", tied ? "embedding" : "linear");
    if (!tied)
        param(c, rh, sim_mul(c->s, V, h), tw, 0);
    label(c, "lm_head", rh);
    int32_t wcast = c->amp ? new_t(c, rh, sim_mul(c->s, V, h), c->dt) : -1;
    int32_t logits = new_t(c, rh, TV, c->dt);
    n = node(c, rh, logits, z, -1, -1, tw);
    if (n) {
        if (tw) {
            save(c, n, z);
            wgrad(c, n, sim_mul(c->s, V, h));
        }
        if (rg(c, z))
            save(c, n, wcast);
    }
    drop(c, wcast);
    drop(c, z);
    /* Loss (transformers >= 4.46 ForCausalLMLoss): logits.float() (a fp32 copy
     * for bf16/fp16), labels padded and shifted (no logits copy), then
     * cross_entropy = log_softmax (LogSoftmaxBackward keeps its fp32 output)
     * + nll_loss (keeps the same tensor and the target).
     * Before 4.46: the model kept logits.float() in its output and the loss
     * made a shifted .contiguous() fp32 copy: one more 4*T*V. */
    uint32_t rl = row(c, "loss", "cross_entropy");
    label(c, "loss", rl);
    int32_t l32 = logits;
    if (c->dt != F32) {
        l32 = plain(c, rl, logits, -1, TV, F32);
    } else if (!c->counting) {
        sim_hold(c->s, logits);
    }
    int32_t src = l32;
    int old_tf = c->spec->framework.tf_major < 4 ||
                 (c->spec->framework.tf_major == 4 && c->spec->framework.tf_minor < 46);
    if (old_tf) {
        src = plain(c, rl, l32, -1, sim_mul3(c->s, B, S - 1 ? S - 1 : 1, V), F32);
    }
    int32_t lab = new_t(c, rl, sim_mul(c->s, B, S + 1), I64); /* pad(labels) */
    int32_t shl = new_t(c, rl, sim_mul(c->s, B, S), I64);     /* shifted labels */
    drop(c, lab);
    int32_t lsm = new_t(c, rl, old_tf ? sim_mul3(c->s, B, S - 1 ? S - 1 : 1, V) : TV, F32);
    n = node(c, rl, lsm, src, -1, -1, 0);
    save(c, n, lsm);
    int32_t loss = new_t(c, rl, 1, F32);
    n = node(c, rl, loss, lsm, -1, -1, 0);
    save(c, n, lsm);
    save(c, n, shl);
    drop(c, shl);
    drop(c, lsm);
    if (src != l32)
        drop(c, src);
    if (!old_tf)
        drop(c, l32); /* local to the loss function */
    /* the model output (logits, and the fp32 logits before 4.46) is dropped
     * when compute_loss returns, before backward */
    c->late_drop[0] = logits;
    c->late_drop[1] = old_tf ? l32 : -1;
    return loss;
}

int32_t layers_recompute(sim *s, const sim_node *ck, void *ctx)
{
    (void)s;
    lctx *c = ctx;
    const module_spec *m = ck->ckpt_prog;
    lctx outer = *c; /* the backward goes on in whatever module it was */
    layers_enter_module(c, (uint32_t)(m - c->spec->modules));
    c->grad = 1;
    c->per_layer = 1;
    c->ckpt = 0;
    int32_t x = ck->saved[0];
    int32_t y = m->type == MOD_LLAMA ? llama_layer(c, x, ck->ckpt_layer)
                                     : clip_layer(c, x, ck->ckpt_layer);
    *c = outer;
    return y;
}

void layers_enter_module(lctx *c, uint32_t mi)
{
    const mm_spec *sp = c->spec;
    const training_spec *t = &sp->training;
    c->mi = mi;
    c->m = &sp->modules[mi];
    c->attn = c->m->attention == ATT_INHERIT ? t->attention : c->m->attention;
    if (c->m->type == MOD_VIT) {
        uint64_t g = c->m->image_size / c->m->patch_size;
        c->B = sim_mul(c->s, t->micro_batch_size, t->images_per_sample);
        c->S = g * g + 1;
    } else if (c->m->type == MOD_MLP) {
        const module_spec *v = NULL;
        for (size_t i = 0; i < sp->n_modules; i++)
            if (sp->modules[i].type == MOD_VIT)
                v = &sp->modules[i];
        uint64_t g = v ? v->image_size / v->patch_size : 1;
        c->B = sim_mul(c->s, t->micro_batch_size, t->images_per_sample);
        c->S = g * g;
    } else {
        c->B = t->micro_batch_size;
        c->S = t->seq_len;
    }
    c->T = sim_mul(c->s, c->B, c->S);
}

/* The whole forward: [vit] -> [mlp] -> llama -> loss.  Returns the loss id. */
int32_t layers_forward(lctx *c)
{
    const mm_spec *sp = c->spec;
    const training_spec *t = &sp->training;
    int32_t feat = -1;
    c->has_vit = 0;
    for (uint32_t mi = 0; mi < sp->n_modules; mi++) {
        layers_enter_module(c, mi);
        const module_spec *m = c->m;
        int needs_grad = m->trainable || m->lora.enabled;
        if (m->type == MOD_VIT) {
            c->has_vit = t->images_per_sample > 0;
            /* text-only samples: tower and projector never run, so they get no
             * gradient and AdamW never creates their state (counted frozen) */
            c->unused = !c->has_vit;
            if (!c->has_vit && !c->counting)
                continue;
            /* a frozen tower runs under no_grad (LLaVA) */
            c->grad = needs_grad;
            c->ckpt = t->gradient_checkpointing && c->grad;
            feat = vit_module(c);
        } else if (m->type == MOD_MLP) {
            if (!c->has_vit && !c->counting)
                continue;
            c->grad = 1;
            c->ckpt = 0;
            feat = mlp_module(c, feat);
        } else {
            c->unused = 0;
            c->grad = 1;
            c->ckpt = t->gradient_checkpointing;
            /* HF enable_input_require_grads() when checkpointing a frozen/LoRA
             * LLM: the embedding output requires grad */
            c->pretrain_input_grads = t->gradient_checkpointing && !m->trainable;
            int32_t loss = llama_module(c, c->has_vit ? feat : -1);
            return loss;
        }
    }
    return -1;
}
