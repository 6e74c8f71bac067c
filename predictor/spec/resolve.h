/* resolve.h - spec layer: the resolved model.  A checked spec is read once per
 * prediction into what the step program (model/), the parallel layouts and the
 * step (train/) need: per module its role, its layer count and transformer
 * dimensions (transformers' config names), what trains (frozen, LoRA,
 * quantized), how FSDP / ZeRO-3 cut it into units (its _no_split_modules) and
 * its per-layer kinds; per model the parallel strategy, the dtypes the step
 * computes and keeps weights in, the visual tokens of the worst image, and
 * copies of the strategy's settings.  Under tensor parallel the decoder's
 * dimensions are one rank's (torchtitan's ColwiseParallel / RowwiseParallel
 * shards).  Nothing here depends on the data-parallel degree (the step takes
 * it from step_cfg.dp; training.data_parallel is 0 here) nor on the
 * micro-batch except the copy of training.micro_batch_size, which
 * resolved_set_micro_batch updates in place: fit's searches resolve once. */
#ifndef MM_RESOLVE_H
#define MM_RESOLVE_H

#include "tokens.h"

/* per-layer kinds (resolved_module.layer_kind): bits, one per per-layer list of the
 * module's config, as the spec holds it (the readers ask for the module's role) */
enum {
    LK_SLIDING = 1 << 0,   /* sliding-window attention (layer_types sliding_attention) */
    LK_DENSE = 1 << 1,     /* a MoE model's dense-MLP layer (mlp_only_layers) */
    LK_CROSS = 1 << 2,     /* Mllama cross-attention layer (cross_attention_layers) */
    LK_FULL_ATT = 1 << 3,  /* Qwen2.5-VL vision: full attention (fullatt_block_indexes) */
    LK_DEEPSTACK = 1 << 4, /* Qwen3-VL vision: a DeepStack tap (deepstack_visual_indexes) */
    LK_TAP = 1 << 5        /* Mllama vision: an intermediate_layers_indices tap */
};

typedef struct resolved_module {
    mod_kind role;                /* vision tower, connector or decoder */
    const module_spec *spec;      /* its spec (the rank's copy under tensor parallel), for
                                     the layer programs that still read it (model/) */
    uint64_t layers;              /* what its layer loop runs: num_hidden_layers plus
                                     Mllama's num_global_layers */
    uint64_t hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
    uint64_t head_dim, intermediate_size, vocab_size;
    int tie_word_embeddings;
    int trainable;                /* its base weights train */
    int lora;                     /* LoRA adapters wrap it */
    int full_grads;               /* every parameter gets a gradient (trainable, no LoRA) */
    quant_kind quant;             /* quantized base weights (QLoRA) */
    /* FSDP / ZeRO-3 units outside the layers (the family's _no_split_modules) */
    int unit_embeddings;          /* CLIP, SigLIP: the vision embeddings are their own unit */
    int unit_head;                /* SigLIP: the attention-pooling head is its own unit */
    int unit_attention_only;      /* Idefics3: only each layer's self_attn is a unit */
    /* vision: the pixels (vision_config names) and the processor's kind */
    uint64_t image_size, patch_size, num_channels, temporal_patch_size;
    img_kind img;
    int packed;                   /* all patches in one sequence, attention per image */
    int feature_cls;              /* its per-image features keep the class token (batched
                                     towers, vision_feature_select_strategy full) */
    uint64_t ckpt_base;           /* GradientCheckpointingLayers before its layers (every_n_layers
                                     counts in module order): the decoder's, the tower's layers */
    int has_sliding;              /* a sliding-window layer among its hidden layers */
    uint64_t deepstack_taps;      /* vision: DeepStack taps among its hidden layers */
    uint8_t *layer_kind;          /* LK_* of each of its `layers` layers (up to MM_MAX_LAYERS) */
} resolved_module;

typedef struct resolved_model {
    const mm_spec *spec;          /* what it was resolved from (the rank's copy under
                                     tensor parallel): model/ programs still read it */
    mm_spec *tp_copy;             /* that copy, owned (NULL without tensor parallel) */
    const char *path;             /* the spec's file, for errors */
    size_t n_modules;
    resolved_module modules[MM_MAX_MODULES];
    int vision, connector, decoder; /* module index of each role, -1 none */
    uint64_t total_layers;        /* every module's `layers` */
    uint64_t layer_stride;        /* the most any module's loop runs, 1..MM_MAX_LAYERS */
    parallel_kind parallel;       /* DDP, ZeRO, FSDP1, FSDP2 */
    int zero_level;               /* what lctx.zero says: the ZeRO stage, 3 under FSDP, 0 DDP */
    uint64_t dt;                  /* activation dtype bytes */
    uint64_t wdt;                 /* weight dtype bytes as the forward reads them */
    uint64_t store;               /* FSDP: bytes of the sharded (loaded) parameters */
    int grads_sharded;            /* ZeRO-2 without contiguous gradients, no accumulation */
    vis_tokens vt;                /* tokens of the worst image (images_per_sample > 0) */
    int has_images;               /* a vision tower and images in each sample */
    /* the strategy, copied (the checked values) */
    training_spec training;
    deepspeed_spec deepspeed;
    fsdp_spec fsdp;
    ddp_spec ddp;
    framework_spec framework;
    uint8_t *kinds;               /* the layer_kind tables, one allocation */
} resolved_model;

/* Resolve the checked spec sp into *m (sp must outlive it).  0, or -1 with err
 * (out of memory).  Release with resolved_free. */
int resolve_model(const mm_spec *sp, resolved_model *m, mm_error *err);
void resolved_free(resolved_model *m);
/* The LK_* bits of layer l of module mi (0 past its layers). */
static inline unsigned resolved_layer_kind(const resolved_model *m, uint32_t mi, uint64_t l)
{
    return l < m->modules[mi].layers && l < MM_MAX_LAYERS ? m->modules[mi].layer_kind[l] : 0;
}
/* The spec of the module with this role, or NULL. */
static inline const module_spec *resolved_spec_of(const resolved_model *m, mod_kind role)
{
    int i = role == MOD_VISION ? m->vision : role == MOD_CONNECTOR ? m->connector : m->decoder;
    return i >= 0 ? m->modules[i].spec : NULL;
}
/* The decoder's hidden_size (0 without one): DeepSpeed's "auto" sizes. */
static inline uint64_t resolved_decoder_hidden(const resolved_model *m)
{
    return m->decoder >= 0 ? m->modules[m->decoder].hidden_size : 0;
}
/* A new micro-batch size for the next step, without resolving again. */
void resolved_set_micro_batch(resolved_model *m, uint64_t micro_batch);
/* The parallel strategy a spec asks for. */
static inline parallel_kind spec_parallel(const mm_spec *sp)
{
    if (sp->fsdp.version)
        return sp->fsdp.version == 2 ? PAR_FSDP2 : PAR_FSDP1;
    return sp->training.zero_stage ? PAR_ZERO : PAR_DDP;
}

#endif
