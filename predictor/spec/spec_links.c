/* spec_links.c - checks between modules and with the training section: one
 * module per kind, widths that must match across the connector, images that
 * need a vision module, the visual tokens that must fit the sequence, and
 * merge / pooling factors that must divide the patch grid. */
#include "spec_internal.h"
#include "tokens.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static int link_fail(dctx *c, const mm_node *at, const module_spec *m, const char *key,
                     const char *fmt, ...) MM_PRINTF(5, 6);
static int link_fail(dctx *c, const mm_node *at, const module_spec *m, const char *key,
                     const char *fmt, ...)
{
    char path[160], what[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    snprintf(path, sizeof path, "%s%s%s", m ? m->name : "", m ? "." : "", key);
    return key_fail(c, at, path, "%s", what);
}

static int one_per_kind(dctx *c, const mm_node *mods, const mm_spec *s)
{
    for (size_t i = 0; i < s->n_modules; i++)
        for (size_t j = 0; j < i; j++)
            if (s->modules[i].kind == s->modules[j].kind) {
                char path[96];
                snprintf(path, sizeof path, "%s.type", s->modules[i].name);
                return key_fail(c, mods->vals[i], path,
                                "a second %s module (%s is one): a spec has at most one vision "
                                "encoder, one connector and one decoder",
                                spec_kind_name(s->modules[i].kind), s->modules[j].name);
            }
    if (!mm_spec_module(s, MOD_DECODER))
        return key_fail(c, mods, "modules", "a decoder (language model) module is required: it "
                                            "produces the logits and the loss");
    return 0;
}

/* the connector's input and output widths */
static int widths(dctx *c, const mm_node *mods, const mm_spec *s)
{
    const module_spec *v = mm_spec_module(s, MOD_VISION), *cn = mm_spec_module(s, MOD_CONNECTOR),
                      *d = mm_spec_module(s, MOD_DECODER);
    if (cn) {
        uint64_t feat = v ? v->hidden_size : cn->input_size;
        if (v && v->kind == MOD_VISION && v->img.kind == IMG_MLLAMA) {
            uint64_t taps = 0;
            for (uint64_t i = 0; i < v->num_hidden_layers; i++)
                taps += lset_has(&v->taps, i);
            feat = v->hidden_size * (1 + taps);
        }
        if (cn->input_size != feat)
            return link_fail(c, mods, cn, "input_size", "%llu does not match the vision output "
                             "width %llu", ULL(cn->input_size), ULL(feat));
        if (cn->hidden_size != d->hidden_size)
            return link_fail(c, mods, cn, "hidden_size", "%llu does not match the decoder's "
                             "hidden_size %llu", ULL(cn->hidden_size), ULL(d->hidden_size));
        if (v && cn->conn == CONN_PATCH_MERGER && cn->merge_size != v->spatial_merge_size)
            return link_fail(c, mods, cn, "merge_size", "%llu differs from the vision "
                             "spatial_merge_size %llu", ULL(cn->merge_size),
                             ULL(v->spatial_merge_size));
    } else if (v && s->training.images_per_sample && v->hidden_size != d->hidden_size &&
               d->merge != MERGE_CROSS_ATTENTION) {
        return key_fail(c, mods, "modules",
                        "without a connector the vision hidden_size must equal the decoder's");
    }
    return 0;
}

/* merge / pooling factors against one tile's patch grid */
static int grid_factors(dctx *c, const mm_node *mods, const mm_spec *s, const vis_tokens *t)
{
    const module_spec *cn = mm_spec_module(s, MOD_CONNECTOR);
    if (!cn || !t->grid_h)
        return 0;
    uint64_t k = cn->conn == CONN_AVG_POOL ? cn->pool_kernel
                 : cn->conn == CONN_PIXEL_SHUFFLE || cn->conn == CONN_PATCH_MERGER ? cn->merge_size
                                                                                     : 1;
    const char *key = cn->conn == CONN_AVG_POOL ? "pool_kernel" : "merge_size";
    if (t->grid_h % k || t->grid_w % k)
        return link_fail(c, mods, cn, key, "%llu does not divide the %llu-patch grid side",
                         ULL(k), ULL(t->grid_h % k ? t->grid_h : t->grid_w));
    return 0;
}

static int images(dctx *c, const mm_node *root, mm_spec *s)
{
    const mm_node *tr = mm_node_get(root, "training");
    const module_spec *v = mm_spec_module(s, MOD_VISION), *d = mm_spec_module(s, MOD_DECODER);
    training_spec *t = &s->training;
    if (t->images_per_sample && !v)
        return key_fail(c, mm_node_get(tr, "images_per_sample"), "training.images_per_sample",
                        "images need a vision module");
    if (!v || !t->images_per_sample)
        return 0;
    uint64_t h, w;
    tokens_worst_image(s, v, &h, &w);
    vis_tokens vt;
    if (tokens_per_image(s, h, w, &vt, c->err))
        return -1;
    if (grid_factors(c, mm_node_get(root, "modules"), s, &vt))
        return -1;
    uint64_t need = vt.llm_tokens * t->images_per_sample;
    if (d->merge != MERGE_CROSS_ATTENTION && need > t->seq_len)
        return key_fail(c, mm_node_get(tr, "seq_len"), "training.seq_len",
                        "%llu is shorter than the %llu image tokens (%llu images x %llu tokens of "
                        "a %llux%llu image)", ULL(t->seq_len), ULL(need),
                        ULL(t->images_per_sample), ULL(vt.llm_tokens), ULL(h), ULL(w));
    return 0;
}

/* LoRA on lm_head is PEFT's lora.Linear computing the logits (ops_lora.c).  Liger's
 * fused linear cross-entropy takes self.lm_head.weight, which on a PEFT layer is the
 * base layer's weight (BaseTunerLayer.weight, peft/tuners/tuners_utils.py:1942-1955):
 * the adapter would train nothing.  torchtune's chunked loss runs its own LoRALinear,
 * not PEFT's */
static int lora_head_loss(dctx *c, const mm_node *root, const mm_spec *s)
{
    const module_spec *d = mm_spec_module(s, MOD_DECODER);
    if (!d->lora.enabled || !(d->lora.targets & LT_LM_HEAD) || s->training.loss == LOSS_STANDARD)
        return 0;
    return key_fail(c, mm_node_get(mm_node_get(root, "training"), "loss"), "training.loss",
                    "LoRA on lm_head (%s.lora.target_modules) needs loss: standard: the fused "
                    "linear loss reads the base weight and skips the adapter, and the chunked "
                    "loss is torchtune's own LoRA, not PEFT's", d->name);
}

int spec_check_links(dctx *c, const mm_node *root, mm_spec *s)
{
    const mm_node *mods = mm_node_get(root, "modules");
    if (one_per_kind(c, mods, s) || widths(c, mods, s) || spec_check_video(c, root, s) ||
        images(c, root, s) ||
        lora_head_loss(c, root, s) ||
        spec_check_tp(c, root, s))
        return -1;
    const mm_node *tr = mm_node_get(root, "training");
    const training_spec *t = &s->training;
    const module_spec *d = mm_spec_module(s, MOD_DECODER);
    if (t->logits_to_keep > t->seq_len)
        return key_fail(c, mm_node_get(tr, "logits_to_keep"), "training.logits_to_keep",
                        "%llu exceeds seq_len %llu", ULL(t->logits_to_keep), ULL(t->seq_len));
    if (t->ckpt.every_n_layers > d->num_hidden_layers)
        return key_fail(c, mm_node_get(tr, "gradient_checkpointing"),
                        "training.gradient_checkpointing.every_n_layers",
                        "%llu exceeds the decoder's %llu layers", ULL(t->ckpt.every_n_layers),
                        ULL(d->num_hidden_layers));
    /* the eager prediction bounds a compiled step on the single-process truth rows
     * (tests/truth/feat_compile.py).  The compiled DDP rows (2 ranks) peaked in backward under
     * it, but their optimizer phase held one gradient-sized buffer more than the eager step
     * (19,769,334 B against 16,946,688 B predicted, -14.3 %: 2,822,646 B, the model's
     * 1,411,712 bf16 gradients): where the optimizer phase is the
     * peak the eager prediction is no bound.  FSDP1 and DeepSpeed's engine.compile: not
     * measured */
    if (t->torch_compile && t->data_parallel > 1 && !t->zero_stage && !s->fsdp.version)
        return key_fail(c, mm_node_get(tr, "torch_compile"), "training.torch_compile",
                        "torch.compile with DDP is refused: measured compiled DDP steps held a "
                        "gradient-sized buffer more in the optimizer phase than the eager step "
                        "(-14.3 %%), so the eager prediction is no bound where that phase peaks");
    if (t->torch_compile && (t->zero_stage > 0 || s->fsdp.version == 1))
        return key_fail(c, mm_node_get(tr, "torch_compile"), "training.torch_compile",
                        "torch.compile is judged by the eager prediction as a bound, shown on "
                        "single-process rows only: with ZeRO or FSDP1 no bound is shown (not "
                        "measured), so it is refused");
    /* FSDP2 compiled as torchtitan compiles (tests/truth/feat_compile.py titan_setups: each
     * decoder layer torch.compile(fullgraph=True) before fully_shard, 9 rows): every compiled
     * peak is at or under the same step run eagerly (titan_eager_setups) and under the eager
     * prediction - once the text model's int64 position ids are counted (decoder.c
     * position_ids: on the fp32, eager-attention, checkpointed row they were the 304 B the
     * compiled peak once stood above it): judged by the same bound as a single process */
    /* no compiled row runs torchtitan's op-level policy: inside a compiled graph the policy
     * tags the nodes AOTAutograd's partitioner must save, and the CPU's fused SDPA op is not
     * in its save list where CUDA's flash op is, so the CPU cannot stand in for it */
    if (t->torch_compile && t->ckpt.enabled && t->ckpt.granularity == CKPT_SELECTIVE_OP)
        return key_fail(c, mm_node_get(tr, "torch_compile"), "training.torch_compile",
                        "torch.compile with granularity selective_op is not measured, no bound "
                        "is shown, so it is refused");
    /* tests/truth/feat_compile.py: LLaVA LoRA + checkpointing compiled (20 graph breaks) peaked at
     * 5,973,300 B against 5,460,156 B for the same step in eager mode (+9.4 %) */
    if (t->torch_compile && mm_spec_module(s, MOD_VISION))
        return key_fail(c, mm_node_get(tr, "torch_compile"), "training.torch_compile",
                        "torch.compile of a model with a vision tower is refused: a measured LLaVA "
                        "LoRA step with checkpointing peaked 9.4 %% above the same step in eager "
                        "mode (graph breaks around the tower), so the eager prediction is no bound");
    return 0;
}
