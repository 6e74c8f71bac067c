/* connector.c - vision features -> language-model tokens:
 *   mlp            LLaVA / LLaVA-OneVision: Linear, GELU, Linear (its input may be a
 *                  non-contiguous [:, 1:] view: the Linear reshapes it, a copy);
 *   patch_merger   Qwen2-VL / 2.5-VL / 3-VL: norm per patch, 2x2 patches as one row,
 *                  Linear(4h, 4h), GELU, Linear(4h, out) (2.5-VL: rows back in image order);
 *   pixel_shuffle  InternVL (LayerNorm(4h), Linear, GELU, Linear) and Idefics3 /
 *                  SmolVLM (one Linear): two permute().contiguous() copies first;
 *   avg_pool       Gemma 3: (B, h, g, g) copy, AvgPool2d, Gemma RMSNorm, matmul;
 *   linear         Mllama: one Linear to the text width;
 *   mistral3       Mistral-Small-3.1: RMSNorm, each image's 2x2 patches unfolded into
 *                  one row, Linear(4h, h), then LLaVA's Linear, GELU, Linear.
 * Qwen3-VL's DeepStack mergers (norm after the merge) run from the vision
 * loop through connector_deepstack. */
#include "block.h"
#include "ops.h"
#include "util.h"

static uint64_t esz_of(const lctx *c, int32_t id)
{
    return id >= 0 && c->s->t[id].esz ? c->s->t[id].esz : c->dt;
}

static const char *const lin_names[2][4] = {
    {"linear_1", "linear_2", "linear_3", "linear_4"},
    {"deepstack.linear_1", "deepstack.linear_2", "deepstack.linear_3", "deepstack.linear_4"}};
static const char *const act_names[2][4] = {{"act_1", "act_2", "act_3", "act_4"},
                                            {"deepstack.act_1", "deepstack.act_2",
                                             "deepstack.act_3", "deepstack.act_4"}};

/* Linear (-> act -> Linear ...) over rows x in; widths in -> mid ... -> out */
static int32_t mlp(lctx *c, int32_t x, uint64_t rows, uint64_t in, uint64_t mid, uint64_t out)
{
    const module_spec *m = c->m;
    uint64_t L = m->num_layers;
    int ds = c->per_layer; /* DeepStack mergers are the connector's repeated rows */
    for (uint64_t l = 0; l < L; l++) {
        uint64_t wi = l == 0 ? in : mid, wo = l + 1 == L ? out : mid;
        int32_t y = op_linear(c, lin_names[ds][l < 4 ? l : 3], x, rows, wi, wo, m->conn_bias,
                              LT_MLP_ALL);
        op_drop(c, x);
        x = y;
        if (l + 1 < L) {
            int32_t a = op_activation(c, act_names[ds][l < 4 ? l : 3], x, op_mul(c, rows, wo),
                                      m->act);
            op_drop(c, x);
            x = a;
        }
    }
    return x;
}

/* a contiguous copy that backward passes straight through */
static int32_t copy(lctx *c, uint32_t r, int32_t x, uint64_t elems)
{
    int32_t y = op_new(c, r, elems, esz_of(c, x));
    sim_node *n = op_node(c, r, y, x, -1, -1, 0);
    (void)n;
    op_drop(c, x);
    return y;
}

static int32_t merger(lctx *c, int32_t x, uint64_t rows, uint64_t h, int norm_after)
{
    const module_spec *m = c->m;
    uint64_t k = op_mul(c, m->merge_size, m->merge_size), wide = op_mul(c, h, k);
    uint64_t out_rows = rows / k;
    if (!norm_after && m->conn_norm != NORM_NONE) {
        int32_t z = op_norm(c, "ln_q", x, rows, h, m->conn_norm, 1);
        op_drop(c, x);
        x = z;
    }
    /* .view(-1, 4h): no copy */
    if (norm_after) {
        int32_t z = op_norm(c, c->per_layer ? "deepstack.norm" : "norm", x, out_rows, wide,
                            m->conn_norm == NORM_NONE ? NORM_LAYER : m->conn_norm, 1);
        op_drop(c, x);
        x = z;
    }
    uint64_t mid = m->intermediate_size ? m->intermediate_size : wide;
    return mlp(c, x, out_rows, wide, mid, m->hidden_size);
}

static int32_t pixel_shuffle(lctx *c, int32_t x, uint64_t rows, uint64_t h)
{
    const module_spec *m = c->m;
    uint64_t k = op_mul(c, m->merge_size, m->merge_size), wide = op_mul(c, h, k);
    uint32_t r = op_row(c, "pixel_shuffle", "copy");
    op_label(c, "pixel shuffle", r);
    x = copy(c, r, x, op_mul(c, rows, h)); /* permute(0, 2, 1, 3).contiguous() */
    x = copy(c, r, x, op_mul(c, rows, h)); /* and again after the second view */
    uint64_t out_rows = rows / k;
    if (m->conn_norm != NORM_NONE) {
        int32_t z = op_norm(c, "layer_norm", x, out_rows, wide, m->conn_norm, 1);
        op_drop(c, x);
        x = z;
    }
    uint64_t mid = m->intermediate_size ? m->intermediate_size : m->hidden_size;
    return mlp(c, x, out_rows, wide, mid, m->hidden_size);
}

static int32_t avg_pool(lctx *c, int32_t x, uint64_t rows, uint64_t h)
{
    const module_spec *m = c->m;
    uint64_t kk = op_mul(c, m->pool_kernel, m->pool_kernel), out_rows = rows / kk;
    uint32_t r = op_row(c, "avg_pool", "pool");
    op_label(c, "avg pool", r);
    x = copy(c, r, x, op_mul(c, rows, h)); /* transpose + reshape: a copy */
    int32_t p = op_new(c, r, op_mul(c, out_rows, h), esz_of(c, x));
    op_node(c, r, p, x, -1, -1, 0); /* AvgPool2dBackward keeps sizes */
    op_drop(c, x);
    int32_t z = op_decoder_norm(c, "mm_soft_emb_norm", p, out_rows, h, m->conn_norm); /* Liger */
    op_drop(c, p);
    int32_t y = op_linear(c, "mm_input_projection", z, out_rows, h, m->hidden_size, 0,
                          LT_MLP_ALL);
    op_drop(c, z);
    return y;
}

/* Mistral3MultiModalProjector.forward (transformers 5.17 models/mistral3/
 * modeling_mistral3.py, Mistral3PatchMerger.forward): norm (a new (P, h)); per
 * image view / permute (views) and F.unfold(kernel = stride = merge): im2col, a new
 * (h k, P_i / k) whose col2im backward is a full-size gradient; .view().t() (views);
 * torch.cat, a new (P / k, h k) the merging Linear keeps; the unfolded list and the
 * normed features go when the merger returns */
static int32_t mistral3(lctx *c, int32_t x, uint64_t rows, uint64_t h)
{
    const module_spec *m = c->m;
    uint64_t k = op_mul(c, m->merge_size, m->merge_size), out_rows = rows / k;
    int32_t z = op_norm(c, "norm", x, rows, h, m->conn_norm, 1);
    op_drop(c, x);
    uint32_t r = op_row(c, "patch_merger", "unfold");
    op_label(c, "patch merger unfold", r);
    int32_t un = op_new(c, r, op_mul(c, rows, h), esz_of(c, z));
    op_node(c, r, un, z, -1, -1, 0);
    int32_t cat = op_new(c, r, op_mul(c, rows, h), esz_of(c, z));
    sim_node *n = op_node(c, r, cat, un, -1, -1, 0);
    if (n)
        n->grad_views = 1;
    int32_t y = op_linear(c, "patch_merger.merging_layer", cat, out_rows, op_mul(c, h, k), h, 0,
                          LT_MLP_ALL);
    op_drop(c, cat);
    op_drop(c, un);
    op_drop(c, z);
    uint64_t mid = m->intermediate_size ? m->intermediate_size : m->hidden_size;
    return mlp(c, y, out_rows, h, mid, m->hidden_size);
}

int32_t connector_module(lctx *c, int32_t feat)
{
    const module_spec *m = c->m;
    uint64_t h = m->input_size, rows = c->T;
    if (m->image_newline) /* appended after each row of features: a tiny concat */
        op_param(c, op_row(c, "image_newline", "parameter"), m->hidden_size, op_trainable(c));
    uint32_t r = op_row(c, "input_copy", "copy");
    switch (m->conn) {
    case CONN_PATCH_MERGER:
        return merger(c, feat, rows, h, m->conn_norm_after);
    case CONN_PIXEL_SHUFFLE:
        return pixel_shuffle(c, feat, rows, h);
    case CONN_AVG_POOL:
        return avg_pool(c, feat, rows, h);
    case CONN_MISTRAL3:
        return mistral3(c, feat, rows, h);
    case CONN_MLP:
    case CONN_LINEAR:
    default: {
        int32_t x = feat;
        if (feat >= 0 && c->s->t[feat].base >= 0) /* the [:, 1:] view: Linear reshapes (copies) */
            x = copy(c, r, feat, op_mul(c, rows, h));
        uint64_t mid = m->intermediate_size ? m->intermediate_size : m->hidden_size;
        return mlp(c, x, rows, h, mid, m->hidden_size);
    }
    }
}

/* Qwen3VLVisionModel: deepstack_merger_list[k](hidden_states) right after a
 * tapped vision layer (its LayerNorm after the 2x2 merge); the features wait
 * for the decoder's first layers */
int32_t connector_deepstack(lctx *c, int32_t x)
{
    const module_spec *cm = resolved_spec_of(c->rm, MOD_CONNECTOR);
    if (!cm)
        return -1;
    lctx outer = *c;
    prog_enter_module(c, (uint32_t)c->rm->connector);
    c->per_layer = 1;
    c->force_frozen = cm->deepstack_frozen;
    op_hold(c, x);
    int32_t y = merger(c, x, c->T, cm->input_size, 1);
    outer.amp_cache = c->amp_cache;
    outer.n_amp = c->n_amp;
    outer.cap_amp = c->cap_amp;
    *c = outer;
    return y;
}
