/* ops_loss.c - the token embedding and the output side of a causal LM: the
 * lm_head and the loss, standard (transformers ForCausalLMLoss, with the fp32
 * upcast), chunked (torchtune CEWithChunkedOutputLoss) or fused with the
 * lm_head (Liger fused linear cross-entropy), and logits_to_keep. */
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* nn.Embedding: keeps the indices (alive anyway).  Backward (CUDA
 * embedding_dense_backward_cuda): the V x h gradient, sorted / segment index
 * buffers and fp32 partial sums per segment (<= T rows of h). */
int32_t op_embedding(lctx *c, const char *name, uint64_t T, uint64_t V, uint64_t h, int tied,
                     uint64_t extra_bwd)
{
    uint32_t r = op_row(c, name, "embedding");
    int save = c->m->lora.enabled && c->m->lora.save_embed;
    if (save) { /* modules_to_save: the frozen original, and the copy that trains */
        op_param(c, r, op_mul(c, V, h), 0);
        r = op_row(c, "embed_tokens.modules_to_save", "embedding");
        c->force_tw = 1;
    }
    int tw = op_trainable(c);
    c->force_tw = 0;
    op_param(c, r, op_mul(c, V, h), tw);
    op_label(c, name, r);
    int32_t emb = op_new(c, r, op_mul(c, T, h), c->wdt);
    sim_node *n = op_node(c, r, emb, -1, -1, -1, tw);
    if (n) {
        op_wgrad(c, n, op_mul(c, V, h));
        n->bwd_tmp = sim_add(c->s, op_mul(c, T, 4 * I64), op_mul3(c, T, h, F32));
        n->bwd_tmp = sim_add(c->s, n->bwd_tmp, extra_bwd);
        if (tied && !save) /* the tied lm_head's gradient came first and is .grad: added */
            n->wgrad_transient = 1;
    }
    return emb;
}

/* cross_entropy: log_softmax (LogSoftmaxBackward keeps its output, in the logits'
 * dtype: fp32 after the upcast, else 16-bit) + nll_loss (keeps it and the target).
 * Returns the loss. */
static int32_t cross_entropy(lctx *c, uint32_t rl, int32_t l32, uint64_t rows, uint64_t V,
                             int32_t target)
{
    uint64_t TV = op_mul(c, rows, V), e = esz_of(c, l32);
    /* loss_parallel (c->loss_parallel, V the rank's vocabulary shard; torch 2.13
     * torch/distributed/tensor/parallel/loss.py): _log_softmax (l.197-221) makes
     * shifted = x - all_reduce(amax) and exp(shifted) for the sum before the result,
     * shifted - logsumexp; its backward (l.259-266) is grad_output.to(input_dtype),
     * the same tensor; _nll_loss_and_log_softmax_backward (l.451-518) makes
     * zeros_like(x), exp(x), their sum and the sum * grad_output, three of them alive
     * at once beside the output gradient's bytes */
    int32_t shifted = c->loss_parallel ? op_new(c, rl, TV, e) : -1;
    if (c->loss_parallel && !c->counting)
        sim_transient(c->s, rl, op_mul(c, TV, e));
    int32_t lsm = op_new(c, rl, TV, e);
    op_drop(c, shifted);
    sim_node *n = op_node(c, rl, lsm, l32, -1, -1, 0);
    op_save(c, n, lsm);
    if (n && c->loss_parallel)
        n->grad_views = 1;
    int32_t loss = op_new(c, rl, 1, F32);
    n = op_node(c, rl, loss, lsm, -1, -1, 0);
    if (n && c->loss_parallel)
        n->bwd_tmp = op_mul3(c, TV, e, 2);
    op_save(c, n, lsm);
    op_save(c, n, target);
    op_drop(c, lsm);
    return loss;
}

/* the lm_head Linear: logits in the compute dtype; keeps z when trainable */
static int32_t lm_head(lctx *c, uint32_t rh, int32_t z, uint64_t rows, uint64_t h, uint64_t V,
                       int tied)
{
    int tw = op_trainable(c);
    if (!tied)
        op_param(c, rh, op_mul(c, V, h), tw);
    op_label(c, "lm_head", rh);
    int32_t wcast = c->amp && c->wdt != c->dt ? op_new(c, rh, op_mul(c, V, h), c->dt) : -1;
    int32_t zc = z;
    if (c->amp && esz_of(c, z) != c->dt)
        zc = op_new(c, rh, op_mul(c, rows, h), c->dt);
    int32_t logits = op_new(c, rh, op_mul(c, rows, V), c->amp ? c->dt : c->wdt);
    sim_node *n = op_node(c, rh, logits, z, -1, -1, tw);
    if (n) {
        if (tw) {
            op_save(c, n, zc);
            op_wgrad(c, n, op_mul(c, V, h));
        } else if (op_linear_keeps_input(c, tw, z)) {
            op_save(c, n, z); /* ZeRO-3's linear (ops.c op_linear_keeps_input) */
        }
        if (op_rg(c, z))
            op_save(c, n, wcast);
    }
    if (zc != z)
        op_drop(c, zc);
    op_drop(c, wcast);
    return op_lora_head(c, z, logits, rows, h, V); /* LoRA on lm_head (ops_lora.c) */
}

/* transformers ForCausalLMLoss (>= 4.46): logits.float(), labels padded and
 * shifted (no logits copy; transformers 5.17 loss/loss_utils.py:59-70).  Before
 * 4.46 the model kept logits.float() in its output and the loss made a shifted
 * .contiguous() fp32 copy.  training.loss_upcast false: the same loss without
 * :59, cross_entropy straight on the 16-bit logits (a custom loop's
 * nn.CrossEntropyLoss on the model's output): log_softmax's output, kept for
 * backward, and the gradients are 16-bit (refused under autocast: spec_train.c). */
static int32_t standard_loss(lctx *c, int32_t logits, uint64_t rows, uint64_t V)
{
    uint32_t rl = op_row(c, "loss", "cross_entropy");
    op_label(c, "loss", rl);
    uint64_t TV = op_mul(c, rows, V), B = c->B;
    int32_t l32 = logits;
    if (esz_of(c, logits) != F32 && c->rm->training.loss_upcast)
        l32 = op_plain(c, rl, logits, -1, TV, F32);
    else
        op_hold(c, logits);
    const framework_spec *fw = &c->rm->framework;
    int old_tf = fw->tf_major < 4 || (fw->tf_major == 4 && fw->tf_minor < 46);
    uint64_t srows = old_tf && rows > B ? rows - B : rows;
    int32_t src = l32;
    if (old_tf)
        src = op_plain(c, rl, l32, -1, op_mul(c, srows, V), F32);
    int32_t lab = op_new(c, rl, rows + B, I64); /* pad(labels) */
    int32_t shl = op_new(c, rl, rows, I64);     /* shifted labels */
    op_drop(c, lab);
    int32_t loss = cross_entropy(c, rl, src, srows, V, shl);
    op_drop(c, shl);
    if (src != l32)
        op_drop(c, src);
    if (!old_tf)
        op_drop(c, l32); /* local to the loss function */
    /* the model output (logits, and the fp32 logits before 4.46) is dropped when
     * compute_loss returns, before backward */
    c->late_drop[0] = logits;
    c->late_drop[1] = old_tf ? l32 : -1;
    return loss;
}

/* torchtune CEWithChunkedOutputLoss: the lm_head runs on n chunks of the
 * tokens; each chunk is upcast and reduced on its own, so the fp32 copy is
 * one chunk's at a time (the log-softmax results are still all kept) */
static int32_t chunked_loss(lctx *c, int32_t z, uint64_t rows, uint64_t h, uint64_t V, int tied,
                            uint32_t rh)
{
    uint64_t n = c->rm->training.loss_chunks, per = (rows + n - 1) / n;
    uint32_t rl = op_row(c, "loss", "cross_entropy");
    int32_t logits = lm_head(c, rh, z, rows, h, V, tied); /* the chunks, all alive */
    op_label(c, "loss (chunked)", rl);
    int32_t shl = op_new(c, rl, rows, I64);
    int32_t keep = op_new(c, rl, op_mul3(c, rows - per, V, F32), 1); /* earlier chunks' lsm */
    sim_node *kn = op_node(c, rl, keep, logits, -1, -1, 0);
    op_save(c, kn, keep);
    int32_t l32 = op_plain(c, rl, logits, -1, op_mul(c, per, V), F32);
    int32_t loss = cross_entropy(c, rl, l32, per, V, shl);
    op_drop(c, l32);
    op_drop(c, keep);
    op_drop(c, shl);
    c->late_drop[0] = logits;
    return loss;
}

/* Liger LigerFusedLinearCrossEntropyFunction.forward: rows in chunks of
 * next_pow2(ceil(rows / ceil(V / h))); each chunk's logits are computed, turned
 * into their gradient in place, and multiplied back at once: grad_input
 * (rows x h) and grad_weight (V x h) are made in forward and kept until
 * backward scales them (fused_linear_cross_entropy.py). */
static int32_t fused_loss(lctx *c, int32_t z, uint64_t rows, uint64_t h, uint64_t V, int tied,
                          uint32_t rh)
{
    int tw = op_trainable(c);
    if (!tied)
        op_param(c, rh, op_mul(c, V, h), tw);
    uint32_t rl = op_row(c, "loss", "fused_linear_cross_entropy");
    op_label(c, "loss (fused linear)", rl);
    uint64_t inc = (V + h - 1) / h, chunk = 1, want = (rows + inc - 1) / inc;
    while (chunk < want)
        chunk <<= 1;
    if (chunk > rows)
        chunk = rows;
    uint64_t ze = esz_of(c, z);
    int32_t gin = op_rg(c, z) ? op_new(c, rl, op_mul(c, rows, h), ze) : -1;
    /* grad_weight becomes .grad as it is (AccumulateGrad steals it): made now,
     * alive until zero_grad */
    if (tw && !c->counting && c->grad)
        sim_alloc(c->s, rh, op_mul(c, op_mul(c, V, h), c->gdt), F_GRAD, 0);
    if (!c->counting)
        sim_transient(c->s, rl, sim_add(c->s, op_mul3(c, chunk, V, ze), op_mul3(c, chunk, V, F32)));
    int32_t loss = op_new(c, rl, 1, F32);
    sim_node *n = op_node(c, rl, loss, z, -1, -1, 0);
    op_save(c, n, gin);
    op_drop(c, gin);
    return loss;
}

void op_unit_event(lctx *c, uint64_t unit, int what)
{
    sim *s = c->s;
    if (!c->unit_events || !s->on_layer || c->counting)
        return;
    sim_layer_ev e = {.module = c->mi, .layer = unit, .count = 1, .what = what, .grad = c->grad};
    s->on_layer(s, &e, s->on_layer_ctx);
}

static int32_t head_loss(lctx *c, int32_t z, uint64_t rows, uint64_t h, uint64_t V, int tied,
                         uint32_t rh)
{
    loss_kind k = c->rm->training.loss;
    if (k == LOSS_FUSED_LINEAR)
        return fused_loss(c, z, rows, h, V, tied, rh);
    if (k == LOSS_CHUNKED)
        return chunked_loss(c, z, rows, h, V, tied, rh);
    op_unit_event(c, OP_UNIT_HEAD, SIM_LAYER_BEGIN); /* lm_head's FSDP unit */
    int32_t logits = lm_head(c, rh, z, rows, h, V, tied);
    op_unit_event(c, OP_UNIT_HEAD, SIM_LAYER_END);
    return standard_loss(c, logits, rows, V);
}

int32_t op_lm_head_loss(lctx *c, int32_t z, uint64_t rows, uint64_t h, uint64_t V, int tied)
{
    uint32_t rh = op_row(c, tied ? "embed_tokens" : "lm_head", tied ? "embedding" : "linear");
    if (!(c->m->lora.enabled && c->m->lora.save_head))
        return head_loss(c, z, rows, h, V, tied, rh);
    /* modules_to_save: the frozen original (the tied embedding's weight, or its
     * own) stays, an untied trainable copy computes the logits */
    if (!tied)
        op_param(c, rh, op_mul(c, V, h), 0);
    c->force_tw = 1;
    int32_t loss = head_loss(c, z, rows, h, V, 0, op_row(c, "lm_head.modules_to_save", "linear"));
    c->force_tw = 0;
    return loss;
}
