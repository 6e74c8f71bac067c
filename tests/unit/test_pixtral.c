/* test_pixtral.c - issue 23: the Pixtral vision family.  image_processor kind
 * pixtral follows PixtralImageProcessor (longest side at most longest_edge, sides
 * rounded up to whole patches) and processing_pixtral.py's [IMG_BREAK] /
 * [IMG_END] tokens; the tower runs every image in one sequence behind a float
 * block mask that SDPA's memory-efficient kernel keeps per layer (a padded copy
 * when the sequence is no multiple of 16); `mmguard import` reads a pixtral
 * vision_config and PixtralImageProcessor. */
#include "unit.h"
#include "import.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void tokens(mm_spec *s, const char *size, uint64_t patches, uint64_t toks)
{
    char kv[96];
    snprintf(kv, sizeof kv, "training.image_size=%s", size);
    mm_prediction p = unit_set_predict(s, kv);
    ck_assert_uint_eq(p.image_patches, patches);
    ck_assert_uint_eq(p.image_tokens, toks);
    mm_prediction_free(&p);
}

/* images keep their size: 16-px patches, rounded up; larger ones scaled down
 * (floor) to the longest edge; one break / end token per patch row */
START_TEST(pixtral_tokens_follow_the_image)
{
    mm_spec *s = unit_preset("pixtral-12b-lora");
    tokens(s, "[1024, 1024]", 64 * 64, 64 * 64 + 64);
    tokens(s, "[600, 1000]", 38 * 63, 38 * 63 + 38);     /* 37.5 -> 38, 62.5 -> 63 rows / cols */
    tokens(s, "[2048, 1024]", 64 * 32, 64 * 32 + 64);    /* scaled by 2: 1024 x 512 */
    tokens(s, "[16, 16]", 1, 2);
    mm_error e;
    ck_assert_msg(mm_spec_set(s, "vision_tower.image_processor={kind: pixtral, longest_edge: 512}",
                              &e) == 0, "%s", e.msg);
    tokens(s, "[1024, 1024]", 32 * 32, 32 * 32 + 32);
    /* kind fixed ignores the image: image_size / patch_size squared */
    ck_assert_msg(mm_spec_set(s, "vision_tower.image_processor={kind: fixed}", &e) == 0, "%s",
                  e.msg);
    tokens(s, "[512, 1024]", 64 * 64, 64 * 64);
    mm_spec_free(s);
}
END_TEST

/* seq_len must hold the [IMG], [IMG_BREAK] and [IMG_END] tokens */
START_TEST(pixtral_seq_len_holds_the_breaks)
{
    mm_spec *s = unit_preset("pixtral-12b-lora");
    mm_error e;
    ck_assert(mm_spec_set(s, "training.seq_len=4100", &e) != 0);
    ck_assert_msg(strstr(e.msg, "4160 image tokens"), "%s", e.msg);
    ck_assert_msg(mm_spec_set(s, "training.seq_len=4160", &e) == 0, "%s", e.msg);
    mm_spec_free(s);
}
END_TEST

/* a trained tower under SDPA without checkpointing: 63 x 63 = 3969 patches (no
 * multiple of 16) make every layer keep its own padded copy of the (P, P) mask,
 * 4096 patches let every layer keep the one mask - so fewer patches cost more;
 * eager keeps neither (the mask is added, not saved) and is ordered by size */
START_TEST(pixtral_sdpa_keeps_the_float_mask)
{
    mm_spec *s = unit_preset("pixtral-12b-full");
    mm_error e;
    ck_assert_msg(mm_spec_set(s, "training.gradient_checkpointing=false", &e) == 0, "%s", e.msg);
    ck_assert_msg(mm_spec_set(s, "language_model.num_hidden_layers=2", &e) == 0, "%s", e.msg);
    uint64_t odd = unit_set_forward_peak(s, "training.image_size=[1008, 1008]");
    uint64_t even = unit_set_forward_peak(s, "training.image_size=[1024, 1024]");
    ck_assert_uint_gt(odd, even);
    /* 24 layers x 3969 x 3984 bf16 padded copies against one 4096 x 4096 mask */
    ck_assert_uint_gt(odd - even, 24ull * 3969 * 3984 * 2 / 2);
    ck_assert_msg(mm_spec_set(s, "training.attention=eager", &e) == 0, "%s", e.msg);
    uint64_t eodd = unit_set_forward_peak(s, "training.image_size=[1008, 1008]");
    uint64_t eeven = unit_set_forward_peak(s, "training.image_size=[1024, 1024]");
    ck_assert_uint_lt(eodd, eeven);
    mm_spec_free(s);
}
END_TEST

/* the family runs every image in ONE sequence: two images' eager attention is
 * (2P)^2, four times one image's P^2 per layer, not twice */
START_TEST(pixtral_one_sequence_for_all_images)
{
    mm_spec *s = unit_preset("pixtral-12b-full");
    mm_error e;
    const char *kv[] = {"training.gradient_checkpointing=false", "training.attention=eager",
                        "language_model.num_hidden_layers=1", "training.image_size=[512, 512]"};
    for (size_t i = 0; i < sizeof kv / sizeof kv[0]; i++)
        ck_assert_msg(mm_spec_set(s, kv[i], &e) == 0, "%s", e.msg);
    uint64_t one = unit_set_forward_peak(s, "training.images_per_sample=1");
    uint64_t two = unit_set_forward_peak(s, "training.images_per_sample=2");
    /* 24 layers keep fp32 and bf16 probabilities of 16 heads: P = 1024 adds
     * 24 x 16 x 6 x (4 - 1) P^2 bytes from one image to two */
    ck_assert_uint_gt(two - one, 24ull * 16 * 6 * 3 * 1024 * 1024);
    mm_spec_free(s);
}
END_TEST

/* config.json of a LlavaForConditionalGeneration with a pixtral vision_config (as
 * transformers 5.17 writes it) and its PixtralImageProcessor */
static const char *const CFG =
    "{\"model_type\": \"llava\", \"image_token_index\": 13117, \"projector_hidden_act\": \"gelu\","
    " \"vision_feature_layer\": -1, \"vision_feature_select_strategy\": \"full\","
    " \"multimodal_projector_bias\": true, \"tie_word_embeddings\": false,"
    " \"text_config\": {\"model_type\": \"mistral\", \"hidden_size\": 128, \"head_dim\": 32,"
    "  \"intermediate_size\": 384, \"num_attention_heads\": 4, \"num_hidden_layers\": 2,"
    "  \"num_key_value_heads\": 1, \"vocab_size\": 13120, \"sliding_window\": null,"
    "  \"tie_word_embeddings\": false},"
    " \"vision_config\": {\"model_type\": \"pixtral\", \"hidden_size\": 64, \"head_dim\": %d,"
    "  \"intermediate_size\": 256, \"num_attention_heads\": 2, \"num_hidden_layers\": 2,"
    "  \"image_size\": 128, \"patch_size\": 16, \"num_channels\": 3, \"hidden_act\": \"silu\","
    "  \"attention_dropout\": 0.0,"
    "  \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"axial\"}}}";
static const char *const PRE =
    "{\"image_processor_type\": \"PixtralImageProcessor\", \"size\": {\"longest_edge\": %d},"
    " \"patch_size\": {\"height\": %d, \"width\": %d}, \"do_resize\": true}";

static int import(int head_dim, int longest, int patch, imp_spec *S, mm_error *e)
{
    char cfg[2048], pre[256];
    snprintf(cfg, sizeof cfg, CFG, head_dim);
    snprintf(pre, sizeof pre, PRE, longest, patch, patch);
    imp_init(S);
    return imp_hf_buffer(S, cfg, strlen(cfg), "config.json", pre, strlen(pre),
                         "preprocessor_config.json", e);
}

START_TEST(pixtral_import)
{
    imp_spec *S = calloc(1, sizeof *S);
    ck_assert_ptr_nonnull(S);
    mm_error e;
    ck_assert_msg(import(32, 1024, 16, S, &e) == 0, "%s", e.msg);
    imp_section *v = imp_module(S, "vision");
    ck_assert_str_eq(imp_get(v, "family"), "pixtral");
    ck_assert_str_eq(imp_get(v, "hidden_act"), "silu");
    ck_assert_str_eq(imp_get(v, "select_layer"), "-1");
    ck_assert_str_eq(imp_get(v, "image_processor"), "{kind: pixtral, longest_edge: 1024}");
    ck_assert_str_eq(imp_get(imp_module(S, "connector"), "family"), "mlp");
    ck_assert_int_ne(import(16, 1024, 16, S, &e), 0); /* head_dim is derived */
    ck_assert_msg(strstr(e.msg, "head_dim"), "%s", e.msg);
    ck_assert_int_ne(import(32, 1024, 14, S, &e), 0); /* the processor's patch != the model's */
    ck_assert_msg(strstr(e.msg, "patch_size"), "%s", e.msg);
    free(S);
}
END_TEST

/* Mistral-Small-3.1's layout: the Pixtral tower, Mistral3MultiModalProjector */
static const char *const M3 =
    "name: m3\n"
    "modules:\n"
    "  - {name: vision_tower, type: vision, family: pixtral, hidden_size: 1024, num_hidden_layers: 24,\n"
    "     num_attention_heads: 16, intermediate_size: 4096, image_size: 1540, patch_size: 14,\n"
    "     hidden_act: silu, trainable: false}\n"
    "  - {name: projector, type: connector, family: %s, input_size: 1024, hidden_size: 5120,\n"
    "     trainable: true}\n"
    "  - {name: language_model, type: decoder, family: llama, hidden_size: 5120, num_hidden_layers: 2,\n"
    "     num_attention_heads: 32, num_key_value_heads: 8, head_dim: 128, intermediate_size: 32768,\n"
    "     vocab_size: 131072, trainable: false}\n"
    "training: {micro_batch_size: 1, seq_len: 8192, images_per_sample: 1, image_size: [600, 1000],\n"
    "           precision: bf16}\n";

static mm_prediction m3(const char *family)
{
    char buf[2048];
    mm_error e;
    snprintf(buf, sizeof buf, M3, family);
    mm_spec *s = mm_spec_load_buffer(buf, strlen(buf), "m3.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    mm_prediction p = unit_predict(s);
    mm_spec_free(s);
    return p;
}

/* the processor aligns to patch x merge = 28 px (600 -> 22, 1000 -> 36 merged rows /
 * columns), the tower sees twice as many patches a side, the LM one token per 2x2
 * patches plus a break per merged row; the same tower with LLaVA's MLP aligns to 14 px */
START_TEST(mistral3_merger_tokens)
{
    mm_prediction p = m3("mistral3_merger");
    ck_assert_uint_eq(p.image_patches, 44 * 72);
    ck_assert_uint_eq(p.image_tokens, 22 * 36 + 22);
    mm_prediction q = m3("mlp");
    ck_assert_uint_eq(q.image_patches, 43 * 72); /* 42.9 -> 43, 71.4 -> 72 */
    ck_assert_uint_eq(q.image_tokens, 43 * 72 + 43);
    /* the merger adds its RMSNorm and Linear(4h, h); its Linears have no biases */
    ck_assert_uint_eq(p.parameters_count + 2 * 5120, q.parameters_count + 4ull * 1024 * 1024 + 1024);
    mm_prediction_free(&p);
    mm_prediction_free(&q);
}
END_TEST

/* Mistral3Config: spatial_merge_size, no projector bias by default; its processor's
 * patch_size may be the model's x the merge (what PixtralProcessor hands it) */
START_TEST(mistral3_import)
{
    static const char *const cfg =
        "{\"model_type\": \"mistral3\", \"spatial_merge_size\": 2, \"tie_word_embeddings\": false,"
        " \"text_config\": {\"model_type\": \"mistral\", \"hidden_size\": 128, \"head_dim\": 32,"
        "  \"intermediate_size\": 384, \"num_attention_heads\": 4, \"num_hidden_layers\": 2,"
        "  \"num_key_value_heads\": 1, \"vocab_size\": 13120, \"sliding_window\": null},"
        " \"vision_config\": {\"model_type\": \"pixtral\", \"hidden_size\": 64, \"head_dim\": 32,"
        "  \"intermediate_size\": 256, \"num_attention_heads\": 2, \"num_hidden_layers\": 2,"
        "  \"image_size\": 128, \"patch_size\": 16, \"hidden_act\": \"silu\"}}";
    static const char *const pre =
        "{\"image_processor_type\": \"PixtralImageProcessor\", \"size\": {\"longest_edge\": 128},"
        " \"patch_size\": {\"height\": 32, \"width\": 32}}";
    imp_spec *S = calloc(1, sizeof *S);
    ck_assert_ptr_nonnull(S);
    mm_error e;
    imp_init(S);
    ck_assert_msg(imp_hf_buffer(S, cfg, strlen(cfg), "config.json", pre, strlen(pre),
                                "preprocessor_config.json", &e) == 0, "%s", e.msg);
    imp_section *c = imp_module(S, "connector");
    ck_assert_str_eq(imp_get(c, "family"), "mistral3_merger");
    ck_assert_str_eq(imp_get(c, "merge_size"), "2");
    ck_assert_ptr_null(imp_get(c, "bias"));
    ck_assert_str_eq(imp_get(imp_module(S, "vision"), "family"), "pixtral");
    free(S);
}
END_TEST

Suite *pixtral_suite(void)
{
    Suite *s = suite_create("pixtral");
    TCase *tc = tcase_create("pixtral");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, pixtral_tokens_follow_the_image);
    tcase_add_test(tc, pixtral_seq_len_holds_the_breaks);
    tcase_add_test(tc, pixtral_sdpa_keeps_the_float_mask);
    tcase_add_test(tc, pixtral_one_sequence_for_all_images);
    tcase_add_test(tc, pixtral_import);
    tcase_add_test(tc, mistral3_merger_tokens);
    tcase_add_test(tc, mistral3_import);
    suite_add_tcase(s, tc);
    return s;
}
