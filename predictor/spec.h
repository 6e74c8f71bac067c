/* spec.h - the decoded, validated model spec (internal).  Field names follow
 * the spec keys, which follow Hugging Face config.json names. */
#ifndef MM_SPEC_H
#define MM_SPEC_H

#include <stdint.h>
#include "mmguard.h"
#include "node.h"

typedef enum { MOD_VIT = 0, MOD_MLP, MOD_LLAMA } mod_type;
typedef enum { ATT_INHERIT = -1, ATT_EAGER = 0, ATT_SDPA, ATT_FLASH } attn_kind;
typedef enum { ACT_GELU = 0, ACT_QUICK_GELU, ACT_RELU, ACT_SILU } act_kind;
typedef enum { PREC_BF16 = 0, PREC_FP16, PREC_FP32 } precision_kind;
typedef enum { MASTER_NONE = 0, MASTER_FP32 } master_kind;
typedef enum {
    OPT_ADAMW = 0, OPT_ADAM, OPT_SGD, OPT_SGD_MOMENTUM, OPT_ADAMW_8BIT, OPT_ADAFACTOR
} optimizer_kind;
typedef enum { IMPL_FOREACH = 0, IMPL_FUSED, IMPL_FOR_LOOP } optimizer_impl;

/* LoRA target bits; names per module type in spec.c */
enum {
    LT_Q = 1 << 0, LT_K = 1 << 1, LT_V = 1 << 2, LT_O = 1 << 3,
    LT_GATE = 1 << 4, LT_UP = 1 << 5, LT_DOWN = 1 << 6,
    LT_FC1 = 1 << 7, LT_FC2 = 1 << 8, LT_LM_HEAD = 1 << 9, LT_MLP_ALL = 1 << 10
};

typedef struct lora_spec {
    int enabled;
    uint64_t r;
    double alpha;
    double dropout;
    uint32_t targets;
} lora_spec;

typedef struct module_spec {
    char name[MM_MAX_NAME];
    mod_type type;
    int trainable;
    attn_kind attention;          /* ATT_INHERIT = training.attention */
    /* common transformer geometry */
    uint64_t hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
    uint64_t head_dim, intermediate_size, vocab_size;
    int tie_word_embeddings;
    act_kind act;
    /* vit */
    uint64_t image_size, patch_size, num_channels;
    int64_t select_layer;
    /* mlp */
    uint64_t input_size, num_layers;
    lora_spec lora;
    int line, col;                /* where the module starts, for errors */
} module_spec;

typedef struct training_spec {
    uint64_t micro_batch_size, seq_len, images_per_sample;
    precision_kind precision;
    master_kind master_weights;
    optimizer_kind optimizer;
    optimizer_impl impl;
    int zero_stage;
    uint64_t data_parallel, grad_accum;
    int gradient_checkpointing;
    attn_kind attention;
} training_spec;

typedef struct framework_spec {
    int tf_major, tf_minor;       /* transformers */
    int torch_major, torch_minor;
    int ds_major, ds_minor, ds_patch;
} framework_spec;

typedef struct deepspeed_spec {
    uint64_t reduce_bucket_size;      /* elements; 0 = auto (hidden^2) */
    uint64_t allgather_bucket_size;   /* elements; 0 = auto (hidden^2) */
    int overlap_comm;
    uint64_t prefetch_bucket_size;    /* elements; 0 = auto (0.9 hidden^2) */
    uint64_t max_live_parameters;     /* elements */
    uint64_t param_persistence_threshold; /* elements; 0 = auto (10 hidden) */
} deepspeed_spec;

typedef struct device_spec {
    int has_context, has_nccl, has_afix, has_afrac;
    char alloc_conf[128];         /* PYTORCH_CUDA_ALLOC_CONF of the job, "" = unset */
    uint64_t cuda_context, nccl, allocator_fixed;
    double allocator_fraction;
} device_spec;

struct mm_spec {
    char name[128];
    char path[512];
    char digest[65];
    size_t n_modules;
    module_spec modules[MM_MAX_MODULES];
    training_spec training;
    framework_spec framework;
    deepspeed_spec deepspeed;
    device_spec device;
    mm_node *doc;                 /* source tree, kept for --set and clone */
    int json;                     /* loaded from JSON */
};

/* A copy of the decoded fields without the source tree: enough for
 * mm_predict and far cheaper than mm_spec_clone (no tree to copy); not for
 * mm_spec_set.  Free with mm_spec_free. */
mm_spec *mm_spec_copy_decoded(const mm_spec *spec);
/* Re-decode spec->doc into spec (used after --set). */
int mm_spec_decode(mm_spec *spec, mm_error *err);
size_t mm_dtype_bytes(precision_kind p);

#endif
