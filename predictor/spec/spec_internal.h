/* spec_internal.h - the pieces of the spec decoder (spec*.c) that call each
 * other.  Not part of the public API. */
#ifndef MM_SPEC_INTERNAL_H
#define MM_SPEC_INTERNAL_H

#include "keys.h"
#include "spec.h"

/* a module kind's name in messages ("vision", "connector", "decoder"): here,
 * below every decoder file, so spec_parts.c and spec_links.c need not call
 * back into spec_module.c for it */
static inline const char *spec_kind_name(mod_kind k)
{
    static const char *const n[MOD_NKIND] = {"vision", "connector", "decoder"};
    return k < MOD_NKIND ? n[k] : "?";
}

/* spec_module.c */
int spec_decode_module(dctx *c, const mm_node *m, size_t idx, module_spec *ms);
/* spec_parts.c: nested maps of a module and its own checks */
int spec_lora(dctx *c, const mm_node *v, module_spec *ms, const char *prefix);
int spec_quantization(dctx *c, const mm_node *v, module_spec *ms, const char *prefix);
int spec_image_processor(dctx *c, const mm_node *v, module_spec *ms, const char *prefix);
int spec_sliding_pattern(dctx *c, const mm_node *v, module_spec *ms, const char *prefix);
int spec_layer_types(dctx *c, const mm_node *v, module_spec *ms, const char *prefix);
int spec_validate_module(dctx *c, const mm_node *m, module_spec *ms);
/* spec_train.c: the sections after modules */
int spec_decode_training(dctx *c, const mm_node *root, mm_spec *s);
int spec_decode_sections(dctx *c, const mm_node *root, mm_spec *s);
/* spec_liger.c: training.liger_kernel (after the modules: the model decides what Liger patches) */
int spec_liger(dctx *c, const mm_node *tr, mm_spec *s);
/* spec_refs.c: hf_config / deepspeed / trainer / llamafactory files */
int spec_is_ref_key(const char *key);
int spec_resolve_refs(mm_spec *s, mm_error *err);
/* spec_links.c: checks between modules and the training section */
int spec_check_links(dctx *c, const mm_node *root, mm_spec *s);
/* spec_tp.c: training.tensor_parallel against what the TP model covers */
int spec_check_tp(dctx *c, const mm_node *root, const mm_spec *s);
/* training.video_frames and a frame's bounds (spec_video.c) */
int spec_check_video(dctx *c, const mm_node *root, const mm_spec *s);

#endif
