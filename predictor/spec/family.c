/* family.c - the family tables (see family.h).  Each row says, for one
 * Hugging Face architecture, what its blocks are; the values were read from
 * transformers 5.17's modeling_*.py and configuration_*.py (named per row).
 * Geometry (sizes, depths, heads) is never defaulted here: it comes from the
 * spec or the model's config.json. */
#include "family.h"

#include <string.h>

static void attn_bias(module_spec *m, int q, int k, int v, int o)
{
    m->q_bias = q;
    m->k_bias = k;
    m->v_bias = v;
    m->o_bias = o;
}

/* ---- vision encoders ------------------------------------------------------------- */

static void vis_common(module_spec *m)
{
    m->norm = NORM_LAYER;
    m->mlp = MLP_FC;
    m->mlp_bias = 1;
    attn_bias(m, 1, 1, 1, 1);
    m->softmax_fp32 = 1;
    m->num_channels = 3;
    m->select_layer = -1;
    m->img.kind = IMG_FIXED;
}

/* CLIPVisionModel (LLaVA-1.5): CLS token, learned positions, pre_layrnorm,
 * post_layernorm (unused by LLaVA), conv without bias, quick_gelu */
static void fam_clip(module_spec *m)
{
    vis_common(m);
    m->act = ACT_QUICK_GELU;
    m->pos = POS_LEARNED;
    m->class_token = 1;
    m->pre_layernorm = 1;
    m->post_layernorm = 1;
    m->select_layer = -2;
    m->hidden_tuple = 1;
}

/* SiglipVisionModel (LLaVA-OneVision, Gemma 3, PaliGemma): no CLS, conv bias,
 * gelu_pytorch_tanh, post_layernorm */
static void fam_siglip(module_spec *m)
{
    vis_common(m);
    m->act = ACT_GELU_TANH;
    m->pos = POS_LEARNED;
    m->patch_bias = 1;
    m->post_layernorm = 1;
    m->hidden_tuple = 1;
}

/* Qwen2VisionTransformerPretrainedModel: Conv3d over temporal patches (no
 * bias), 2-D rotary in fp32, fused qkv, LayerNorm, quick_gelu fc1/fc2, all
 * images packed into one sequence with attention per image */
static void fam_qwen2_vl(module_spec *m)
{
    vis_common(m);
    m->act = ACT_QUICK_GELU;
    m->pos = POS_ROPE2D;
    m->rope_fp32 = 1;
    m->qkv_fused = 1;
    m->packed = 1;
    m->temporal_patch_size = 2;
    m->spatial_merge_size = 2;
    m->img.kind = IMG_DYNAMIC;
    m->img.min_pixels = 56 * 56;
    m->img.max_pixels = 28 * 28 * 1280;
}

/* Qwen2_5_VisionTransformerPretrainedModel: as Qwen2-VL with RMSNorm, a
 * gated SiLU MLP with biases and window attention (fullatt_block_indexes) */
static void fam_qwen2_5_vl(module_spec *m)
{
    fam_qwen2_vl(m);
    m->norm = NORM_RMS;
    m->mlp = MLP_GATED;
    m->act = ACT_SILU;
    m->window_size = 112;
    m->img.max_pixels = 12845056;
    m->img.min_pixels = 3136;
}

/* Qwen3VLVisionModel: learned positions interpolated to the grid plus 2-D
 * rotary, conv with bias, gelu_pytorch_tanh fc1/fc2, DeepStack taps */
static void fam_qwen3_vl(module_spec *m)
{
    fam_qwen2_vl(m);
    m->act = ACT_GELU_TANH;
    m->pos = POS_LEARNED_ROPE2D;
    m->patch_bias = 1;
    m->num_position_embeddings = 2304;
    m->img.min_pixels = 65536;
    m->img.max_pixels = 16777216;
    m->no_input_hook = 1; /* Qwen3VLVisionModel exposes no input embeddings: 5.x's
                             enable_input_require_grads skips it */
}

/* InternVLVisionModel (InternViT-300M): CLS, learned positions, conv bias,
 * LayerScale, plain-dtype softmax, optional qk-norm, dynamic 448-px tiles */
static void fam_intern_vit(module_spec *m)
{
    vis_common(m);
    m->act = ACT_GELU;
    m->pos = POS_LEARNED;
    m->class_token = 1;
    m->patch_bias = 1;
    m->layer_scale = 1;
    m->softmax_fp32 = 0;
    attn_bias(m, 0, 0, 0, 1);
    m->img.kind = IMG_TILES;
    m->img.min_tiles = 1;
    m->img.max_tiles = 12;
    m->img.thumbnail = 1;
}

/* Idefics3VisionTransformer (Idefics3, SmolVLM): SigLIP blocks, images split
 * into tiles of image_size plus a global one */
static void fam_idefics3(module_spec *m)
{
    fam_siglip(m);
    m->hidden_tuple = 0;
    m->feature_post_norm = 1;
    m->img.kind = IMG_SPLIT;
}

/* MllamaVisionModel: tiles with tile/position embeddings, CLS, a local and a
 * gated global encoder, intermediate layers concatenated */
static void fam_mllama(module_spec *m)
{
    vis_common(m);
    m->act = ACT_GELU;
    m->pos = POS_LEARNED;
    m->class_token = 1;
    m->pre_layernorm = 1;
    m->post_layernorm = 1;
    attn_bias(m, 0, 0, 0, 0);
    m->mlp_bias = 1;
    m->img.kind = IMG_MLLAMA;
    m->img.max_tiles = 4;
    m->max_num_tiles = 4;
    m->aspect_ratio_ids = 8;
    m->num_global_layers = 8;
    m->hidden_tuple = 0;
    m->no_ckpt = 1; /* MllamaVisionEncoderLayer is a plain nn.Module, not a
                       GradientCheckpointingLayer: never checkpointed, not counted */
}

/* PixtralVisionModel (Pixtral-12B; transformers 5.17 models/pixtral/modeling_pixtral.py):
 * patch_conv without bias (:394-400), RMSNorm ln_pre (:402) and per-layer norms
 * (eps 1e-5, :275-278), q/k/v/o without bias (:186-189), the SiLU-gated MLP copied
 * from Mistral (:234-248; the act is config.hidden_act), axial 2-D rotary applied in
 * the model dtype (:83-96, :211), no class token, every image of the batch in one
 * sequence behind generate_block_attention_mask (:371-384); hidden_states[0] is
 * the conv output after ln_pre.  Images keep their size (image_processor pixtral). */
static void fam_pixtral(module_spec *m)
{
    vis_common(m);
    m->norm = NORM_RMS;
    m->mlp = MLP_GATED;
    m->mlp_bias = 0;
    m->act = ACT_GELU; /* PixtralVisionConfig.hidden_act default; pixtral-12b says silu */
    attn_bias(m, 0, 0, 0, 0);
    m->pos = POS_ROPE2D;
    m->rope_fp32 = 0;
    m->pre_layernorm = 1;
    m->hidden_tuple = 1;
    m->img.kind = IMG_PIXTRAL;
}

/* ---- connectors -------------------------------------------------------------------- */

/* LLaVA mlp2x_gelu / LlavaMultiModalProjector / LlavaOnevision: Linear, GELU, Linear */
static void fam_mlp(module_spec *m)
{
    m->conn = CONN_MLP;
    m->num_layers = 2;
    m->act = ACT_GELU;
    m->conn_bias = 1;
    m->conn_norm = NORM_NONE;
}

/* Qwen2-VL PatchMerger: LayerNorm per patch, 2x2 patches concatenated,
 * Linear(4h, 4h), GELU, Linear(4h, out) */
static void fam_patch_merger(module_spec *m)
{
    fam_mlp(m);
    m->conn = CONN_PATCH_MERGER;
    m->conn_norm = NORM_LAYER;
    m->merge_size = 2;
}

/* Qwen2.5-VL: the same with RMSNorm (ln_q) */
static void fam_patch_merger_rms(module_spec *m)
{
    fam_patch_merger(m);
    m->conn_norm = NORM_RMS;
}

/* InternVL: pixel shuffle (downsample_ratio 0.5), LayerNorm(4h), Linear, GELU, Linear */
static void fam_pixel_shuffle_mlp(module_spec *m)
{
    fam_mlp(m);
    m->conn = CONN_PIXEL_SHUFFLE;
    m->conn_norm = NORM_LAYER;
    m->merge_size = 2;
}

/* Idefics3 / SmolVLM connector: pixel shuffle then one Linear without bias */
static void fam_pixel_shuffle_linear(module_spec *m)
{
    fam_mlp(m);
    m->conn = CONN_PIXEL_SHUFFLE;
    m->num_layers = 1;
    m->conn_bias = 0;
    m->merge_size = 2;
}

/* Gemma3MultiModalProjector: AvgPool2d to tokens_per_image, Gemma RMSNorm,
 * matmul with a projection weight (no bias) */
static void fam_avg_pool(module_spec *m)
{
    fam_mlp(m);
    m->conn = CONN_AVG_POOL;
    m->num_layers = 1;
    m->conn_bias = 0;
    m->conn_norm = NORM_RMS_GEMMA;
    m->pool_kernel = 4;
}

/* Mllama multi_modal_projector: one Linear with bias */
static void fam_linear(module_spec *m)
{
    fam_mlp(m);
    m->conn = CONN_LINEAR;
    m->num_layers = 1;
}

/* Mistral3MultiModalProjector (Mistral-Small-3.1; models/mistral3/modeling_mistral3.py):
 * RMSNorm over the vision width, Mistral3PatchMerger (spatial_merge_size 2: unfold, then
 * Linear(4h, h) without bias), Linear, GELU, Linear (bias: multimodal_projector_bias,
 * false by default in Mistral3Config) */
static void fam_mistral3_merger(module_spec *m)
{
    fam_mlp(m);
    m->conn = CONN_MISTRAL3;
    m->conn_norm = NORM_RMS;
    m->merge_size = 2;
    m->conn_bias = 0;
}

/* ---- decoders ----------------------------------------------------------------------- */

static void dec_common(module_spec *m)
{
    m->norm = NORM_RMS;
    m->mlp = MLP_GATED;
    m->act = ACT_SILU;
    m->pos = POS_ROPE;
    m->softmax_fp32 = 1;
    m->merge = MERGE_SCATTER;
    m->experts = EXPERTS_GROUPED;
    m->moe_imbalance = 1.0;
}

/* LlamaForCausalLM / Vicuna / Mistral */
static void fam_llama(module_spec *m)
{
    dec_common(m);
}

/* Qwen2 / Qwen2.5 (also the LLM of LLaVA-OneVision, InternVL): q/k/v bias */
static void fam_qwen2(module_spec *m)
{
    dec_common(m);
    attn_bias(m, 1, 1, 1, 0);
}

/* Qwen2-VL / Qwen2.5-VL text model: Qwen2 with M-RoPE */
static void fam_qwen2_vl_text(module_spec *m)
{
    fam_qwen2(m);
    m->pos = POS_MROPE;
}

/* Qwen3: per-head RMSNorm on q and k, no biases */
static void fam_qwen3(module_spec *m)
{
    dec_common(m);
    m->qk_norm = QKN_HEAD;
}

/* Qwen3-VL text model: Qwen3 with interleaved M-RoPE and DeepStack */
static void fam_qwen3_vl_text(module_spec *m)
{
    fam_qwen3(m);
    m->pos = POS_MROPE;
}

/* Qwen3-MoE / Qwen3-VL-MoE: Qwen3 with a routed MoE MLP in every layer */
static void fam_qwen3_moe(module_spec *m)
{
    fam_qwen3(m);
    m->experts_per_tok = 8;
    m->lora_experts = 1; /* peft transformers_weight_conversion.py: qwen3_moe -> qwen2_moe */
}

/* Mixtral: Llama with 8 experts, top-2 */
static void fam_mixtral(module_spec *m)
{
    dec_common(m);
    m->num_experts = 8;
    m->experts_per_tok = 2;
    m->router_fp32 = 1;
    m->lora_experts = 1; /* peft _MOE_TARGET_MODULE_MAPPING["mixtral"] */
}

/* Qwen2-MoE: Qwen2 with routed experts plus a gated shared expert */
static void fam_qwen2_moe(module_spec *m)
{
    fam_qwen2(m);
    m->shared_expert_gate = 1;
    m->lora_experts = 1; /* peft _MOE_TARGET_MODULE_MAPPING["qwen2_moe"] */
}

/* Gemma 3 text: Gemma RMSNorm (1 + w, fp32), four norms per layer, per-head
 * qk-norm, GeGLU (gelu_pytorch_tanh), scaled embeddings, tied lm_head,
 * sliding-window layers with every 6th global, image tokens bidirectional */
static void fam_gemma3(module_spec *m)
{
    dec_common(m);
    m->norm = NORM_RMS_GEMMA;
    m->sandwich_norm = 1;
    m->qk_norm = QKN_HEAD;
    m->act = ACT_GELU_TANH;
    m->scale_embeddings = 1;
    m->tie_word_embeddings = 1;
    m->bidirectional_images = 1;
}

/* Mllama text model: Llama with gated cross-attention layers */
static void fam_mllama_text(module_spec *m)
{
    dec_common(m);
    m->merge = MERGE_CROSS_ATTENTION;
}

/* LLaVA-1.5 as haotian-liu/LLaVA trains it: per-sample embedding and cat */
static void fam_llava_llama(module_spec *m)
{
    dec_common(m);
    m->merge = MERGE_LLAVA;
}

static const family_def families[] = {
    {"clip", MOD_VISION, "CLIPVisionModel", fam_clip},
    {"siglip", MOD_VISION, "SiglipVisionModel", fam_siglip},
    {"qwen2_vl", MOD_VISION, "Qwen2VisionTransformerPretrainedModel", fam_qwen2_vl},
    {"qwen2_5_vl", MOD_VISION, "Qwen2_5_VisionTransformerPretrainedModel", fam_qwen2_5_vl},
    {"qwen3_vl", MOD_VISION, "Qwen3VLVisionModel", fam_qwen3_vl},
    {"intern_vit", MOD_VISION, "InternVLVisionModel", fam_intern_vit},
    {"idefics3", MOD_VISION, "Idefics3VisionTransformer", fam_idefics3},
    {"mllama", MOD_VISION, "MllamaVisionModel", fam_mllama},
    {"pixtral", MOD_VISION, "PixtralVisionModel", fam_pixtral},
    {"mlp", MOD_CONNECTOR, "LlavaMultiModalProjector", fam_mlp},
    {"patch_merger", MOD_CONNECTOR, "Qwen2-VL PatchMerger", fam_patch_merger},
    {"patch_merger_rms", MOD_CONNECTOR, "Qwen2_5_VLPatchMerger", fam_patch_merger_rms},
    {"pixel_shuffle_mlp", MOD_CONNECTOR, "InternVLMultiModalProjector", fam_pixel_shuffle_mlp},
    {"pixel_shuffle_linear", MOD_CONNECTOR, "Idefics3Connector", fam_pixel_shuffle_linear},
    {"avg_pool", MOD_CONNECTOR, "Gemma3MultiModalProjector", fam_avg_pool},
    {"linear", MOD_CONNECTOR, "Mllama multi_modal_projector", fam_linear},
    {"mistral3_merger", MOD_CONNECTOR, "Mistral3MultiModalProjector", fam_mistral3_merger},
    {"llama", MOD_DECODER, "LlamaModel", fam_llama},
    {"llava_llama", MOD_DECODER, "LLaVA (haotian-liu) LlavaLlamaForCausalLM", fam_llava_llama},
    {"qwen2", MOD_DECODER, "Qwen2Model", fam_qwen2},
    {"qwen2_vl", MOD_DECODER, "Qwen2VLTextModel / Qwen2_5_VLTextModel", fam_qwen2_vl_text},
    {"qwen3", MOD_DECODER, "Qwen3Model", fam_qwen3},
    {"qwen3_vl", MOD_DECODER, "Qwen3VLTextModel", fam_qwen3_vl_text},
    {"qwen3_moe", MOD_DECODER, "Qwen3MoeModel / Qwen3VLMoeTextModel", fam_qwen3_moe},
    {"qwen2_moe", MOD_DECODER, "Qwen2MoeModel", fam_qwen2_moe},
    {"mixtral", MOD_DECODER, "MixtralModel", fam_mixtral},
    {"gemma3", MOD_DECODER, "Gemma3TextModel", fam_gemma3},
    {"mllama", MOD_DECODER, "MllamaTextModel", fam_mllama_text},
};
#define NFAM (sizeof families / sizeof families[0])

const family_def *family_find(mod_kind k, const char *name)
{
    for (size_t i = 0; i < NFAM; i++)
        if (families[i].kind == k && strcmp(families[i].name, name) == 0)
            return &families[i];
    return NULL;
}

const family_def *family_default(mod_kind k)
{
    static const char *const def[MOD_NKIND] = {"clip", "mlp", "llama"};
    return family_find(k, def[k]);
}

size_t family_names(mod_kind k, const char **out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < NFAM && n + 1 < cap; i++)
        if (families[i].kind == k)
            out[n++] = families[i].name;
    out[n] = NULL;
    return n;
}

const family_def *family_at(mod_kind k, int index)
{
    int n = 0;
    for (size_t i = 0; i < NFAM; i++)
        if (families[i].kind == k && n++ == index)
            return &families[i];
    return NULL;
}
