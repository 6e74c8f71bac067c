/* ops_attn.c - rotary embeddings and the attention core: eager (HF
 * eager_attention_forward), torch SDPA (the CUDA flash or memory-efficient
 * kernel, as torch picks them) and flash-attn 2.  Packed vision sequences
 * (attention per image) run as `chunks` sequences of S tokens: everything
 * saved is summed over chunks, the working set of the kernel is one chunk's. */
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

static uint64_t round_up(uint64_t x, uint64_t m)
{
    return (x + m - 1) / m * m;
}

/* apply_rotary_pos_emb: (x * cos) + (rotate_half(x) * sin).  MulBackward0
 * keeps cos / sin (shared by every layer: no new bytes); rotate_half makes
 * -x2 (half) and a cat (full); everything else is a temporary.  The vision
 * variant (Qwen) runs it on fp32 copies and casts the result back. */
int32_t op_rope(lctx *c, uint32_t r, int32_t x, uint64_t elems, int fp32)
{
    uint64_t e0 = esz_of(c, x), ce = esz_of(c, c->cos);
    int32_t xf = x;
    if (fp32 && e0 != F32)
        xf = op_plain(c, r, x, -1, elems, F32);
    uint64_t e = fp32 ? F32 : (e0 > ce ? e0 : ce);
    int32_t t1 = op_new(c, r, elems, e);
    sim_node *n = op_node(c, r, t1, xf, -1, -1, 0);
    op_save(c, n, c->cos);
    int32_t ng = op_plain(c, r, xf, -1, elems / 2, esz_of(c, xf));
    int32_t rh = op_new(c, r, elems, esz_of(c, xf));
    n = op_node(c, r, rh, ng, xf, -1, 0);
    if (n)
        n->grad_views = 1; /* CatBackward: narrow views of the gradient */
    op_drop(c, ng);
    int32_t t2 = op_new(c, r, elems, e);
    n = op_node(c, r, t2, rh, -1, -1, 0);
    op_save(c, n, c->sin);
    op_drop(c, rh);
    int32_t o = op_add(c, r, t1, t2, elems, e);
    op_drop(c, t1);
    op_drop(c, t2);
    if (xf != x)
        op_drop(c, xf);
    if (!fp32 || e0 == F32)
        return o;
    int32_t y = op_plain(c, r, o, -1, elems, e0);
    op_drop(c, o);
    return y;
}

/* repeat_kv: expand + reshape, a copy with every head */
static int32_t repeat_kv(lctx *c, uint32_t r, int32_t k, uint64_t qe)
{
    return op_plain(c, r, k, -1, qe, esz_of(c, k));
}

/* The CUDA softmax backward (aten/src/ATen/native/cuda/SoftMax.cu,
 * TORCH_IMPL_FUNC(softmax_backward_cuda_out): `Tensor tmp = grad * output;`
 * before host_softmax_backward) makes a product of the incoming gradient and
 * the kept probabilities, in the gradient's dtype, after the structured op has
 * allocated grad_input and alive until it returns.  _softmax and _safe_softmax
 * (the math SDPA's) both differentiate through _softmax_backward_data
 * (tools/autograd/derivatives.yaml). */
static void softmax_bwd_tmp(lctx *c, sim_node *n, uint64_t elems, uint64_t esz)
{
    if (n)
        n->bwd_tmp = op_mul(c, elems, esz);
}

/* torch.matmul of two 4-D tensors (aten/src/ATen/native/LinearAlgebra.cpp
 * _matmul_impl, both dims >= 3): `tensor1.expand(...).reshape(tensor1_bmm_view)`,
 * then the same for tensor2, then `tensor1_expanded.bmm(tensor2_expanded)`.  The
 * reshape to (B * heads, rows, cols) is a view only when B and heads merge; a
 * (B, heads, S, d) view of a (B, S, heads, d) Linear output (transformers'
 * `.view(hidden_shape).transpose(1, 2)`, and the rotary's outputs, which keep its
 * strides) merges only when B, heads or S is 1, so it is copied, and BmmBackward0
 * keeps the copy (the original dies with the attention's locals).  repeat_kv's
 * expand + reshape and the softmax's output are contiguous: views. */
static int32_t mm_operand(lctx *c, uint32_t r, int32_t x, uint64_t B, uint64_t heads,
                          uint64_t rows, uint64_t elems, int strided)
{
    if (!strided || B < 2 || heads < 2 || rows < 2) {
        op_hold(c, x);
        return x;
    }
    int32_t y = op_new(c, r, elems, esz_of(c, x));
    sim_node *n = op_node(c, r, y, x, -1, -1, 0);
    if (n)
        n->grad_views = 1; /* CloneBackward0 passes the gradient on */
    return y;
}

/* eager_attention_forward: scores = q k^T (keeps what it multiplies) -> * scaling -> + mask
 * -> softmax(dtype=float32).to(dtype) (SoftmaxBackward keeps the fp32 result;
 * the old scores stay referenced until the expression assigns) -> p v (keeps p,
 * v) -> transpose(1, 2).contiguous(), a copy the output projection keeps.
 * (transformers 5.17 models/llama/modeling_llama.py:204-211.)  In backward the
 * softmax holds the gradient (fp32 from ToCopyBackward), its kept output,
 * grad_input and the kernel's grad * output: 4 x (B, H, S, Skv).  Not modelled:
 * fp16 inputs on CUDA take _softmax(half_to_float=true) (aten SoftMax.cpp
 * softmax(): Half only, not BFloat16), with no fp32 input copy and an fp16
 * grad_input; this models bf16's path for every 16-bit dtype.
 * Both matmuls copy their strided operands first (mm_operand): q and k (not
 * repeated) before the scores, v (not repeated) before p v; the copies are what
 * the bmm keeps, freed at once without autograd (the H200 trace of
 * tests/gpu_data/traces/trace-llava7b-pretrain-eager-ck16-b16-s1024-ck1 frees k's
 * copy, then q's, after the scores).  The probabilities are returned beside the
 * output (modeling_llama.py:213): o->weights receives them held. */
static int32_t eager(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v, const attn_opts *o)
{
    uint64_t skv = o->Skv ? o->Skv : o->S, dt = esz_of(c, q);
    uint64_t ss = op_mul3(c, o->B, o->heads, op_mul(c, o->S, skv));
    uint64_t qe = op_mul3(c, o->B, o->S, op_mul(c, o->heads, o->d));
    uint64_t pb = o->softmax_fp32 ? F32 : dt;
    /* chunks before the last: what they keep (fp32 and dtype probabilities) and
     * their contiguous outputs waiting for the cat */
    int32_t prior = -1, prior_out = -1;
    if (o->chunks > 1) {
        prior = op_new(c, r, op_mul(c, ss, o->chunks - 1), pb + (pb != dt ? dt : 0));
        prior_out = op_new(c, r, op_mul(c, qe, o->chunks - 1), dt);
    }
    uint64_t ke = op_mul3(c, o->B, skv, op_mul(c, o->heads, o->d));
    int32_t qc = mm_operand(c, r, q, o->B, o->heads, o->S, qe, 1);
    int32_t kc = mm_operand(c, r, k, o->B, o->heads, skv, ke, o->kv == o->heads);
    int32_t sc = op_new(c, r, ss, dt);
    sim_node *n = op_node(c, r, sc, qc, kc, -1, 0);
    op_save(c, n, qc);
    op_save(c, n, kc);
    op_save(c, n, prior);
    op_drop(c, kc);
    op_drop(c, qc);
    op_drop(c, prior);
    int32_t sc2 = op_plain(c, r, sc, -1, ss, dt); /* * scaling */
    op_drop(c, sc);
    uint64_t se = dt; /* the scores' dtype after the mask */
    if (o->mask >= 0 || o->causal) {
        /* a float mask of a wider dtype (Pixtral's fp32 mask under autocast) promotes */
        if (o->float_bias && o->mask >= 0 && esz_of(c, o->mask) > dt)
            se = esz_of(c, o->mask);
        int32_t sc3 = op_plain(c, r, sc2, -1, ss, se); /* + attention_mask */
        op_drop(c, sc2);
        sc2 = sc3;
    }
    int32_t f = sc2;
    if (pb != se) /* softmax(dtype=float32) converts its input first */
        f = op_plain(c, r, sc2, -1, ss, F32);
    int32_t p32 = op_new(c, r, ss, pb);
    n = op_node(c, r, p32, f, -1, -1, 0);
    op_save(c, n, p32);
    softmax_bwd_tmp(c, n, ss, pb);
    if (f != sc2)
        op_drop(c, f);
    int32_t p = p32;
    if (pb != dt) { /* .to(query.dtype) */
        p = op_plain(c, r, p32, -1, ss, dt);
        op_drop(c, p32);
    }
    op_drop(c, sc2);
    int32_t vc = mm_operand(c, r, v, o->B, o->heads, skv, ke, o->kv == o->heads);
    int32_t out = op_new(c, r, qe, dt);
    n = op_node(c, r, out, p, vc, -1, 0);
    op_save(c, n, p);
    op_save(c, n, vc);
    op_drop(c, vc);
    if (o->weights && o->chunks <= 1)
        *o->weights = p;
    else
        op_drop(c, p);
    int32_t oc = op_plain(c, r, out, -1, qe, dt); /* transpose(1, 2).contiguous() */
    op_drop(c, out);
    if (prior_out < 0)
        return oc;
    int32_t cat = op_new(c, r, op_mul(c, qe, o->chunks), dt); /* torch.cat(chunk outputs) */
    n = op_node(c, r, cat, oc, -1, -1, 0);
    if (n)
        n->grad_views = 1;
    op_drop(c, oc);
    op_drop(c, prior_out);
    return cat;
}

/* The fused kernels write the output in (B, S, heads, d) storage, so the
 * transpose(1, 2).contiguous() after them is free.
 *   flash (torch SDPA on CUDA for fp16/bf16 without a mask, and flash-attn 2):
 *     keeps q, k, v, out and an fp32 logsumexp (B, heads, S); backward makes
 *     dq_accum fp32 (B, S up to 128, heads, d up to 32) and softmax_d fp32
 *     (B, heads, S up to 128) (flash_api.cpp mha_bwd), and with fewer kv heads
 *     dk / dv for every head before summing them.
 *   memory-efficient (a mask, or fp32): logsumexp (B, heads, S up to 32); backward
 *     makes delta fp32 (B, heads, S) and an fp32 dq accumulator for 16-bit inputs
 *     (mem_eff_attention kernel_backward.h, kNeedsAccumGradQ). */
static int32_t fused(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v, const attn_opts *o,
                     int flash)
{
    uint64_t dt = esz_of(c, q), B = o->B, a = o->heads;
    uint64_t qe = op_mul3(c, B, o->S, op_mul(c, a, o->d));
    uint64_t S_lse = flash ? o->S : round_up(o->S, 32);
    uint64_t lse = op_mul3(c, B, a, S_lse);
    /* a bool mask (HF's sdpa masks) becomes a q-dtype bias each call
     * (attention.cpp convert_boolean_attn_mask), its last dim padded to 16 for
     * the memory-efficient kernel (preprocess_mask / pad_bias), which saves it */
    int32_t bias = -1;
    if (!flash && o->mask >= 0 && c->s->t[o->mask].esz == 1) {
        uint64_t skv = o->Skv ? o->Skv : o->S, bq = B / (o->chunks ? o->chunks : 1);
        bias = op_new(c, r, op_mul3(c, bq, o->S, round_up(skv, 16)), dt);
    } else if (!flash && o->mask >= 0 && o->float_bias) {
        /* a float mask (Pixtral's) goes in as it is: the memory-efficient kernel
         * saves it, or, when its last dim is no multiple of 16, a padded copy
         * made in this call (attention.cpp preprocess_mask / pad_bias) */
        uint64_t skv = o->Skv ? o->Skv : o->S, me = esz_of(c, o->mask);
        int32_t m = o->mask;
        if (c->amp && me != dt) { /* autocast casts every floating argument, the mask too
                                     (lower_precision_fp list), per call */
            m = op_new(c, r, op_mul3(c, B, o->S, skv), dt);
            me = dt;
        } else {
            op_hold(c, m);
        }
        if (skv % 16) {
            bias = op_new(c, r, op_mul3(c, B, o->S, round_up(skv, 16)), me);
            op_drop(c, m);
        } else {
            bias = m;
        }
    }
    /* the kernel's outputs: selective checkpointing saves them (op_sac_new) */
    int32_t out = op_sac_new(c, r, qe, dt);
    int32_t l = op_sac_new(c, r, lse, F32);
    sim_node *n = op_node(c, r, out, q, k, v, 0);
    op_save(c, n, q);
    op_save(c, n, k);
    op_save(c, n, v);
    op_save(c, n, out);
    op_save(c, n, l);
    op_save(c, n, bias);
    op_drop(c, bias);
    if (n) {
        uint64_t tmp;
        if (flash) {
            uint64_t dqa = op_mul3(c, B, round_up(o->S, 128), op_mul(c, a, round_up(o->d, 32)));
            tmp = sim_add(c->s, op_mul(c, dqa, F32), op_mul3(c, B, a, round_up(o->S, 128) * F32));
            if (o->kv < a) /* dk, dv expanded to every head, then summed */
                tmp = sim_add(c->s, tmp, op_mul(c, 2 * qe, dt));
        } else {
            tmp = op_mul3(c, B, a, o->S * F32);
            if (dt != F32)
                tmp = sim_add(c->s, tmp, op_mul(c, qe, F32));
        }
        n->bwd_tmp = tmp;
    }
    op_drop(c, l);
    return out;
}

/* The math backend, what CUDA SDPA runs when neither fused kernel takes the
 * call: enable_gqa=True with fp32 inputs (flash needs 16 bits, memory-efficient
 * has no GQA through torch 2.13 - sdp_utils.cpp check_batch_size_and_num_heads_dense
 * <false>; pytorch PR #191085 adds it).  attention.cpp
 * _scaled_dot_product_attention_math: q * sqrt(scale) (kept by the matmul),
 * repeat_interleave'd k / v (k's scaled transpose kept, v kept), scores
 * (B, heads, S, Skv) + the causal mask (a bool tril and its q-dtype where()),
 * _softmax (keeps its output), p @ v; the (B, heads, S, d) result is not in
 * (B, S, heads, d) storage, so the transpose(1, 2).contiguous() after it copies. */
static int32_t math_sdpa(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v, const attn_opts *o)
{
    uint64_t skv = o->Skv ? o->Skv : o->S, dt = esz_of(c, q), B = o->B * (o->chunks ? o->chunks : 1);
    uint64_t ss = op_mul3(c, B, o->heads, op_mul(c, o->S, skv));
    uint64_t qe = op_mul3(c, B, o->S, op_mul(c, o->heads, o->d));
    uint64_t ke = op_mul3(c, B, skv, op_mul(c, o->heads, o->d));
    int32_t qs = op_plain(c, r, q, -1, qe, dt);
    int32_t kx = o->kv < o->heads ? op_plain(c, r, k, -1, ke, dt) : k;
    int32_t vx = o->kv < o->heads ? op_plain(c, r, v, -1, ke, dt) : v;
    int32_t ks = op_plain(c, r, kx, -1, ke, dt);
    if (kx != k)
        op_drop(c, kx);
    int32_t mask = -1;
    if (o->causal) { /* ones(L, S, bool).tril() -> where(~m, -inf, 0) in q's dtype */
        int32_t mb = op_new(c, r, op_mul(c, o->S, skv), 1);
        mask = op_new(c, r, op_mul(c, o->S, skv), dt);
        op_drop(c, mb);
    }
    int32_t sc = op_new(c, r, ss, dt);
    sim_node *n = op_node(c, r, sc, qs, ks, -1, 0);
    op_save(c, n, qs);
    op_save(c, n, ks);
    op_drop(c, qs);
    op_drop(c, ks);
    op_drop(c, mask);
    int32_t p = op_new(c, r, ss, dt);
    n = op_node(c, r, p, sc, -1, -1, 0);
    op_save(c, n, p);
    softmax_bwd_tmp(c, n, ss, dt);
    op_drop(c, sc);
    int32_t out = op_new(c, r, qe, dt);
    n = op_node(c, r, out, p, vx, -1, 0);
    op_save(c, n, p);
    op_save(c, n, vx);
    op_drop(c, p);
    if (vx != v)
        op_drop(c, vx);
    int32_t oc = op_plain(c, r, out, -1, qe, dt); /* transpose(1, 2).contiguous() */
    op_drop(c, out);
    return oc;
}

/* a fused SDPA kernel over every chunk; the chunk outputs stay saved and
 * their cat is a copy */
static int32_t sdpa_fused(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v,
                          const attn_opts *o, int flash)
{
    attn_opts all = *o;
    all.B = o->B * (o->chunks ? o->chunks : 1);
    int32_t out = fused(c, r, q, k, v, &all, flash);
    if (o->chunks <= 1)
        return out;
    uint64_t qe = op_mul3(c, o->B, o->S, op_mul(c, o->heads, o->d));
    int32_t cat = op_new(c, r, op_mul(c, qe, o->chunks), esz_of(c, out));
    sim_node *n = op_node(c, r, cat, out, -1, -1, 0);
    if (n)
        n->grad_views = 1;
    op_drop(c, out);
    return cat;
}

/* autocast: matmul and scaled_dot_product_attention run in bf16 (autocast_mode.cpp
 * lower_precision_fp list), so fp32 inputs - q and k after an fp32 rotary - are
 * cast first, and the casts are what the kernels keep */
static int32_t amp_cast(lctx *c, uint32_t r, int32_t x, uint64_t elems)
{
    return c->amp && esz_of(c, x) != c->dt ? op_plain(c, r, x, -1, elems, c->dt) : x;
}

static int32_t attn_core(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v,
                         const attn_opts *o)
{
    attn_kind ak = c->attn;
    uint64_t qe = op_mul3(c, o->B, o->S, op_mul(c, o->heads, o->d));
    /* GQA: eager always repeats k/v; SDPA gets enable_gqa=True when there is
     * no mask (transformers >= 4.48, sdpa_attention.use_gqa_in_sdpa) */
    const framework_spec *fw = &c->rm->framework;
    int old_tf = fw->tf_major < 4 || (fw->tf_major == 4 && fw->tf_minor < 48);
    int repeat = o->kv < o->heads &&
                 (ak == ATT_EAGER || (ak == ATT_SDPA && (old_tf || o->mask >= 0)));
    int32_t kr = k, vr = v;
    if (repeat) {
        kr = repeat_kv(c, r, k, qe);
        vr = repeat_kv(c, r, v, qe);
    } else {
        op_hold(c, k);
        op_hold(c, v);
    }
    int32_t out;
    /* torch SDPA takes the flash kernel for 16-bit inputs without a mask */
    int flash = ak == ATT_FLASH || (esz_of(c, q) == 2 && o->mask < 0 && o->d <= 256);
    if (ak == ATT_EAGER)
        out = eager(c, r, q, kr, vr, o);
    else if (!flash && !repeat && o->kv < o->heads) /* enable_gqa, no fused kernel */
        out = math_sdpa(c, r, q, k, v, o);
    else
        out = sdpa_fused(c, r, q, kr, vr, o, flash);
    op_drop(c, kr);
    op_drop(c, vr);
    return out;
}

int32_t op_attention(lctx *c, uint32_t r, int32_t q, int32_t k, int32_t v, const attn_opts *o)
{
    op_label(c, c->attn == ATT_EAGER ? "attention (eager)" : c->attn == ATT_SDPA
                                           ? "attention (sdpa)" : "attention (flash)", r);
    if (o->weights)
        *o->weights = -1;
    uint64_t n = o->B * (o->chunks ? o->chunks : 1);
    uint64_t qe = op_mul3(c, n, o->S, op_mul(c, o->heads, o->d));
    uint64_t ke = op_mul3(c, n, o->Skv ? o->Skv : o->S, op_mul(c, o->kv, o->d));
    int32_t qc = amp_cast(c, r, q, qe), kc = amp_cast(c, r, k, ke), vc = amp_cast(c, r, v, ke);
    int32_t out = attn_core(c, r, qc, kc, vc, o);
    if (qc != q)
        op_drop(c, qc);
    if (kc != k)
        op_drop(c, kc);
    if (vc != v)
        op_drop(c, vc);
    return out;
}
