/* import_hf_txt.c - a Hugging Face text config -> the decoder module.
 * Defaults are the transformers 5.17 config classes' (LlamaConfig,
 * Qwen2Config, Qwen3Config, Qwen3MoeConfig, MixtralConfig, Qwen2MoeConfig,
 * Gemma3TextConfig, MllamaTextConfig and the Qwen-VL text configs), used
 * when config.json leaves a key out. */
#include "import_hf.h"

#include <stdio.h>
#include <string.h>

typedef struct text_class {
    const char *model_type;
    const char *family;
    uint64_t hidden, inter, layers, heads, kv, vocab, head_dim; /* kv 0 = heads */
    int tie;
} text_class;

static const text_class text_classes[] = {
    {"llama", "llama", 4096, 11008, 32, 32, 0, 32000, 0, 0},
    {"mistral", "llama", 4096, 14336, 32, 32, 8, 32000, 128, 0},
    {"qwen2", "qwen2", 4096, 22016, 32, 32, 32, 151936, 0, 0},
    {"qwen3", "qwen3", 4096, 22016, 32, 32, 32, 151936, 128, 0},
    {"qwen3_moe", "qwen3_moe", 2048, 6144, 24, 32, 4, 151936, 128, 0},
    {"mixtral", "mixtral", 4096, 14336, 32, 32, 8, 32000, 0, 0},
    {"qwen2_moe", "qwen2_moe", 2048, 5632, 24, 16, 16, 151936, 0, 0},
    {"gemma3_text", "gemma3", 2304, 9216, 26, 8, 4, 262208, 256, 1},
    {"mllama_text_model", "mllama", 4096, 14336, 40, 32, 8, 128256, 0, 0},
    {"qwen2_vl_text", "qwen2_vl", 8192, 29568, 80, 64, 8, 152064, 0, 0},
    {"qwen2_5_vl_text", "qwen2_vl", 8192, 29568, 80, 64, 8, 152064, 0, 0},
    {"qwen3_vl_text", "qwen3_vl", 4096, 22016, 32, 32, 32, 151936, 128, 0},
    {"qwen3_vl_moe_text", "qwen3_moe", 2048, 5632, 24, 16, 16, 151936, 128, 1},
};

const char *hf_text_family(const char *model_type)
{
    for (size_t i = 0; i < sizeof text_classes / sizeof text_classes[0]; i++)
        if (strcmp(text_classes[i].model_type, model_type) == 0)
            return text_classes[i].family;
    return NULL;
}

static int geometry(hfc *h, const text_class *tc, imp_section *m)
{
    char w[128];
    uint64_t hs, in, L, a, kv, V, hd;
    if (hf_u64(h, "hidden_size", tc->hidden, &hs) || hf_u64(h, "intermediate_size", tc->inter, &in) ||
        hf_u64(h, "num_hidden_layers", tc->layers, &L) ||
        hf_u64(h, "num_attention_heads", tc->heads, &a) ||
        hf_u64(h, "num_key_value_heads", tc->kv ? tc->kv : a, &kv) ||
        hf_u64(h, "vocab_size", tc->vocab, &V) || hf_u64(h, "head_dim", tc->head_dim, &hd))
        return -1;
    imp_set(m, "hidden_size", hf_where(h, "hidden_size", w, sizeof w), "%llu", (unsigned long long)hs);
    imp_set(m, "num_hidden_layers", hf_where(h, "num_hidden_layers", w, sizeof w), "%llu",
            (unsigned long long)L);
    imp_set(m, "num_attention_heads", hf_where(h, "num_attention_heads", w, sizeof w), "%llu",
            (unsigned long long)a);
    imp_set(m, "num_key_value_heads", hf_where(h, "num_key_value_heads", w, sizeof w), "%llu",
            (unsigned long long)kv);
    if (hd)
        imp_set(m, "head_dim", hf_where(h, "head_dim", w, sizeof w), "%llu", (unsigned long long)hd);
    imp_set(m, "intermediate_size", hf_where(h, "intermediate_size", w, sizeof w), "%llu",
            (unsigned long long)in);
    imp_set(m, "vocab_size", hf_where(h, "vocab_size", w, sizeof w), "%llu", (unsigned long long)V);
    return 0;
}

/* layer_types, or sliding_window_pattern (Gemma), or use_sliding_window with
 * max_window_layers (Qwen2), or a sliding_window that applies everywhere
 * (Mistral, Mixtral) */
static int sliding(hfc *h, const text_class *tc, imp_section *m)
{
    char w[128];
    uint64_t win = 0, L = 0, pattern = 0, maxw = 0;
    int use = 1;
    const mm_node *lt = hf_node(h, "layer_types");
    if (hf_u64(h, "sliding_window", strcmp(tc->family, "gemma3") ? 0 : 4096, &win) ||
        hf_bool(h, "use_sliding_window", !strcmp(tc->family, "llama") ||
                                             !strcmp(tc->family, "mixtral") ||
                                             !strcmp(tc->family, "gemma3"), &use) ||
        hf_u64(h, "sliding_window_pattern", strcmp(tc->family, "gemma3") ? 0 : 6, &pattern) ||
        hf_u64(h, "max_window_layers", 0, &maxw))
        return -1;
    hf_mark(h, "_sliding_window_pattern");
    key_parse_u64(imp_get(m, "num_hidden_layers"), &L);
    if (!use || !win)
        return 0;
    imp_set(m, "sliding_window", hf_where(h, "sliding_window", w, sizeof w), "%llu",
            (unsigned long long)win);
    if (lt && lt->type == MM_NODE_SEQ) {
        char buf[600] = "[";
        size_t o = 1;
        for (size_t i = 0; i < lt->n && o + 24 < sizeof buf; i++)
            o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", i ? ", " : "",
                                  lt->vals[i]->type == MM_NODE_SCALAR ? lt->vals[i]->str : "?");
        snprintf(buf + o, sizeof buf - o, "]");
        imp_set(m, "layer_types", hf_where(h, "layer_types", w, sizeof w), "%s", buf);
        return 0;
    }
    if (pattern) {
        imp_set(m, "sliding_window_pattern", hf_where(h, "sliding_window_pattern", w, sizeof w),
                "%llu", (unsigned long long)pattern);
        return 0;
    }
    char buf[600] = "[";
    size_t o = 1;
    for (uint64_t i = maxw; i < L && o + 8 < sizeof buf; i++)
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%llu", i > maxw ? ", " : "",
                              (unsigned long long)i);
    snprintf(buf + o, sizeof buf - o, "]");
    imp_set(m, "sliding_layers", "use_sliding_window from max_window_layers", "%s", buf);
    return 0;
}

static int moe(hfc *h, const text_class *tc, imp_section *m)
{
    char w[128], only[600];
    uint64_t E = 0, k = 0, I = 0, sh = 0, step = 1, L = 0;
    size_t nonly;
    int is_moe = !strcmp(tc->family, "qwen3_moe") || !strcmp(tc->family, "mixtral") ||
                 !strcmp(tc->family, "qwen2_moe");
    if (!is_moe)
        return 0;
    const char *ekey = hf_node(h, "num_local_experts") ? "num_local_experts" : "num_experts";
    uint64_t defE = !strcmp(tc->family, "mixtral") ? 8 : !strcmp(tc->family, "qwen2_moe") ? 60 : 128;
    if (hf_u64(h, ekey, defE, &E) ||
        hf_u64(h, "num_experts_per_tok", !strcmp(tc->family, "mixtral") ? 2 : tc->kv == 16 ? 4 : 8,
               &k) ||
        hf_u64(h, "moe_intermediate_size", 0, &I) ||
        hf_u64(h, "shared_expert_intermediate_size", 0, &sh) ||
        hf_u64(h, "decoder_sparse_step", 1, &step) || hf_list(h, "mlp_only_layers", only, sizeof only, &nonly))
        return -1;
    hf_mark(h, "num_experts");
    hf_mark(h, "num_local_experts");
    imp_set(m, "num_experts", hf_where(h, ekey, w, sizeof w), "%llu", (unsigned long long)E);
    imp_set(m, "num_experts_per_tok", hf_where(h, "num_experts_per_tok", w, sizeof w), "%llu",
            (unsigned long long)k);
    if (I)
        imp_set(m, "moe_intermediate_size", hf_where(h, "moe_intermediate_size", w, sizeof w),
                "%llu", (unsigned long long)I);
    if (!strcmp(tc->model_type, "qwen3_vl_moe_text")) /* not in peft's v4 -> v5 MoE conversion */
        imp_set(m, "lora_targets_experts", "qwen3_vl_moe: PEFT's all-linear leaves its experts "
                "alone (transformers conversion_mapping.py has no v4 layout for it)", "false");
    if (sh)
        imp_set(m, "shared_expert_intermediate_size",
                hf_where(h, "shared_expert_intermediate_size", w, sizeof w), "%llu",
                (unsigned long long)sh);
    key_parse_u64(imp_get(m, "num_hidden_layers"), &L);
    if (nonly || step > 1) { /* dense where listed, or where (i + 1) % step != 0 */
        char buf[600] = "[";
        size_t o = 1;
        int first = 1;
        for (uint64_t i = 0; i < L && o + 8 < sizeof buf; i++) {
            char num[24];
            snprintf(num, sizeof num, "%llu", (unsigned long long)i);
            int listed = nonly && strstr(only, num) != NULL; /* exact match below */
            if (listed) {
                listed = 0;
                for (const char *p = only; (p = strstr(p, num)); p++)
                    if ((p == only || p[-1] == '[' || p[-1] == ' ') &&
                        (p[strlen(num)] == ',' || p[strlen(num)] == ']'))
                        listed = 1;
            }
            if (listed || (i + 1) % step) {
                o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%s", first ? "" : ", ", num);
                first = 0;
            }
        }
        snprintf(buf + o, sizeof buf - o, "]");
        imp_set(m, "dense_layers", "mlp_only_layers / decoder_sparse_step", "%s", buf);
    }
    int aux = 0;
    if (hf_bool(h, "output_router_logits", 0, &aux))
        return -1;
    if (aux)
        imp_set(m, "output_router_logits", hf_where(h, "output_router_logits", w, sizeof w), "true");
    double jitter;
    if (hf_f64(h, "router_jitter_noise", 0, &jitter))
        return -1;
    if (jitter > 0)
        return hf_fail(h, "router_jitter_noise", "router jitter is not modelled");
    return 0;
}

static int checks(hfc *h)
{
    uint64_t tp;
    if (hf_u64(h, "pretraining_tp", 1, &tp))
        return -1;
    if (tp != 1)
        return hf_fail(h, "pretraining_tp", "only 1 is modelled");
    static const char *const caps[] = {"final_logit_softcapping", "attn_logit_softcapping"};
    for (size_t i = 0; i < 2; i++) {
        if (hf_node(h, caps[i]))
            return hf_fail(h, caps[i], "logit soft-capping is not modelled");
    }
    int bi;
    if (hf_bool(h, "use_bidirectional_attention", 0, &bi))
        return -1;
    if (bi)
        return hf_fail(h, "use_bidirectional_attention", "only causal language models");
    return 0;
}

int imp_hf_text(hfc *h, const char *model_type, int top_tie, imp_spec *s)
{
    const text_class *tc = NULL;
    for (size_t i = 0; i < sizeof text_classes / sizeof text_classes[0]; i++)
        if (strcmp(text_classes[i].model_type, model_type) == 0)
            tc = &text_classes[i];
    if (!tc)
        return hf_fail(h, "model_type", "'%s' is not a language model mmguard describes "
                                        "(llama, mistral, qwen2, qwen3, qwen3_moe, mixtral, "
                                        "qwen2_moe, gemma3_text, ...)", model_type);
    hf_mark(h, "model_type");
    imp_section *m = imp_module(s, "decoder");
    char w[128], act[64];
    imp_set(m, "family", h->path[0] ? hf_where(h, "model_type", w, sizeof w) : "model_type", "%s",
            tc->family);
    if (geometry(h, tc, m))
        return -1;
    if (hf_str(h, strcmp(tc->family, "gemma3") ? "hidden_act" : "hidden_activation",
               strcmp(tc->family, "gemma3") ? "silu" : "gelu_pytorch_tanh", act, sizeof act))
        return -1;
    hf_mark(h, "hidden_act");
    imp_set(m, "hidden_act", "hidden_act", "%s", act);
    int tie = tc->tie, ab = 0, mb = 0;
    if (hf_bool(h, "tie_word_embeddings", tc->tie, &tie) || hf_bool(h, "attention_bias", 0, &ab) ||
        hf_bool(h, "mlp_bias", 0, &mb))
        return -1;
    if (top_tie >= 0)
        tie = top_tie;
    imp_set(m, "tie_word_embeddings", "tie_word_embeddings", "%s", tie ? "true" : "false");
    if (ab)
        imp_set(m, "attention_bias", hf_where(h, "attention_bias", w, sizeof w), "true");
    if (mb)
        imp_set(m, "mlp_bias", hf_where(h, "mlp_bias", w, sizeof w), "true");
    if (!strcmp(tc->family, "mllama")) {
        char cross[600];
        size_t n;
        uint64_t V;
        if (hf_list(h, "cross_attention_layers", cross, sizeof cross, &n))
            return -1;
        imp_set(m, "cross_attention_layers", hf_where(h, "cross_attention_layers", w, sizeof w),
                "%s", n ? cross : "[3, 8, 13, 18, 23, 28, 33, 38]");
        key_parse_u64(imp_get(m, "vocab_size"), &V);
        imp_set(m, "embedding_rows", "MllamaTextModel: vocab_size + 8", "%llu",
                (unsigned long long)(V + 8));
    }
    /* the language model's own use_cache (a VLM's text_config): transformers
     * keeps a KV cache through a training forward unless checkpointing is on */
    int uc = 1;
    if (hf_bool(h, "use_cache", 1, &uc))
        return -1;
    if (uc)
        imp_set(&s->training, "use_cache", hf_node(h, "use_cache") ? hf_where(h, "use_cache", w,
                sizeof w) : "use_cache (its default, true): a KV cache fills in the forward "
                "unless gradient checkpointing is on or the training code sets it false", "true");
    if (sliding(h, tc, m) || moe(h, tc, m) || checks(h))
        return -1;
    return 0;
}
