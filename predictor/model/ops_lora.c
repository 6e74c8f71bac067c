/* ops_lora.c - PEFT LoRA around a linear layer (peft/tuners/lora/layer.py,
 * Linear.forward, PEFT 0.21):
 *
 *   result = base_layer(x); torch_result_dtype = result.dtype
 *   x = self._cast_input_dtype(x, lora_A.weight.dtype)      # a copy when they differ
 *   result = result + lora_B(lora_A(dropout(x))) * scaling
 *   result = result.to(torch_result_dtype)
 *
 * The adapters' dtype: get_peft_model(autocast_adapter_dtype=True), PEFT's
 * default, upcasts 16-bit adapters to fp32 (tuners_utils.py cast_adapter_dtype),
 * so on a pure-bf16 model the branch runs in fp32 and its parameters, gradients
 * and AdamW states are fp32.  DeepSpeed's bf16 engine casts every parameter back
 * to bf16 (engine.py _configure_distributed_model), so under ZeRO they follow
 * the model.  Under autocast the adapters' linears run in bf16 anyway. */
#include "ops.h"

#include <stdio.h>

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

/* the adapters' parameter dtype */
uint64_t op_lora_bytes(const lctx *c)
{
    const lora_spec *L = &c->m->lora;
    if (L->autocast_adapter_dtype && c->wdt < F32 && !c->deepspeed)
        return F32;
    return c->wdt;
}

void op_lora_rows(lctx *c, const char *name, uint32_t r, uint64_t ae)
{
    if (!c->s->rows[r].lora_a) { /* first use: create the adapter rows once */
        char an[MM_MAX_NAME], bn[MM_MAX_NAME];
        snprintf(an, sizeof an, "%s.lora_A", name);
        snprintf(bn, sizeof bn, "%s.lora_B", name);
        c->s->rows[r].lora_a = sim_row_get_tmp(c->s, c->mi, an, "lora");
        c->s->rows[r].lora_b = sim_row_get_tmp(c->s, c->mi, bn, "lora");
    }
    if (c->counting && ae != c->wdt && !c->amp) {
        c->s->rows[c->s->rows[r].lora_a].pesz = (uint8_t)ae;
        c->s->rows[c->s->rows[r].lora_b].pesz = (uint8_t)ae;
    }
}

/* one adapter linear: y = x W^T, keeping x (and W for dx) */
static int32_t adapter_linear(lctx *c, uint32_t ra, int32_t x, uint64_t rows, uint64_t in,
                              uint64_t out, uint64_t ae, int live)
{
    int32_t xa = x;
    if (c->amp && esz_of(c, x) != c->dt) /* autocast casts the input */
        xa = op_new(c, ra, op_mul(c, rows, in), c->dt);
    int32_t w = op_weight_cast(c, ra, op_mul(c, in, out), live);
    uint64_t oe = c->amp ? c->dt : ae;
    int32_t y = op_mm_new(c, ra, op_mul(c, rows, out), oe); /* nn.Linear, no bias: aten.mm */
    sim_node *n = op_node(c, ra, y, x, -1, -1, live);
    op_save(c, n, xa);
    if (op_rg(c, x))
        op_save(c, n, w);
    if (live)
        op_wgrad_e(c, n, op_mul(c, in, out), c->amp ? c->gdt : ae);
    if (xa != x)
        op_drop(c, xa);
    op_drop(c, w);
    return y;
}

/* lora_B(lora_A(dropout(x))) * scaling on x already in the adapters' dtype.
 * nn.Dropout(p > 0) keeps a bool mask; p == 0 is nn.Identity. */
static int32_t branch(lctx *c, uint32_t r, int32_t x, uint64_t rows, uint64_t in, uint64_t out,
                      uint64_t ae)
{
    const lora_spec *L = &c->m->lora;
    uint32_t ra = c->s->rows[r].lora_a, rb = c->s->rows[r].lora_b;
    int live = !c->dead && !c->unused;
    op_param(c, ra, op_mul(c, in, L->r), live);
    op_param(c, rb, op_mul(c, L->r, out), live);
    int32_t xd = x;
    if (L->dropout > 0) {
        xd = op_new(c, ra, op_mul(c, rows, in), esz_of(c, x));
        int32_t mask = op_new(c, ra, op_mul(c, rows, in), 1);
        sim_node *dn = op_node(c, ra, xd, x, -1, -1, 0);
        op_save(c, dn, mask); /* NativeDropoutBackward keeps the mask */
        op_drop(c, mask);
    }
    int32_t ya = adapter_linear(c, ra, xd, rows, in, L->r, ae, live);
    if (xd != x)
        op_drop(c, xd);
    int32_t yb = adapter_linear(c, rb, ya, rows, L->r, out, ae, live);
    op_drop(c, ya);
    int32_t ys = op_plain(c, rb, yb, -1, op_mul(c, rows, out), esz_of(c, yb)); /* * scaling */
    op_drop(c, yb);
    return ys;
}

/* result = result + adapter_output (a new tensor in the promoted dtype; the
 * base output y is freed with its last reference), then
 * result.to(torch_result_dtype): a copy when the sum was promoted */
static int32_t add_back(lctx *c, uint32_t r, int32_t y, int32_t sum, uint64_t ro, uint64_t ye,
                        int32_t xc)
{
    uint64_t se = esz_of(c, sum);
    int32_t res = op_add(c, r, y, sum, ro, se > ye ? se : ye);
    op_drop(c, y);
    op_drop(c, sum);
    op_drop(c, xc); /* the forward's cast input (-1: none), gone when forward() returns */
    if (esz_of(c, res) == ye)
        return res;
    int32_t back = op_plain(c, r, res, -1, ro, ye);
    op_drop(c, res);
    return back;
}

int32_t op_lora(lctx *c, const char *name, uint32_t r, int32_t x, int32_t y, uint64_t rows,
                uint64_t in, uint64_t out)
{
    uint64_t ae = op_lora_bytes(c), ye = esz_of(c, y), ro = op_mul(c, rows, out);
    op_lora_rows(c, name, r, ae);
    int32_t xc = x;
    if (esz_of(c, x) != ae) /* _cast_input_dtype: alive until forward() returns */
        xc = op_plain(c, r, x, -1, op_mul(c, rows, in), ae);
    int32_t sum = branch(c, r, xc, rows, in, out, ae);
    return add_back(c, r, y, sum, ro, ye, xc != x ? xc : -1);
}

/* LoRA on the output layer (target lm_head): the same lora.Linear, with out = the
 * vocabulary, so lora_B's output, its * scaling, the sum (fp32 when the adapters
 * are: type promotion of bf16 + fp32) and result.to(bf16) are each a logits-sized
 * tensor (layer.py:1102, :1114).  A tied head's adapters get a row of their own:
 * PEFT wraps lm_head alone and the shared weight stays the embedding's
 * (ensure_weight_tying False, its default: lora/config.py:989; only a warning,
 * tuners_utils.py:1454-1462) */
int32_t op_lora_head(lctx *c, int32_t z, int32_t logits, uint64_t rows, uint64_t h, uint64_t V)
{
    const lora_spec *L = &c->m->lora;
    if (!L->enabled || !(L->targets & LT_LM_HEAD))
        return logits;
    uint32_t r = op_row(c, "lm_head", "linear");
    return op_lora(c, "lm_head", r, z, logits, rows, h, V);
}

/* CUDA embedding_dense_backward's scratch (EmbeddingBackwardKernel.cu, as
 * tests/truth/emul.py emulates it): none up to 3072 indices, else int64 sort /
 * segment buffers and fp32 partial sums of the rows */
static uint64_t embedding_scratch(lctx *c, uint64_t T, uint64_t V, uint64_t w)
{
    if (T <= 3072)
        return 0;
    uint64_t seg = T < V ? T : V, part = T / 10 + seg;
    uint64_t idx = sim_add(c->s, op_mul(c, 3 * T + 2 * seg + part + 2, I64), 0);
    return sim_add(c->s, idx, op_mul3(c, part, w, F32));
}

/* PEFT lora.Embedding.forward (layer.py:1487-1537, PEFT 0.21.2) on the base
 * embedding's output y (T x h), no input cast (unlike Linear):
 *   after_A = F.embedding(x, lora_embedding_A.T)      T x r, the adapters' dtype
 *   adapter_output = (after_A @ lora_embedding_B.T) * scaling
 *   [* embed_scale: Gemma 3's scaled embedding, tuners_utils.py:1905]
 *   result = result + adapter_output; result.to(torch_result_dtype)
 * EmbeddingBackward keeps only the indices; matmul (an mm on the T x r view)
 * keeps after_A and B.  lora_embedding_A is (r, V), B (h, r) (layer.py:1242-1244). */
int32_t op_lora_embedding(lctx *c, int32_t y, uint64_t T, uint64_t V, uint64_t h)
{
    const lora_spec *L = &c->m->lora;
    if (!L->enabled || !(L->targets & LT_EMBED))
        return y;
    uint32_t r = op_row(c, "embed_tokens", "embedding");
    uint64_t ae = op_lora_bytes(c), ye = esz_of(c, y), th = op_mul(c, T, h);
    op_lora_rows(c, "embed_tokens", r, ae);
    uint32_t ra = c->s->rows[r].lora_a, rb = c->s->rows[r].lora_b;
    int live = !c->dead && !c->unused;
    op_param(c, ra, op_mul(c, L->r, V), live);
    op_param(c, rb, op_mul(c, h, L->r), live);
    /* F.embedding is on no autocast list: after_A stays in the adapters' dtype */
    int32_t a = op_new(c, ra, op_mul(c, T, L->r), ae);
    sim_node *n = op_node(c, ra, a, -1, -1, -1, live);
    if (n && live) {
        op_wgrad_e(c, n, op_mul(c, L->r, V), c->amp ? c->gdt : ae);
        n->bwd_tmp = embedding_scratch(c, T, V, L->r);
    }
    int32_t b = adapter_linear(c, rb, a, T, L->r, h, ae, live);
    op_drop(c, a);
    int32_t ys = op_plain(c, rb, b, -1, th, esz_of(c, b)); /* * scaling */
    op_drop(c, b);
    if (c->m->scale_embeddings) { /* * embed_scale.to(adapter_output.dtype) */
        int32_t sc = op_plain(c, rb, ys, -1, th, esz_of(c, ys));
        op_drop(c, ys);
        ys = sc;
    }
    return add_back(c, r, y, ys, th, ye, -1);
}
