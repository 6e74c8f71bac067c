/* test_liger.c - issue 23: training.liger_kernel.  Each of Liger's kernels changes
 * what it claims (model/ops_liger.c, from Liger-Kernel's
 * ops/{rms_norm,swiglu,geglu,rope,layer_norm}.py), true turns on the apply function's
 * defaults (Qwen2-VL / Qwen2.5-VL: the vision blocks' norms too; Gemma 3: GeGLU, Gemma's
 * RMSNorms, SigLIP's LayerNorms), and models Liger does not patch, or patches in ways not
 * modelled, are refused with the reason (spec/spec_liger.c). */
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 4 Llama layers, h 512, I 1376, T = 2 x 512 tokens, bf16 */
static const uint64_t L = 4, T = 1024, H = 512, I = 1376;

/* a preset of contrib/models with --set kv: refused with `why` */
static void preset_refused(const char *name, const char *why)
{
    mm_error e;
    mm_spec *s = unit_preset(name);
    ck_assert_msg(mm_spec_set(s, "training.liger_kernel=true", &e) != 0, "%s: accepted", name);
    ck_assert_msg(strstr(e.msg, "training.liger_kernel") && strstr(e.msg, why), "%s: %s", name,
                  e.msg);
    mm_spec_free(s);
}

/* activations the decoder rows whose name contains `part` hold at the peak */
static uint64_t acts_of(const mm_prediction *p, const char *part)
{
    uint64_t n = 0;
    for (size_t m = 0; m < p->n_modules; m++)
        for (size_t i = 0; i < p->modules[m].n_layers; i++)
            if (strstr(p->modules[m].layers[i].name, part))
                n += p->modules[m].layers[i].factors.activations;
    return n;
}

/* swiglu: LigerSiLUMulFunction saves gate and up, not silu(gate): the forward (its peak is
 * the loss's, every layer's saved set alive) holds one T x I bf16 product less per layer */
START_TEST(swiglu_saves_no_silu_product)
{
    mm_prediction a = unit_tiny_predict(""),
                  b = unit_tiny_predict("  liger_kernel: {rope: false, rms_norm: false, "
                              "fused_linear_cross_entropy: false}\n");
    ck_assert_uint_eq(a.phase_peak[MM_PHASE_FORWARD] - b.phase_peak[MM_PHASE_FORWARD],
                      L * T * I * 2);
    ck_assert_uint_lt(b.allocated_peak_bytes, a.allocated_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* rms_norm: LigerRMSNormFunction saves its input (the residual, alive anyway) and one
 * fp32 rstd per row; transformers' LlamaRMSNorm keeps an fp32 copy of x (PowBackward,
 * MulBackward) and more: at least T x h x 4 less per norm (2 per layer and the final) */
START_TEST(rms_norm_keeps_no_fp32_copy)
{
    mm_prediction a = unit_tiny_predict(""),
                  b = unit_tiny_predict("  liger_kernel: {rope: false, swiglu: false, "
                              "fused_linear_cross_entropy: false}\n");
    ck_assert_uint_ge(a.phase_peak[MM_PHASE_FORWARD] - b.phase_peak[MM_PHASE_FORWARD],
                      (2 * L + 1) * T * H * 4);
    ck_assert_uint_lt(b.allocated_peak_bytes, a.allocated_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* rope: LigerRopeFunction rotates q and k in place: what attention saves of them is the
 * projections' own storage (q_proj / k_proj rows), where transformers' rotary makes new
 * tensors (the rotary row); the same bytes, so the allocated peak stays */
START_TEST(rope_rotates_in_place)
{
    mm_prediction a = unit_tiny_predict(""),
                  b = unit_tiny_predict("  liger_kernel: {rms_norm: false, swiglu: false, "
                              "fused_linear_cross_entropy: false}\n");
    ck_assert_uint_gt(acts_of(&a, "self_attn.rotary"), 0);
    ck_assert_uint_eq(acts_of(&b, "self_attn.rotary"), 0);
    ck_assert_uint_eq(acts_of(&b, "self_attn.q_proj") - acts_of(&a, "self_attn.q_proj") +
                          acts_of(&b, "self_attn.k_proj") - acts_of(&a, "self_attn.k_proj"),
                      acts_of(&a, "self_attn.rotary"));
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* fused_linear_cross_entropy is loss: fused_linear; true is all four kernels; a loss
 * that contradicts it is refused */
START_TEST(true_is_the_defaults_and_the_fused_loss)
{
    mm_prediction a = unit_tiny_predict("  liger_kernel: {rope: false, rms_norm: false, swiglu: false}\n"),
                  b = unit_tiny_predict("  loss: fused_linear\n"),
                  c = unit_tiny_predict("  liger_kernel: true\n"),
                  d = unit_tiny_predict("  loss: fused_linear\n  liger_kernel: {}\n"),
                  f = unit_tiny_predict("  liger_kernel: false\n"), g = unit_tiny_predict("");
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    ck_assert_uint_eq(a.phase_peak[MM_PHASE_FORWARD], b.phase_peak[MM_PHASE_FORWARD]);
    ck_assert_uint_eq(c.phase_peak[MM_PHASE_FORWARD], d.phase_peak[MM_PHASE_FORWARD]);
    ck_assert_uint_lt(c.phase_peak[MM_PHASE_FORWARD], a.phase_peak[MM_PHASE_FORWARD]);
    ck_assert_uint_eq(f.allocated_peak_bytes, g.allocated_peak_bytes);
    unit_tiny_refused("  loss: standard\n  liger_kernel: true\n", "training.loss", "fused_linear");
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
    mm_prediction_free(&d);
    mm_prediction_free(&f);
    mm_prediction_free(&g);
}
END_TEST

/* LLaVA (HF llava: CLIP, mlp projector, a Llama decoder): the text model is patched
 * with the defaults whatever liger_kernel_config says (apply_liger_kernel_to_llava takes
 * no rope / rms_norm / swiglu), so the map may not turn them off; the CLIP tower keeps
 * its LayerNorm and GELU MLP */
START_TEST(llava_patches_its_text_model)
{
    static const char *const llava =
        "name: tiny-llava\n"
        "modules:\n"
        "  - {name: vision_tower, type: vision, family: clip, hidden_size: 128,\n"
        "     num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 256,\n"
        "     image_size: 112, patch_size: 14, trainable: false}\n"
        "  - {name: projector, type: connector, family: mlp, input_size: 128, hidden_size: 512,\n"
        "     num_layers: 2, trainable: true}\n"
        "  - {name: language_model, type: decoder, family: llama, hidden_size: 512,\n"
        "     num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4,\n"
        "     intermediate_size: 1376, vocab_size: 32000, trainable: true}\n"
        "training: {micro_batch_size: 2, seq_len: 512, precision: bf16%s}\n";
    char buf[2048];
    mm_error e;
    uint64_t peak[2];
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof buf, llava, i ? ", liger_kernel: {fused_linear_cross_entropy: false}"
                                           : "");
        mm_spec *s = mm_spec_load_buffer(buf, strlen(buf), "llava.yaml", MM_FMT_YAML, &e);
        ck_assert_msg(s != NULL, "%s", e.msg);
        mm_prediction p;
        ck_assert_msg(mm_predict(s, &p, &e) == 0, "%s", e.msg);
        peak[i] = p.phase_peak[MM_PHASE_FORWARD];
        mm_prediction_free(&p);
        mm_spec_free(s);
    }
    /* at least the silu products and the norms' fp32 copies of the decoder */
    ck_assert_uint_ge(peak[0] - peak[1], L * T * I * 2 + (2 * L + 1) * T * H * 4);
    snprintf(buf, sizeof buf, llava, ", liger_kernel: {swiglu: false}");
    ck_assert_ptr_null(mm_spec_load_buffer(buf, strlen(buf), "llava.yaml", MM_FMT_YAML, &e));
    ck_assert_msg(strstr(e.msg, "apply_liger_kernel_to_llava"), "%s", e.msg);
}
END_TEST

/* a tiny Qwen2-VL (tower qwen2_vl, LayerNorm) or Qwen2.5-VL (tower qwen2_5_vl, RMSNorm)
 * job, every module trained, one 448 x 448 image (32 x 32 = 1024 patches), bf16 */
static const char *const qvl =
    "name: tiny-qwen-vl\n"
    "modules:\n"
    "  - {name: vision_tower, type: vision, family: %s, hidden_size: 128,\n"
    "     num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 512,\n"
    "     patch_size: 14, temporal_patch_size: 2, spatial_merge_size: 2, num_channels: 3,\n"
    "     hidden_act: %s, trainable: true,\n"
    "     image_processor: {kind: dynamic, min_pixels: 1024, max_pixels: 262144}}\n"
    "  - {name: projector, type: connector, family: %s, input_size: 128,\n"
    "     hidden_size: 512, trainable: true}\n"
    "  - {name: language_model, type: decoder, family: qwen2_vl, hidden_size: 512,\n"
    "     num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4,\n"
    "     intermediate_size: 1376, vocab_size: 32000, trainable: true}\n"
    "training: {micro_batch_size: 1, seq_len: 512, images_per_sample: 1,\n"
    "           image_size: [448, 448], precision: bf16, liger_kernel: %s}\n";
static const uint64_t QVL_ROWS = 1024, QVL_DEPTH = 2;

static mm_spec *qvl_spec(int q25, const char *liger, mm_error *e)
{
    char buf[2048];
    snprintf(buf, sizeof buf, qvl, q25 ? "qwen2_5_vl" : "qwen2_vl", q25 ? "silu" : "quick_gelu",
             q25 ? "patch_merger_rms" : "patch_merger", liger);
    return mm_spec_load_buffer(buf, strlen(buf), "qvl.yaml", MM_FMT_YAML, e);
}

static mm_prediction qvl_predict(int q25, const char *liger)
{
    mm_error e;
    mm_spec *s = qvl_spec(q25, liger, &e);
    ck_assert_msg(s != NULL, "%s: %s", liger, e.msg);
    mm_prediction p = unit_predict(s);
    mm_spec_free(s);
    return p;
}

/* Qwen2-VL: apply_liger_kernel_to_qwen2_vl patches the vision blocks' norm1 / norm2 with
 * LigerLayerNorm (layer_norm, default true): its Mean and RSTD are in X's dtype (bf16),
 * torch's layer_norm keeps them in fp32: 2 x 2 bytes less per row, per norm.  The text
 * model's norms and MLPs are Liger's as for Qwen2 (the silu products gone). */
START_TEST(qwen2_vl_tower_layer_norm)
{
    mm_prediction a = qvl_predict(0, "{fused_linear_cross_entropy: false, layer_norm: false}"),
                  b = qvl_predict(0, "{fused_linear_cross_entropy: false}"),
                  c = qvl_predict(0, "{fused_linear_cross_entropy: false, swiglu: false}");
    ck_assert_uint_eq(acts_of(&a, "layers.norm") - acts_of(&b, "layers.norm"),
                      QVL_DEPTH * 2 * QVL_ROWS * 2 * 2);
    ck_assert_uint_gt(acts_of(&c, "mlp.act_fn"), acts_of(&b, "mlp.act_fn"));
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
}
END_TEST

/* Qwen2.5-VL: the vision blocks' RMSNorms are Liger's with rms_norm (no fp32 copy of x
 * kept: at least rows x 128 x 4 bytes less per norm); the function takes no layer_norm */
START_TEST(qwen2_5_vl_tower_rms_norm)
{
    mm_prediction a = qvl_predict(1, "{fused_linear_cross_entropy: false, rms_norm: false}"),
                  b = qvl_predict(1, "{fused_linear_cross_entropy: false}");
    ck_assert_uint_ge(acts_of(&a, "layers.norm") - acts_of(&b, "layers.norm"),
                      QVL_DEPTH * 2 * QVL_ROWS * 128 * 4);
    ck_assert_uint_lt(b.allocated_peak_bytes, a.allocated_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_error e;
    ck_assert_ptr_null(qvl_spec(1, "{layer_norm: true}", &e));
    ck_assert_msg(strstr(e.msg, "apply_liger_kernel_to_qwen2_5_vl takes no layer_norm"), "%s", e.msg);
}
END_TEST

/* rope: both functions replace apply_multimodal_rotary_pos_emb, which transformers 5.17
 * no longer calls: the M-RoPE decoder keeps transformers' rotary, rope changes nothing */
START_TEST(qwen_vl_rope_changes_nothing)
{
    for (int q25 = 0; q25 < 2; q25++) {
        mm_prediction a = qvl_predict(q25, "{rope: false}"), b = qvl_predict(q25, "true");
        ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
        for (int ph = 0; ph < MM_PHASE_COUNT; ph++)
            ck_assert_uint_eq(a.phase_peak[ph], b.phase_peak[ph]);
        mm_prediction_free(&a);
        mm_prediction_free(&b);
    }
}
END_TEST

/* a tiny Gemma 3 (SigLIP 224 px / 14 = 256 patches, avg-pool projector, Gemma 3 text
 * model with q/k norms and sandwich norms), every module trained, bf16 */
static mm_prediction g3_predict(const char *liger, int vision)
{
    static const char *const g3 =
        "name: tiny-gemma3\n"
        "modules:\n"
        "%s"
        "  - {name: language_model, type: decoder, family: gemma3, hidden_size: 512,\n"
        "     num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4, head_dim: 64,\n"
        "     intermediate_size: 1376, vocab_size: 32000, hidden_act: gelu_pytorch_tanh,\n"
        "     trainable: true}\n"
        "training: {micro_batch_size: 1, seq_len: 512, images_per_sample: %d, precision: bf16,\n"
        "           liger_kernel: %s}\n";
    static const char *const tower =
        "  - {name: vision_tower, type: vision, family: siglip, hidden_size: 128,\n"
        "     num_hidden_layers: 2, num_attention_heads: 4, intermediate_size: 512,\n"
        "     image_size: 224, patch_size: 14, hidden_act: gelu_pytorch_tanh,\n"
        "     output_hidden_states: false, feature_post_norm: true, trainable: true}\n"
        "  - {name: projector, type: connector, family: avg_pool, pool_kernel: 4,\n"
        "     input_size: 128, hidden_size: 512, trainable: true}\n";
    char buf[3072];
    mm_error e;
    snprintf(buf, sizeof buf, g3, vision ? tower : "", vision ? 1 : 0, liger);
    mm_spec *s = mm_spec_load_buffer(buf, strlen(buf), "g3.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s: %s", liger, e.msg);
    mm_prediction p = unit_predict(s);
    mm_spec_free(s);
    return p;
}

/* Gemma 3: geglu is LigerGELUMulFunction (a and b saved, no gelu(gate) product: one
 * T x I bf16 less per layer than transformers' act_fn(gate) * up); rms_norm covers the
 * q / k norms and the sandwich norms (Gemma casting, dX a new tensor) */
START_TEST(gemma3_geglu_and_gemma_rms_norm)
{
    for (int vision = 0; vision < 2; vision++) {
        const char *off = "{fused_linear_cross_entropy: false, rms_norm: false, geglu: false, "
                          "rope: false, layer_norm: false}";
        const char *txt = "{fused_linear_cross_entropy: false, rms_norm: false, geglu: false, rope: false}";
        mm_prediction a = g3_predict(vision ? off : txt, vision),
                      b = g3_predict(vision ? "{fused_linear_cross_entropy: false, rms_norm: false, "
                                              "rope: false, layer_norm: false}"
                                            : "{fused_linear_cross_entropy: false, rms_norm: false, "
                                              "rope: false}", vision),
                      c = g3_predict(vision ? "{fused_linear_cross_entropy: false, geglu: false, "
                                              "rope: false, layer_norm: false}"
                                            : "{fused_linear_cross_entropy: false, geglu: false, "
                                              "rope: false}", vision);
        ck_assert_uint_gt(acts_of(&a, "mlp.act_fn"), acts_of(&b, "mlp.act_fn"));
        ck_assert_uint_lt(b.allocated_peak_bytes, a.allocated_peak_bytes);
        ck_assert_uint_gt(acts_of(&a, "self_attn.q_norm"), acts_of(&c, "self_attn.q_norm"));
        ck_assert_uint_gt(acts_of(&a, "pre_feedforward_layernorm"),
                          acts_of(&c, "pre_feedforward_layernorm"));
        ck_assert_uint_lt(c.allocated_peak_bytes, a.allocated_peak_bytes);
        mm_prediction_free(&a);
        mm_prediction_free(&b);
        mm_prediction_free(&c);
    }
}
END_TEST

/* Gemma 3's SigLIP: layer_norm switches the encoder layers' LayerNorms (Mean / RSTD in
 * bf16: 2 x 2 bytes less per row and norm); the post_layernorm is Liger's either way
 * (apply_liger_kernel_to_gemma3 :1217); the text-only function takes no layer_norm */
START_TEST(gemma3_siglip_layer_norm)
{
    mm_prediction a = g3_predict("{fused_linear_cross_entropy: false, layer_norm: false}", 1),
                  b = g3_predict("{fused_linear_cross_entropy: false}", 1);
    ck_assert_uint_eq(acts_of(&a, "layers.norm") - acts_of(&b, "layers.norm"), 2 * 2 * 256 * 2 * 2);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_error e;
    mm_spec *s = unit_preset("gemma-3-27b-qlora");
    ck_assert_msg(mm_spec_set(s, "training.liger_kernel={swiglu: true}", &e) != 0, "accepted");
    ck_assert_msg(strstr(e.msg, "apply_liger_kernel_to_gemma3 takes no swiglu"), "%s", e.msg);
    mm_spec_free(s);
    s = unit_preset("gemma-3-27b-qlora");
    ck_assert_msg(mm_spec_set(s, "training.liger_kernel=true", &e) == 0, "%s", e.msg);
    mm_spec_free(s);
}
END_TEST

/* what Liger does not do, or does in ways not modelled, is refused with the reason */
START_TEST(refused_where_not_what_runs)
{
    unit_tiny_refused("  liger_kernel: {layer_norm: true}\n", "liger_kernel.layer_norm", "takes no layer_norm");
    unit_tiny_refused("  liger_kernel: {geglu: true}\n", "liger_kernel.geglu", "takes no geglu");
    unit_tiny_refused("  liger_kernel: {cross_entropy: true}\n", "liger_kernel.cross_entropy",
            "not modelled");
    unit_tiny_refused("  liger_kernel: {rope: maybe}\n", "training.liger_kernel.rope", "");
    preset_refused("llava-onevision-qwen2-7b-ov", "Liger patches nothing there");
    preset_refused("llava-1.5-7b-finetune", "llava_llama");
    preset_refused("smolvlm-qlora", "idefics3");
    preset_refused("qwen3-vl-8b-full", "apply_liger_kernel_to_qwen3_vl");
    preset_refused("mixtral-8x7b-lora", "MoE");
}
END_TEST

Suite *liger_suite(void)
{
    Suite *s = suite_create("liger");
    TCase *tc = tcase_create("liger");
    tcase_add_test(tc, swiglu_saves_no_silu_product);
    tcase_add_test(tc, rms_norm_keeps_no_fp32_copy);
    tcase_add_test(tc, rope_rotates_in_place);
    tcase_add_test(tc, true_is_the_defaults_and_the_fused_loss);
    tcase_add_test(tc, llava_patches_its_text_model);
    tcase_add_test(tc, qwen2_vl_tower_layer_norm);
    tcase_add_test(tc, qwen2_5_vl_tower_rms_norm);
    tcase_add_test(tc, qwen_vl_rope_changes_nothing);
    tcase_add_test(tc, gemma3_geglu_and_gemma_rms_norm);
    tcase_add_test(tc, gemma3_siglip_layer_norm);
    tcase_add_test(tc, refused_where_not_what_runs);
    suite_add_tcase(s, tc);
    return s;
}
