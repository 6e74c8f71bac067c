/* import_hf.c - Hugging Face config.json (+ preprocessor_config.json) ->
 * modules: which sub-configs hold the vision and text parts for each
 * top-level model_type, and the image processor of each family. */
#include "import_hf.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static const char *const vlm_types[] = {"llava", "llava_onevision", "qwen2_vl", "qwen2_5_vl",
                                        "qwen3_vl", "qwen3_vl_moe", "internvl", "internvl_chat",
                                        "gemma3", "mllama", "idefics3", "smolvlm", "mistral3",
                                        NULL};

/* the text part of a VLM: its sub-config (or the top level) and model_type */
static const mm_node *text_part(const mm_node *root, const char *top, char *ttype, size_t n,
                                const char **key)
{
    const mm_node *t = mm_node_get(root, "text_config");
    *key = "text_config";
    if (!strcmp(top, "internvl_chat")) {
        t = mm_node_get(root, "llm_config");
        *key = "llm_config";
    }
    const mm_node *mt = t ? mm_node_get(t, "model_type") : NULL;
    if (mt && mt->type == MM_NODE_SCALAR && mt->str)
        snprintf(ttype, n, "%s", mt->str);
    else if (!strcmp(top, "qwen2_vl") || !strcmp(top, "qwen2_5_vl") || !strcmp(top, "qwen3_vl"))
        snprintf(ttype, n, "%.40s_text", top);
    else if (!strcmp(top, "qwen3_vl_moe"))
        snprintf(ttype, n, "qwen3_vl_moe_text");
    else if (!strcmp(top, "gemma3"))
        snprintf(ttype, n, "gemma3_text");
    else if (!strcmp(top, "mllama"))
        snprintf(ttype, n, "mllama_text_model");
    else if (!strcmp(top, "llava_onevision") || !strcmp(top, "internvl"))
        snprintf(ttype, n, "qwen2");
    else if (!strcmp(top, "mistral3")) /* Mistral3Config's text_config default */
        snprintf(ttype, n, "mistral");
    else
        snprintf(ttype, n, "llama");
    if (!t && (!strcmp(top, "qwen2_vl") || !strcmp(top, "qwen2_5_vl"))) {
        *key = "";
        return root; /* older Qwen-VL files keep the text keys at the top */
    }
    return t;
}

/* LLaVA-OneVision keeps the anyres grid in config.json: image_grid_pinpoints
 * and vision_aspect_ratio anyres_max_N */
static int anyres_from_config(hfc *rh, imp_spec *s)
{
    const mm_node *pp = hf_node(rh, "image_grid_pinpoints");
    char ar[64], buf[600] = "[";
    if (hf_str(rh, "vision_aspect_ratio", "anyres_max_9", ar, sizeof ar))
        return -1;
    uint64_t maxt = 9;
    if (strncmp(ar, "anyres_max_", 11) || key_parse_u64(ar + 11, &maxt))
        return hf_fail(rh, "vision_aspect_ratio", "expected anyres_max_N, got '%s'", ar);
    if (!pp || pp->type != MM_NODE_SEQ || !pp->n || pp->n > 64)
        return hf_fail(rh, "image_grid_pinpoints", "expected 1 to 64 [height, width] pairs");
    size_t o = 1;
    for (size_t i = 0; i < pp->n && o + 32 < sizeof buf; i++) {
        const mm_node *e = pp->vals[i];
        if (e->type != MM_NODE_SEQ || e->n != 2 || e->vals[0]->type != MM_NODE_SCALAR ||
            e->vals[1]->type != MM_NODE_SCALAR)
            return hf_fail(rh, "image_grid_pinpoints", "expected [height, width] pairs");
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s[%s, %s]", i ? ", " : "",
                              e->vals[0]->str, e->vals[1]->str);
    }
    snprintf(buf + o, sizeof buf - o, "]");
    imp_set(imp_module(s, "vision"), "image_processor",
            "image_grid_pinpoints, vision_aspect_ratio",
            "{kind: anyres, max_tiles: %llu, image_newline: true, image_grid_pinpoints: %s}",
            ULL(maxt), buf);
    return 0;
}

static int vlm(imp_spec *s, const mm_node *root, const char *top, const char *file, mm_error *err)
{
    hfc th, vh, rh;
    char ttype[64];
    const char *tkey;
    const mm_node *t = text_part(root, top, ttype, sizeof ttype, &tkey);
    hfc_init(&rh, s, root, "", file, err);
    hf_mark(&rh, "text_config");
    hf_mark(&rh, "llm_config");
    hf_mark(&rh, "vision_config");
    /* transformers 5.17 ties by the top-level flag, whose class default is true
     * for InternVLConfig, Gemma3Config and Mistral3Config (a converted config that
     * leaves it out is tied) */
    int top_tie = -1, tie;
    int top_def = !strcmp(top, "internvl") || !strcmp(top, "gemma3") || !strcmp(top, "mistral3");
    if (t != root && (mm_node_get(root, "tie_word_embeddings") || top_def)) {
        if (hf_bool(&rh, "tie_word_embeddings", top_def, &tie))
            return -1;
        top_tie = tie;
    }
    hfc *text = t == root ? &rh : &th;
    if (t != root)
        hfc_init(&th, s, t, tkey, file, err);
    if (imp_hf_text(text, ttype, top_tie, s))
        return -1;
    if (t != root && hf_finish(&th))
        return -1;
    hfc_init(&vh, s, mm_node_get(root, "vision_config"), "vision_config", file, err);
    if (imp_hf_vision(&rh, &vh, top, s))
        return -1;
    if (!strcmp(top, "internvl_chat")) { /* tiles from config.json */
        uint64_t size, lo, hi;
        int thumb, dyn;
        if (hf_u64(&rh, "force_image_size", 448, &size) || hf_u64(&rh, "min_dynamic_patch", 1, &lo) ||
            hf_u64(&rh, "max_dynamic_patch", 12, &hi) || hf_bool(&rh, "use_thumbnail", 1, &thumb) ||
            hf_bool(&rh, "dynamic_image_size", 1, &dyn))
            return -1;
        imp_section *v = imp_module(s, "vision");
        imp_set(v, "image_size", "force_image_size", "%llu", ULL(size));
        imp_set(v, "image_processor",
                "max_dynamic_patch / min_dynamic_patch / use_thumbnail",
                "{kind: %s, min_tiles: %llu, max_tiles: %llu, use_thumbnail: %s}",
                dyn ? "tiles" : "fixed", ULL(lo), ULL(dyn ? hi : 1), thumb ? "true" : "false");
    }
    if (!strcmp(top, "llava_onevision") && anyres_from_config(&rh, s))
        return -1;
    hf_mark(&rh, "hidden_size");                /* InternVL copies the LLM width */
    if (t != root && mm_node_get(root, "vocab_size"))
        imp_note(s, "ignored vocab_size: a copy of %s.vocab_size", tkey);
    hf_mark(&rh, "vocab_size");
    if (t != root && mm_node_get(root, "use_cache"))
        imp_note(s, "ignored the top-level use_cache: the language model reads its own "
                    "(%s.use_cache)", tkey);
    hf_mark(&rh, "use_cache");
    return imp_hf_quant(&rh, s, 1) || hf_finish(&rh) ? -1 : 0;
}

/* VLMs the families do not describe, and what is missing (the rest get
 * the language-model reader's list of what is described) */
static const char *unmodelled_why(const char *t)
{
    static const char *const types[][2] = {
        {"minicpmv", "MiniCPM-V's connector is a perceiver resampler (cross-attention of learned "
                     "queries over the patches, resampler.py), which no family has"},
        {"idefics2", "Idefics2's connector is a perceiver resampler (Idefics2PerceiverResampler), "
                     "which no family has"},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(types[i][0], t))
            return types[i][1];
    return NULL;
}

static int is_vlm(const char *t)
{
    for (size_t i = 0; vlm_types[i]; i++)
        if (!strcmp(vlm_types[i], t))
            return 1;
    return 0;
}

int imp_hf_buffer(imp_spec *s, const char *buf, size_t len, const char *name, const char *pre,
                  size_t prelen, const char *prename, mm_error *err)
{
    mm_node *root = mm_json_parse(buf, len, name, err);
    if (!root)
        return -1;
    imp_source(s, name, buf, len);
    int rc = -1;
    const mm_node *mt = mm_node_get(root, "model_type");
    if (root->type != MM_NODE_MAP || !mt || mt->type != MM_NODE_SCALAR || !mt->str) {
        mm_err_at(err, name, root->line, root->col, "model_type: required (a Hugging Face "
                                                      "config.json names its model_type)");
        goto out;
    }
    char top[48];
    snprintf(top, sizeof top, "%.40s", mt->str);
    const char *why = unmodelled_why(top);
    if (why) {
        mm_err_at(err, name, mt->line, mt->col, "model_type: '%s' is refused: %s", top, why);
        goto out;
    }
    if (is_vlm(top)) {
        rc = vlm(s, root, top, name, err);
    } else {
        hfc h;
        hfc_init(&h, s, root, "", name, err);
        rc = imp_hf_text(&h, top, -1, s) || imp_hf_quant(&h, s, 0) || hf_finish(&h) ? -1 : 0;
    }
    if (!rc && pre)
        rc = imp_hf_preprocessor(s, pre, prelen, prename, top, err);
    else if (!rc && strcmp(top, "internvl_chat") && imp_module(s, "vision")->n &&
             imp_get(imp_module(s, "vision"), "family"))
        imp_note(s, "assumed the family's default image processor (no preprocessor_config.json)");
out:
    mm_node_free(root);
    return rc;
}

/* config.json, or a directory holding it; preprocessor_config.json beside it */
int imp_hf(imp_spec *s, const char *path, mm_error *err)
{
    char cfg[1024], pre[1024], dir[1024];
    size_t n = strlen(path);
    if (n >= 11 && strcmp(path + n - 11, "config.json") == 0) {
        snprintf(cfg, sizeof cfg, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(pre, sizeof pre, "%s/preprocessor_config.json", dirname(dir));
    } else {
        snprintf(cfg, sizeof cfg, "%s/config.json", path);
        snprintf(pre, sizeof pre, "%s/preprocessor_config.json", path);
    }
    size_t len, plen = 0;
    char *buf = imp_read_file(cfg, &len, err);
    if (!buf)
        return -1;
    mm_error perr;
    char *pbuf = imp_read_file(pre, &plen, &perr); /* optional */
    int rc = imp_hf_buffer(s, buf, len, cfg, pbuf, plen, pbuf ? pre : NULL, err);
    free(buf);
    free(pbuf);
    return rc;
}
