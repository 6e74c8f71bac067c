/* import_hf_quant.c (layer import) - the quantization_config of a Hugging
 * Face config.json: a checkpoint saved already quantized.  transformers loads
 * it with the saved settings (modeling_utils.py from_pretrained: a config's
 * quantization_config wins over none passed; quantizers/auto.py picks the
 * quantizer by quant_method), so it is the base a LoRA job trains on.
 *   - bitsandbytes 4/8-bit: what modules[].quantization describes (QLoRA's
 *     Linear4bit / Linear8bitLt on the decoder's Linears), mapped onto the
 *     language model; transformers leaves the output head unconverted
 *     (integrations/bitsandbytes.py get_keys_to_not_convert), as the spec does.
 *   - every other method (GPTQ, AWQ, AQLM, HQQ, FP8, compressed-tensors, ...)
 *     is refused: their packed weights, scales and dequantization buffers are
 *     not bitsandbytes', and nothing in the spec says them. */
#include "import_hf.h"
#include "import_rd.h"

#include <stdio.h>
#include <string.h>

/* the keys of BitsAndBytesConfig.to_dict() (transformers utils/quantization_config.py)
 * that change nothing the spec counts, and why */
static const imp_rule bnb_rules[] = {
    {"llm_int8_threshold", 'i', "LLM.int8()'s outlier threshold: a value"},
    {"llm_int8_enable_fp32_cpu_offload", 'i', "offloads modules the device_map puts on the "
                                              "CPU, which a training job on GPUs has none of"},
    {"bnb_4bit_quant_storage", 'i', "the packed weights' storage dtype: the same bytes"},
    {"_load_in_4bit", 'i', "a copy of load_in_4bit"},
    {"_load_in_8bit", 'i', "a copy of load_in_8bit"},
};

static int bnb_skip(hfc *q)
{
    const mm_node *sk = hf_node(q, "llm_int8_skip_modules");
    if (!sk || sk->is_null)
        return 0;
    if (sk->type != MM_NODE_SEQ)
        return hf_fail(q, "llm_int8_skip_modules", "expected a list of module names");
    for (size_t i = 0; i < sk->n; i++)
        if (sk->vals[i]->type != MM_NODE_SCALAR || !sk->vals[i]->str ||
            strcmp(sk->vals[i]->str, "lm_head"))
            return hf_fail(q, "llm_int8_skip_modules", "only [lm_head] is modelled (the output "
                                                       "head transformers never converts): a "
                                                       "decoder Linear left in 16 bits is not");
    return 0;
}

/* the 4-bit compute dtype: Linear4bit casts its input to it (bitsandbytes
 * nn/modules.py Linear4bit.forward), so only the training precision is modelled */
static int bnb_compute(hfc *q, imp_spec *s)
{
    char cd[64];
    if (hf_str(q, "bnb_4bit_compute_dtype", "float32", cd, sizeof cd))
        return -1;
    if (strcmp(cd, "bfloat16") && strcmp(cd, "float16"))
        return hf_fail(q, "bnb_4bit_compute_dtype", "'%s': the quantized Linears would compute "
                                                    "in it; only a 16-bit one (the training "
                                                    "precision) is modelled", cd);
    imp_note(s, "assumed training.precision is quantization_config.bnb_4bit_compute_dtype (%s): "
                "the dequantized weights and the Linears' outputs are in it", cd);
    return 0;
}

static int bnb(hfc *q, imp_spec *s, int vlm)
{
    int b4, b8, dq, fp16w;
    char qt[64];
    if (hf_bool(q, "load_in_4bit", 0, &b4) || hf_bool(q, "load_in_8bit", 0, &b8) ||
        hf_bool(q, "bnb_4bit_use_double_quant", 0, &dq) ||
        hf_bool(q, "llm_int8_has_fp16_weight", 0, &fp16w) ||
        hf_str(q, "bnb_4bit_quant_type", "fp4", qt, sizeof qt) || bnb_skip(q))
        return -1;
    if (b4 == b8)
        return hf_fail(q, b4 ? "load_in_8bit" : "load_in_4bit",
                       "expected exactly one of load_in_4bit and load_in_8bit");
    if (vlm)
        return hf_fail(q, "quant_method", "a quantized vision-language checkpoint: which of the "
                                          "vision tower's Linears bitsandbytes converted is not "
                                          "mapped (quantize the language model in the spec: "
                                          "modules[].quantization)");
    if (b8 && fp16w)
        return hf_fail(q, "llm_int8_has_fp16_weight", "true keeps 16-bit weights beside the "
                                                      "int8 ones: not modelled");
    if (b4 && strcmp(qt, "nf4") && strcmp(qt, "fp4"))
        return hf_fail(q, "bnb_4bit_quant_type", "expected nf4 or fp4, got '%s'", qt);
    if (b4 && bnb_compute(q, s))
        return -1;
    if (b8)
        hf_mark(q, "bnb_4bit_compute_dtype"); /* to_dict() writes it for 8-bit too */
    imp_set(imp_module(s, "decoder"), "quantization",
            "quantization_config (bitsandbytes, a pre-quantized checkpoint)", "{bits: %d%s%s%s}",
            b4 ? 4 : 8, b4 ? ", quant_type: " : "", b4 ? qt : "",
            b4 && dq ? ", double_quant: true" : "");
    return 0;
}

int imp_hf_quant(hfc *top, imp_spec *s, int vlm)
{
    const mm_node *n = hf_node(top, "quantization_config");
    if (!n || n->is_null)
        return 0;
    hfc q;
    char method[64];
    hfc_init(&q, s, n, "quantization_config", top->file, top->err);
    if (n->type != MM_NODE_MAP)
        return hf_fail(top, "quantization_config", "expected a map");
    if (hf_str(&q, "quant_method", "", method, sizeof method))
        return -1;
    if (strcmp(method, "bitsandbytes"))
        return hf_fail(&q, "quant_method", "'%s'-quantized bases are not modelled: "
                                           "modules[].quantization describes bitsandbytes 4/8-bit "
                                           "only (other methods pack weights, scales and "
                                           "dequantization buffers differently)",
                       method[0] ? method : "(none)");
    if (bnb(&q, s, vlm))
        return -1;
    return imp_rules_finish(&q, bnb_rules, sizeof bnb_rules / sizeof bnb_rules[0],
                            "quantization_config");
}
