/* spec.h - the decoded, validated model spec (internal).
 *
 * A model is at most three modules - a vision encoder, a connector and a
 * decoder - each described by the same small set of building blocks (norm,
 * attention pattern, MLP or MoE, patch embedding, connector kind).  A family
 * (CLIP, SigLIP, Qwen2-VL, InternViT, Llama, Qwen3-MoE, Gemma 3, ...) is a
 * `family:` whose table of block defaults lives in spec_family.c; every
 * default can be overridden key by key.  Field names follow the keys, which
 * follow Hugging Face config.json names. */
#ifndef MM_SPEC_H
#define MM_SPEC_H

#include <stdint.h>
#include "mmguard.h"
#include "node.h"
#include "layer_set.h"

typedef enum { MOD_VISION = 0, MOD_CONNECTOR, MOD_DECODER, MOD_NKIND } mod_kind;
typedef enum { ATT_INHERIT = -1, ATT_EAGER = 0, ATT_SDPA, ATT_FLASH } attn_kind;
typedef enum { ACT_GELU = 0, ACT_QUICK_GELU, ACT_RELU, ACT_SILU, ACT_GELU_TANH } act_kind;
typedef enum { NORM_LAYER = 0, NORM_RMS, NORM_RMS_GEMMA, NORM_NONE } norm_kind;
typedef enum { MLP_FC = 0, MLP_GATED } mlp_kind;
typedef enum { QKN_NONE = 0, QKN_HEAD, QKN_FULL } qknorm_kind;
typedef enum { POS_NONE = 0, POS_LEARNED, POS_ROPE, POS_MROPE, POS_ROPE2D, POS_LEARNED_ROPE2D } pos_kind;
typedef enum { CONN_MLP = 0, CONN_PATCH_MERGER, CONN_PIXEL_SHUFFLE, CONN_AVG_POOL,
               CONN_LINEAR, CONN_MISTRAL3 } conn_kind;
typedef enum { IMG_FIXED = 0, IMG_DYNAMIC, IMG_TILES, IMG_ANYRES, IMG_MLLAMA, IMG_SPLIT,
               IMG_PIXTRAL } img_kind;
typedef enum { MERGE_SCATTER = 0, MERGE_LLAVA, MERGE_CROSS_ATTENTION } merge_kind;
typedef enum { EXPERTS_GROUPED = 0, EXPERTS_EAGER } experts_impl;
typedef enum { PREC_BF16 = 0, PREC_FP16, PREC_FP32 } precision_kind;
typedef enum { MASTER_NONE = 0, MASTER_FP32 } master_kind;
typedef enum {
    OPT_ADAMW = 0, OPT_ADAM, OPT_SGD, OPT_SGD_MOMENTUM, OPT_ADAMW_8BIT, OPT_ADAFACTOR,
    OPT_PAGED_ADAMW_8BIT, OPT_PAGED_ADAMW
} optimizer_kind;
typedef enum { IMPL_FOREACH = 0, IMPL_FUSED, IMPL_FOR_LOOP } optimizer_impl;
typedef enum { LOSS_STANDARD = 0, LOSS_CHUNKED, LOSS_FUSED_LINEAR } loss_kind;
typedef enum { CKPT_FULL = 0, CKPT_ATTENTION, CKPT_MLP, CKPT_SELECTIVE_OP } ckpt_granularity;
typedef enum { PAR_DDP = 0, PAR_ZERO, PAR_FSDP1, PAR_FSDP2 } parallel_kind;
typedef enum { QUANT_NONE = 0, QUANT_NF4, QUANT_FP4, QUANT_INT8 } quant_kind;

/* LoRA target bits; names per module kind in spec_module.c */
enum {
    LT_Q = 1 << 0, LT_K = 1 << 1, LT_V = 1 << 2, LT_O = 1 << 3,
    LT_GATE = 1 << 4, LT_UP = 1 << 5, LT_DOWN = 1 << 6,
    LT_FC1 = 1 << 7, LT_FC2 = 1 << 8, LT_LM_HEAD = 1 << 9, LT_MLP_ALL = 1 << 10,
    LT_QKV = 1 << 11, LT_EXPERTS = 1 << 12, LT_ROUTER = 1 << 13, LT_EMBED = 1 << 14
};

typedef struct lora_spec {
    int enabled;
    uint64_t r;
    double alpha;
    double dropout;
    uint32_t targets;
    int autocast_adapter_dtype; /* PEFT's default: 16-bit adapters are upcast to fp32 */
    int save_embed, save_head;  /* modules_to_save: embed_tokens / lm_head train as copies */
} lora_spec;

/* Visual tokens per image: how the processor cuts an image (HF
 * preprocessor_config.json names). */
typedef struct image_proc {
    img_kind kind;
    uint64_t min_pixels, max_pixels;      /* dynamic (Qwen2-VL family) */
    uint64_t min_tiles, max_tiles;        /* tiles (InternVL), mllama, anyres max */
    int thumbnail;                        /* tiles: + a global thumbnail tile */
    uint64_t longest_edge;                /* split (Idefics3): image resized to this;
                                             pixtral: the longest side at most this */
    size_t n_pinpoints;                   /* anyres (LLaVA-NeXT / OneVision) */
    uint64_t pinpoints[64][2];            /* (height, width) */
    int newline;                          /* anyres: an image_newline token per row */
} image_proc;

typedef struct module_spec {
    char name[MM_MAX_NAME];
    mod_kind kind;
    int legacy;                   /* declared with the 0.1 names vit / mlp / llama */
    int family;                   /* index into the kind's family table (spec_family.c) */
    int trainable;
    attn_kind attention;          /* ATT_INHERIT = training.attention */
    /* transformer geometry (vision, decoder) */
    uint64_t hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads;
    uint64_t head_dim, intermediate_size;
    act_kind act;
    /* the block */
    norm_kind norm;
    int sandwich_norm;            /* Gemma: a norm after attention and after the MLP too */
    int qkv_fused;                /* one qkv Linear whose output is split */
    int q_bias, k_bias, v_bias, o_bias;
    qknorm_kind qk_norm;
    int layer_scale;              /* InternViT lambda_1/lambda_2 */
    mlp_kind mlp;
    int mlp_bias;
    int softmax_fp32;             /* eager softmax(dtype=float32).to(dtype) */
    int rope_fp32;                /* rotary applied on fp32 copies of q and k (Qwen vision) */
    pos_kind pos;
    /* decoder */
    uint64_t vocab_size;
    uint64_t embedding_rows;      /* rows of embed_tokens when not vocab_size (Mllama: +8) */
    int tie_word_embeddings;
    int scale_embeddings;         /* Gemma: embeddings * sqrt(hidden) */
    uint64_t sliding_window;      /* 0 = none */
    layer_set sliding;            /* layers with sliding-window attention */
    merge_kind merge;             /* how image features enter the sequence */
    int bidirectional_images;     /* Gemma 3: image tokens attend both ways (a 4-D mask) */
    uint64_t num_experts, experts_per_tok, moe_intermediate_size;
    uint64_t shared_expert_intermediate_size;
    int shared_expert_gate;
    layer_set dense;              /* MoE models: layers with a dense MLP */
    experts_impl experts;
    int router_fp32;              /* routing weights stay fp32 (Mixtral) */
    int lora_experts;             /* LoRA "all-linear" also wraps the expert stacks and the
                                     router (PEFT's transformers-v5 MoE conversion) */
    double moe_imbalance;         /* eager experts: busiest expert's share / fair share */
    int router_logits;            /* output_router_logits: aux loss keeps every layer's logits */
    layer_set cross;              /* Mllama: cross-attention layers */
    /* vision */
    uint64_t image_size, patch_size, num_channels, temporal_patch_size, spatial_merge_size;
    int patch_bias;
    int class_token, pre_layernorm, post_layernorm;
    int packed;                   /* all patches in one sequence, attention per image */
    int64_t select_layer;         /* hidden state fed to the connector (vision_feature_layer) */
    int keep_cls;                 /* vision_feature_select_strategy: full */
    int hidden_tuple;             /* output_hidden_states: every layer's output held until the
                                     tower returns */
    int feature_post_norm;        /* the feature is last_hidden_state, post_layernorm applied */
    uint64_t window_size;         /* Qwen2.5-VL window attention, in pixels */
    layer_set full_attention;     /* Qwen2.5-VL fullatt_block_indexes */
    layer_set deepstack;          /* Qwen3-VL deepstack_visual_indexes */
    int deepstack_trainable;      /* connector: its DeepStack mergers train (default: as it) */
    int no_ckpt;                  /* family: its layers are not GradientCheckpointingLayers */
    int tower_ckpt;               /* vision: gradient_checkpointing given for this tower */
    int tower_ckpt_given;         /* derived: the key is present (overrides training's) */
    int no_input_hook;            /* family: get_input_embeddings finds nothing to hook */
    int deepstack_frozen;         /* derived: deepstack_trainable given false */
    uint64_t num_global_layers;   /* Mllama global (gated) encoder */
    layer_set taps;               /* Mllama intermediate_layers_indices */
    uint64_t max_num_tiles;       /* Mllama tile embeddings */
    uint64_t aspect_ratio_ids;    /* Mllama supported aspect ratios (tile embedding rows - 1) */
    uint64_t num_position_embeddings; /* Qwen3-VL learned position table rows */
    int pooling_head;             /* SigLIP attention-pooling head (parameters only) */
    image_proc img;
    /* connector */
    conn_kind conn;
    uint64_t input_size, num_layers, conn_intermediate;
    norm_kind conn_norm;          /* norm before the connector (NORM_NONE: none) */
    int conn_norm_after;          /* Qwen3-VL: the norm after the merge (postshuffle) */
    uint64_t merge_size;          /* patch merger / pixel shuffle: side of the merged square */
    uint64_t pool_kernel;         /* avg_pool: side of the pooling window */
    int conn_bias;
    int image_newline;            /* LLaVA-NeXT / OneVision image_newline parameter */
    /* quantized base weights (QLoRA) */
    quant_kind quant;
    int double_quant;
    uint64_t quant_block;
    lora_spec lora;
    int line, col;                /* where the module starts, for errors */
} module_spec;

typedef struct ckpt_spec {
    int enabled;
    int reentrant;                /* torch.utils.checkpoint use_reentrant */
    uint64_t every_n_layers;      /* checkpoint layers 0, k, 2k, ... */
    ckpt_granularity granularity;
    int offload;                  /* saved inputs to pinned host memory */
} ckpt_spec;

/* training.liger_kernel: the kernels Liger's apply_liger_kernel_to_<model_type>(model=...)
 * patches (HF TrainingArguments use_liger_kernel, liger_kernel_config; spec_liger.c) */
typedef struct liger_spec {
    int enabled;                  /* liger_kernel given, true or a map */
    int rope, rms_norm, swiglu;   /* model/ops_liger.c */
    int fused_linear_cross_entropy; /* sets loss: fused_linear (ops_loss.c fused_loss) */
    int cross_entropy, layer_norm, geglu; /* accepted false only (spec_liger.c says why) */
} liger_spec;

typedef struct training_spec {
    uint64_t micro_batch_size, seq_len, images_per_sample;
    uint64_t image_height, image_width;   /* the largest image a sample carries */
    uint64_t video_frames;                /* frames of one video (Qwen dynamic only) */
    uint64_t video_min_pixels, video_max_pixels; /* a frame's resize bounds, 0: the image
                                                     processor's (spec_video.c) */
    precision_kind precision;
    master_kind master_weights;
    int autocast;                 /* torch.autocast around the forward */
    int autocast_given;           /* set by the spec (else derived from the strategy) */
    optimizer_kind optimizer;
    optimizer_impl impl;
    int zero_stage;               /* DeepSpeed; parallel kind zero when > 0 */
    uint64_t data_parallel, grad_accum;
    ckpt_spec ckpt;
    attn_kind attention;
    loss_kind loss;
    uint64_t loss_chunks;
    uint64_t logits_to_keep;      /* 0 = all */
    int packing;                  /* padding-free: sequences packed, no mask */
    int use_cache;                /* the model's use_cache: without gradient checkpointing
                                     a training forward fills a KV cache (DynamicCache) */
    double max_grad_norm;         /* 0 = no clipping */
    int loss_upcast;              /* the standard loss upcasts the logits to fp32 first
                                     (transformers ForCausalLMLoss); 0: cross_entropy on
                                     the 16-bit logits (a custom loop's nn.CrossEntropyLoss) */
    int activation_offload;       /* every saved activation to host (torchtune-style) */
    int optimizer_in_backward;    /* step fused into backward (per-parameter hooks) */
    int torch_compile;            /* torch.compile(model) (inductor, default mode): judged by
                                     the eager prediction as a bound (mm_spec_bound) */
    liger_spec liger;             /* Liger-Kernel's Triton kernels (model/ops_liger.c) */
    uint64_t tensor_parallel;     /* torch.distributed.tensor.parallel degree, 1 = none: the
                                     decoder's q/k/v/gate/up colwise, o/down rowwise
                                     (train/parallel_tp.c, spec/spec_tp.c) */
    int sequence_parallel;        /* torchtitan's SequenceParallel norms + loss parallel on top
                                     of tensor_parallel: judged by the prediction without them
                                     as a bound (mm_spec_bound) */
} training_spec;

typedef struct framework_spec {
    int tf_major, tf_minor;       /* transformers */
    int torch_major, torch_minor;
    int ds_major, ds_minor, ds_patch;
} framework_spec;

typedef struct deepspeed_spec {
    uint64_t reduce_bucket_size;      /* elements; 0 = auto */
    uint64_t allgather_bucket_size;   /* elements; 0 = auto */
    int overlap_comm;
    int contiguous_gradients;
    uint64_t prefetch_bucket_size;    /* elements; 0 = auto */
    uint64_t max_live_parameters;     /* elements */
    uint64_t param_persistence_threshold; /* elements; 0 = auto */
    uint64_t sub_group_size;          /* elements */
    int offload_optimizer;            /* to cpu */
    int offload_param;                /* to cpu (ZeRO-3) */
    int pin_memory;
    uint64_t max_reuse_distance;      /* elements (stage3_max_reuse_distance) */
    int round_robin_gradients;        /* stage 2 reorders the flat groups round-robin */
} deepspeed_spec;

typedef struct ddp_spec {         /* torch DistributedDataParallel (zero_stage 0, no FSDP) */
    int gradient_as_bucket_view;  /* .grad are views of the reduce buckets */
    uint64_t bucket_cap_mb;       /* MiB per reduce bucket */
    int first_bucket_small;       /* bucket_cap_mb not given: the first bucket is 1 MiB */
    int find_unused_parameters;   /* default: the Trainer's, not gradient_checkpointing */
} ddp_spec;

typedef struct fsdp_spec {
    int version;                  /* 1 or 2; 0 = not FSDP */
    int use_orig_params;
    int reshard_after_forward;    /* FSDP2; FSDP1 FULL_SHARD = 1, SHARD_GRAD_OP = 0 */
    int limit_all_gathers;
    int forward_prefetch, backward_prefetch;
    precision_kind param_dtype, reduce_dtype, buffer_dtype;
    int mixed_precision;          /* a MixedPrecision policy is set */
    int cpu_offload;
    int fp32_loaded;              /* the model was loaded in fp32 (sharded in fp32) */
    precision_kind model_dtype;   /* dtype of the sharded parameters (the loaded model) */
    int backward_prefetch_post;   /* FSDP1 BACKWARD_POST: prefetch after the reshard */
    int sync_each_micro_batch;    /* gradient accumulation reduce-scatters every micro-batch
                                     (torchtune, torchtitan; HF sync_each_batch); 0: the
                                     HF Trainer / Accelerate way, no_sync between them */
    int wrap_peft;                /* wrap_policy peft_lora: PEFT's fsdp_auto_wrap_policy, each
                                     trainable leaf (lora_A / lora_B) its own FSDP1 unit */
    int wrap_size;                /* wrap_policy size: torch's size_based_auto_wrap_policy,
                                     FSDP1 (train/parallel_wrap.c says which modules) */
    uint64_t min_num_params;      /* its min_num_params (wrap_size only) */
} fsdp_spec;

typedef struct device_spec {
    int has_context, has_nccl, has_afix, has_afrac, has_cublas;
    char alloc_conf[128];         /* PYTORCH_CUDA_ALLOC_CONF of the job, "" = unset */
    uint64_t cublas_workspace;    /* one cuBLAS handle's workspace in the caching allocator */
    uint64_t cuda_context, nccl, allocator_fixed;
    double allocator_fraction;
} device_spec;

#define MM_MAX_SOURCES 8
typedef struct spec_source {      /* a file a spec was made from (digest in the log) */
    char path[512];
    char digest[65];
} spec_source;

struct mm_spec {
    char name[128];
    char path[512];
    char digest[65];
    size_t n_modules;
    module_spec modules[MM_MAX_MODULES];
    training_spec training;
    framework_spec framework;
    deepspeed_spec deepspeed;
    fsdp_spec fsdp;
    ddp_spec ddp;
    device_spec device;
    size_t n_sources;
    spec_source sources[MM_MAX_SOURCES];
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
/* Re-derive what depends on the strategy (autocast) after a program changed
 * training fields (fit's what-ifs). */
void spec_derive(mm_spec *s);
/* The module of a kind, or NULL. */
const module_spec *mm_spec_module(const mm_spec *s, mod_kind k);

#endif
