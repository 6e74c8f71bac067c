/* prog.h - the context the layer programs run in, and the programs' entry
 * points.  A program is C code that replays what one module's forward
 * allocates, op by op (ops.c), composed into blocks (block.c) and modules
 * (vision.c, connector.c, decoder.c).  Programs run twice: once counting
 * parameters (counting: no tensors), once simulating on the timeline (sim.c). */
#ifndef MM_PROG_H
#define MM_PROG_H

#include "sim.h"
#include "resolve.h"

#define MAX_TAPS 16

/* the units outside a decoder's layers an on_layer event may name in place of a
 * layer (lctx.unit_events): embed_tokens, lm_head, the base model around them */
enum { OP_UNIT_EMBED = MM_MAX_LAYERS + 1, OP_UNIT_HEAD, OP_UNIT_BASE };

/* op-level selective checkpointing (torchtitan's "op" policy): the outputs
 * its policy saves in a checkpointed layer's forward, per (module, layer) in
 * forward order, each run ended by -1; the layer's re-run takes them back in
 * the same order (ops_tensor.c op_sac_new) */
typedef struct sac_cache {
    int32_t *ids;
    size_t n, cap;
    uint32_t *at;        /* MM_MAX_MODULES x MM_MAX_LAYERS: first entry + 1, 0 = none */
} sac_cache;

typedef struct lctx {
    sim *s;
    const resolved_model *rm; /* the resolved model (spec/resolve.h) */
    const module_spec *m;
    uint32_t mi;
    int counting;        /* parameter-counting pass: no tensors */
    int grad;            /* autograd records (not under no_grad) */
    int ckpt;            /* this module's layers may be checkpointed */
    int per_layer;       /* rows registered now belong to the repeated layers */
    int amp;             /* torch.autocast around the forward */
    int zero;            /* DeepSpeed ZeRO stage */
    int deepspeed;       /* the DeepSpeed engine runs the step (it casts every parameter) */
    int dead;            /* layer output never reaches the loss */
    int unused;          /* module does not run (no images): no grads, no states */
    int nofold;          /* simulate every layer (tests, the allocator model) */
    int grads_accumulate; /* gradient accumulation: .grad exists, grads add in */
    int grads_sharded;   /* ZeRO-2 without contiguous_gradients: each reduced gradient
                            persists as its own partition (1/N) */
    int input_grads;     /* enable_input_require_grads(): embeddings require grad */
    int early_stop;      /* non-reentrant recompute: stop at the last saved tensor */
    int recompute;       /* re-running a checkpointed layer in backward */
    int gated;           /* Mllama global encoder: tanh gates on both branches */
    int force_tw;        /* a modules_to_save copy: trainable in a frozen module */
    int force_frozen;    /* frozen in a trainable module (DeepStack mergers) */
    uint32_t cur_row;    /* the row of the last op_row (UINT32_MAX at a module's entry) */
    /* the train layer's answer for a frozen weight whose parameter is a view of a
     * flat parameter that requires grad (FSDP1 use_orig_params), NULL: none */
    int (*frozen_rg)(const struct lctx *c, uint32_t row);
    void *frozen_rg_ctx;
    /* the train layer's look at every Linear after its output y (node n, NULL without
     * autograd) and before LoRA: tensor parallel's collectives (train/parallel_tp.c),
     * NULL: none */
    void (*on_linear)(struct lctx *c, uint32_t row, uint32_t lt, int32_t x, int32_t y,
                      struct sim_node *n, uint64_t rows, uint64_t out);
    /* sequence parallel (train/parallel_tp.c): the decoder's residual stream, norms and
     * embedding output hold T / seq_shards tokens; on_seq turns x (width `width`) from
     * sequence-sharded to whole (gather 1: all-gather, before attention, MLP and lm_head)
     * or from a partial sum of every token to sequence-sharded (gather 0: reduce-scatter,
     * after o_proj, down_proj and the embedding) and returns the new tensor (x is kept:
     * the caller drops it).  seq_shards 1 / on_seq NULL: none.  loss_parallel: the
     * logits are sharded on the vocabulary and cross_entropy runs as
     * torch.distributed.tensor.parallel.loss_parallel computes it (ops_loss.c) */
    uint64_t seq_shards;
    int32_t (*on_seq)(struct lctx *c, int32_t x, int gather, uint64_t width);
    int loss_parallel;
    attn_kind attn;
    uint64_t dt;         /* activation dtype bytes */
    uint64_t wdt;        /* weight dtype bytes (fp32 under autocast) */
    uint64_t gdt;        /* weight-gradient dtype bytes */
    uint64_t B, S, T;    /* sequences, tokens per sequence, tokens */
    uint64_t chunks;     /* packed vision: attention per image, this many chunks of S */
    uint64_t layer;      /* index of the layer being run */
    uint64_t largest_param;
    vis_tokens vt;       /* tokens of one image */
    uint64_t images;     /* images in the micro-batch */
    int32_t cos, sin, mask, mask_sliding, pixels, cross_states;
    int32_t mask_cross;  /* Mllama: the cross-attention mask (B, 1, S, image tokens) */
    int32_t pos_ids;     /* the text model's int64 position ids (decoder.c), -1 none */
    int32_t taps[MAX_TAPS];   /* DeepStack / Mllama intermediate hidden states */
    size_t ntaps;
    uint64_t win_chunks;  /* Qwen2.5-VL: windows per batch for window-attention layers */
    uint64_t fold_from, fold_to; /* layers the last stack_run folded (a ballast stood in) */
    int32_t late_drop[4];
    int unit_events;     /* FSDP1 wrap_policy size: tell on_layer where embed_tokens, lm_head
                            and the base model run (op_unit_event; OP_UNIT_*) */
    int32_t *amp_cache;  /* autocast's casts of trainable fp32 weights, kept until the
                            autocast region ends (the end of the forward) */
    size_t n_amp, cap_amp;
    int32_t *scratch;    /* MM_MAX_LAYERS + 2 entries */
    sac_cache *sac;      /* granularity selective_op: the policy's saved outputs */
    int sac_fwd;         /* running a selectively checkpointed layer's forward */
    int sac_rec;         /* re-running one: the saved outputs are taken back */
    size_t sac_pos;      /* the re-run's next saved output */
    uint64_t sac_mm;     /* aten.mm calls so far in this layer (forward or re-run) */
} lctx;

/* block.c: one transformer layer of the current module; returns its output */
int32_t block_layer(lctx *c, int32_t x, uint64_t layer);
/* vision.c, connector.c, decoder.c: the modules */
int32_t vision_module(lctx *c);
int32_t connector_module(lctx *c, int32_t feat);
int32_t decoder_module(lctx *c, int32_t image_features);
/* layer loop with checkpointing and folding (stack.c) */
int32_t stack_run(lctx *c, int32_t x, uint64_t first, uint64_t count, int32_t *keep);
/* connector.c: a Qwen3-VL DeepStack merger on vision layer output x (kept) */
int32_t connector_deepstack(lctx *c, int32_t x);
/* mllama.c: Llama-3.2-Vision's tiled, gated vision encoder */
int32_t mllama_vision(lctx *c);
/* deepstack.c: Qwen3-VL DeepStack: visual features added after layer l */
int32_t deepstack_add(lctx *c, int32_t x, uint64_t l);

/* prog_module.c: enter module mi (its geometry and modes) */
void prog_enter_module(lctx *c, uint32_t mi);
/* enable_input_require_grads() reaches the vision tower's patch embedding
 * (transformers >= 5: every sub-model's input embeddings are hooked) */
int tower_input_grads(const lctx *c);
/* prog.c: the forward in compute order, and a checkpointed layer's re-run */
int32_t prog_forward(lctx *c);
int32_t prog_recompute(sim *s, const sim_node *ckpt, void *ctx);

#endif
