/* import_pre.c - preprocessor_config.json -> the vision module's image
 * processor: what decides how many tiles and patches an image becomes
 * (transformers 5.17 image processors: Qwen2VL, CLIP/Siglip, LlavaOnevision,
 * GotOcr2 (InternVL), Gemma3, Mllama, Idefics3, Pixtral). */
#include "import_hf.h"

#include <stdio.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static const char *const preprocessing_only[] = {
    "image_mean", "image_std", "do_normalize", "do_rescale", "rescale_factor", "do_resize",
    "resample", "do_convert_rgb", "processor_class", "image_processor_type",
    "feature_extractor_type", "do_center_crop", "do_pad", "default_to_square", "input_data_format",
    "data_format", "return_tensors", "device", "disable_grouping", "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops", "pan_and_scan_min_ratio_to_activate", "image_seq_length",
    "crop_size", "size", "max_image_size", "patch_size", "merge_size", "temporal_patch_size",
    "vision_aspect_ratio", NULL};

static int only_preprocessing(const char *key)
{
    for (size_t i = 0; preprocessing_only[i]; i++)
        if (!strcmp(preprocessing_only[i], key))
            return 1;
    return 0;
}

/* a size that is an int or {height, width} / {shortest_edge} / {longest_edge} */
static uint64_t size_of(const mm_node *v, const char *key)
{
    uint64_t u = 0;
    if (!v)
        return 0;
    if (v->type == MM_NODE_SCALAR && !key_parse_u64(v->str, &u))
        return u;
    const mm_node *e = v->type == MM_NODE_MAP ? mm_node_get(v, key) : NULL;
    if (e && e->type == MM_NODE_SCALAR && !key_parse_u64(e->str, &u))
        return u;
    return 0;
}

static int dynamic(hfc *p, imp_section *v)
{
    uint64_t lo, hi, ps, ms, tp, vp = 0, vm = 0, vt = 0;
    const mm_node *size = hf_node(p, "size");
    if (hf_u64(p, "min_pixels", size_of(size, "shortest_edge") ? size_of(size, "shortest_edge")
                                                                 : 3136, &lo) ||
        hf_u64(p, "max_pixels", size_of(size, "longest_edge") ? size_of(size, "longest_edge")
                                                                : 12845056, &hi) ||
        hf_u64(p, "patch_size", 14, &ps) || hf_u64(p, "merge_size", 2, &ms) ||
        hf_u64(p, "temporal_patch_size", 2, &tp))
        return -1;
    key_parse_u64(imp_get(v, "patch_size"), &vp);
    key_parse_u64(imp_get(v, "spatial_merge_size"), &vm);
    key_parse_u64(imp_get(v, "temporal_patch_size"), &vt);
    if (ps != vp || ms != vm || tp != vt)
        return hf_fail(p, "patch_size", "patch %llu / merge %llu / temporal %llu differ from the "
                                        "model's %llu / %llu / %llu", ULL(ps), ULL(ms), ULL(tp),
                       ULL(vp), ULL(vm), ULL(vt));
    imp_set(v, "image_processor", "preprocessor_config.json min_pixels / max_pixels",
            "{kind: dynamic, min_pixels: %llu, max_pixels: %llu}", ULL(lo), ULL(hi));
    return 0;
}

static int tiles(hfc *p, imp_section *v, const char *type)
{
    uint64_t lo, hi;
    int crop;
    if (hf_bool(p, "crop_to_patches", 0, &crop) || hf_u64(p, "min_patches", 1, &lo) ||
        hf_u64(p, "max_patches", 12, &hi))
        return -1;
    (void)type;
    imp_set(v, "image_processor", "GotOcr2ImageProcessor crop_to_patches / min / max_patches",
            "{kind: %s, min_tiles: %llu, max_tiles: %llu, use_thumbnail: true}",
            crop ? "tiles" : "fixed", ULL(lo), ULL(crop ? hi : 1));
    return 0;
}

static int anyres(hfc *p, imp_spec *s, imp_section *v)
{
    const mm_node *pp = hf_node(p, "image_grid_pinpoints");
    if (!pp || pp->type != MM_NODE_SEQ || !pp->n || pp->n > 64)
        return hf_fail(p, "image_grid_pinpoints", "expected 1 to 64 [height, width] pairs");
    char buf[1600] = "[";
    size_t o = 1;
    for (size_t i = 0; i < pp->n && o + 32 < sizeof buf; i++) {
        const mm_node *e = pp->vals[i];
        if (e->type != MM_NODE_SEQ || e->n != 2)
            return hf_fail(p, "image_grid_pinpoints", "expected [height, width] pairs");
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s[%s, %s]", i ? ", " : "",
                              e->vals[0]->str ? e->vals[0]->str : "?",
                              e->vals[1]->str ? e->vals[1]->str : "?");
    }
    snprintf(buf + o, sizeof buf - o, "]");
    (void)s;
    imp_set(v, "image_processor", "image_grid_pinpoints, vision_aspect_ratio anyres_max_9",
            "{kind: anyres, max_tiles: 9, image_newline: true, image_grid_pinpoints: %s}", buf);
    return 0;
}

static int split(hfc *p, imp_section *v)
{
    int on;
    const mm_node *size = hf_node(p, "size"), *max = hf_node(p, "max_image_size");
    if (hf_bool(p, "do_image_splitting", 1, &on))
        return -1;
    uint64_t longest = size_of(size, "longest_edge"), tile = size_of(max, "longest_edge");
    if (tile)
        imp_set(v, "image_size", "preprocessor max_image_size.longest_edge", "%llu", ULL(tile));
    imp_set(v, "image_processor", "preprocessor size.longest_edge, do_image_splitting",
            "{kind: %s, longest_edge: %llu}", on ? "split" : "fixed", ULL(longest ? longest : 1456));
    return 0;
}

/* PixtralImageProcessor: the longest side at most size.longest_edge, sides rounded up
 * to patch_size (image_processing_pil_pixtral.py:90-103, 141-158) */
static int pixtral(hfc *p, imp_section *v)
{
    const mm_node *size = hf_node(p, "size"), *ps = hf_node(p, "patch_size");
    uint64_t longest = size_of(size, "longest_edge"), patch = size_of(ps, "height"), vp = 0, mg = 1;
    if (!longest)
        return hf_fail(p, "size", "expected {longest_edge: N}");
    key_parse_u64(imp_get(v, "patch_size"), &vp);
    /* Mistral3: PixtralProcessor hands the image processor patch x spatial_merge_size
     * (processing_pixtral.py:94); a saved processor may hold either */
    const char *ms = imp_get(imp_module(p->s, "connector"), "merge_size");
    if (ms && key_parse_u64(ms, &mg))
        mg = 1;
    uint64_t pw = size_of(ps, "width");
    if (mg > 1 && patch == vp * mg && pw == patch)
        patch = pw = vp;
    if (patch && (patch != vp || pw != vp))
        return hf_fail(p, "patch_size", "%llu differs from the model's patch_size %llu",
                       ULL(patch), ULL(vp));
    imp_set(v, "image_processor", "PixtralImageProcessor size.longest_edge",
            "{kind: pixtral, longest_edge: %llu}", ULL(longest));
    return 0;
}

int imp_hf_preprocessor(imp_spec *s, const char *buf, size_t len, const char *name,
                        const char *top, mm_error *err)
{
    mm_node *root = mm_json_parse(buf, len, name, err);
    if (!root)
        return -1;
    imp_source(s, name, buf, len);
    hfc p;
    hfc_init(&p, s, root, "", name, err);
    char type[64];
    imp_section *v = imp_module(s, "vision");
    int rc = hf_str(&p, "image_processor_type", "", type, sizeof type);
    if (!rc && !strcmp(top, "qwen2_vl")) rc = dynamic(&p, v);
    else if (!rc && (!strcmp(top, "qwen2_5_vl") || !strncmp(top, "qwen3_vl", 8))) rc = dynamic(&p, v);
    else if (!rc && !strcmp(top, "internvl")) rc = tiles(&p, v, type);
    else if (!rc && !strcmp(top, "llava_onevision") && hf_node(&p, "image_grid_pinpoints"))
        rc = anyres(&p, s, v);
    else if (!rc && (!strcmp(top, "idefics3") || !strcmp(top, "smolvlm"))) rc = split(&p, v);
    else if (!rc && !strncmp(type, "PixtralImageProcessor", 21)) rc = pixtral(&p, v);
    else if (!rc && !strcmp(top, "mllama")) {
        uint64_t t;
        rc = hf_u64(&p, "max_image_tiles", 4, &t);
        if (!rc)
            imp_set(v, "max_num_tiles", "preprocessor max_image_tiles", "%llu", ULL(t));
    } else if (!rc && !strcmp(top, "gemma3")) {
        int pas;
        rc = hf_bool(&p, "do_pan_and_scan", 0, &pas);
        if (!rc && pas)
            rc = hf_fail(&p, "do_pan_and_scan", "pan-and-scan crops are not modelled");
    }
    for (size_t i = 0; !rc && i < root->n && i < sizeof p.used; i++)
        if (!p.used[i] && only_preprocessing(root->keys[i]))
            p.used[i] = 1;
    if (!rc)
        rc = hf_finish(&p);
    mm_node_free(root);
    return rc;
}
