/* import_hf.h - the parts of the Hugging Face config reader (import_hf*.c). */
#ifndef MM_IMPORT_HF_H
#define MM_IMPORT_HF_H

#include "hf.h"
#include "keys.h"

/* decoder module from a text config (or the top level of older Qwen-VL files);
 * top_tie: the top-level tie_word_embeddings of a VLM, -1 when absent */
int imp_hf_text(hfc *h, const char *model_type, int top_tie, imp_spec *s);
const char *hf_text_family(const char *model_type);
/* vision module and connector of a VLM (import_hf_vis.c) */
int imp_hf_vision(hfc *top, hfc *v, const char *top_type, imp_spec *s);
/* a pre-quantized checkpoint's quantization_config at the top level of
 * config.json (import_hf_quant.c); vlm: the config has a vision tower */
int imp_hf_quant(hfc *top, imp_spec *s, int vlm);
/* image processor from preprocessor_config.json (import_hf_vis.c) */
int imp_hf_preprocessor(imp_spec *s, const char *buf, size_t len, const char *name,
                        const char *top_type, mm_error *err);

#endif
