/* hf.c - typed reading of a Hugging Face config map (see hf.h) and the
 * table of keys that do not change training memory, each with its reason. */
#include "hf.h"
#include "keys.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hfc_init(hfc *h, imp_spec *s, const mm_node *map, const char *path, const char *file,
              mm_error *err)
{
    memset(h, 0, sizeof *h);
    h->s = s;
    h->map = map && map->type == MM_NODE_MAP ? map : NULL;
    mm_strlcpy(h->path, path, sizeof h->path);
    h->file = file;
    h->err = err;
}

const char *hf_where(const hfc *h, const char *key, char *buf, size_t n)
{
    snprintf(buf, n, "%s%s%s", h->path, h->path[0] ? "." : "", key);
    return buf;
}

static int index_of(const hfc *h, const char *key)
{
    if (!h->map)
        return -1;
    for (size_t i = 0; i < h->map->n && i < sizeof h->used; i++)
        if (strcmp(h->map->keys[i], key) == 0)
            return (int)i;
    return -1;
}

void hf_mark(hfc *h, const char *key)
{
    int i = index_of(h, key);
    if (i >= 0)
        h->used[i] = 1;
}

const mm_node *hf_node(hfc *h, const char *key)
{
    int i = index_of(h, key);
    if (i < 0)
        return NULL;
    h->used[i] = 1;
    const mm_node *v = h->map->vals[i];
    return v->type == MM_NODE_SCALAR && v->is_null ? NULL : v;
}

int hf_fail(hfc *h, const char *key, const char *fmt, ...)
{
    char what[512], where[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    int i = index_of(h, key);
    int line = i >= 0 ? h->map->key_line[i] : h->map ? h->map->line : 0;
    int col = i >= 0 ? h->map->key_col[i] : h->map ? h->map->col : 0;
    mm_err_at(h->err, h->file, line, col, "%s: %s", hf_where(h, key, where, sizeof where), what);
    return -1;
}

int hf_u64(hfc *h, const char *key, uint64_t def, uint64_t *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    if (v->type != MM_NODE_SCALAR || v->quoted || key_parse_u64(v->str, out))
        return hf_fail(h, key, "expected a non-negative integer");
    return 0;
}

int hf_i64(hfc *h, const char *key, int64_t def, int64_t *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    uint64_t u;
    int neg = v->type == MM_NODE_SCALAR && v->str[0] == '-';
    if (v->type != MM_NODE_SCALAR || v->quoted || key_parse_u64(v->str + neg, &u) || u > (1u << 30))
        return hf_fail(h, key, "expected an integer");
    *out = neg ? -(int64_t)u : (int64_t)u;
    return 0;
}

int hf_bool(hfc *h, const char *key, int def, int *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    if (v->type == MM_NODE_SCALAR && !v->quoted && (!strcmp(v->str, "true") || !strcmp(v->str, "True")))
        *out = 1;
    else if (v->type == MM_NODE_SCALAR && !v->quoted &&
             (!strcmp(v->str, "false") || !strcmp(v->str, "False")))
        *out = 0;
    else
        return hf_fail(h, key, "expected true or false");
    return 0;
}

int hf_f64(hfc *h, const char *key, double def, double *out)
{
    const mm_node *v = hf_node(h, key);
    *out = def;
    if (!v)
        return 0;
    char *end;
    errno = 0;
    double d = v->type == MM_NODE_SCALAR && !v->quoted ? strtod(v->str, &end) : NAN;
    if (v->type != MM_NODE_SCALAR || v->quoted || *end || errno || !isfinite(d))
        return hf_fail(h, key, "expected a number");
    *out = d;
    return 0;
}

int hf_str(hfc *h, const char *key, const char *def, char *out, size_t n)
{
    const mm_node *v = hf_node(h, key);
    mm_strlcpy(out, def ? def : "", n);
    if (!v)
        return 0;
    if (v->type != MM_NODE_SCALAR)
        return hf_fail(h, key, "expected a string");
    for (const char *p = v->str; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("_-./", *p))
            return hf_fail(h, key, "unexpected characters in '%s'", v->str);
    mm_strlcpy(out, v->str, n);
    return 0;
}

int hf_u64_or_pair(hfc *h, const char *key, uint64_t def, uint64_t *out)
{
    int i = index_of(h, key);
    const mm_node *v = i >= 0 ? h->map->vals[i] : NULL;
    if (v && v->type == MM_NODE_SEQ) {
        h->used[i] = 1;
        if (v->n != 2 || v->vals[0]->type != MM_NODE_SCALAR ||
            key_parse_u64(v->vals[0]->str, out) || strcmp(v->vals[0]->str, v->vals[1]->str))
            return hf_fail(h, key, "expected a size or a square [size, size]");
        return 0;
    }
    return hf_u64(h, key, def, out);
}

int hf_list(hfc *h, const char *key, char *out, size_t n, size_t *count)
{
    const mm_node *v = hf_node(h, key);
    *out = '\0';
    *count = 0;
    if (!v)
        return 0;
    if (v->type != MM_NODE_SEQ)
        return hf_fail(h, key, "expected a list of integers");
    size_t o = 0;
    o += (size_t)snprintf(out + o, n - o, "[");
    for (size_t i = 0; i < v->n && o < n; i++) {
        uint64_t u;
        if (v->vals[i]->type != MM_NODE_SCALAR || key_parse_u64(v->vals[i]->str, &u))
            return hf_fail(h, key, "expected a list of integers");
        o += (size_t)snprintf(out + o, n - o, "%s%llu", i ? ", " : "", (unsigned long long)u);
    }
    if (o < n)
        snprintf(out + o, n - o, "]");
    *count = v->n;
    return 0;
}

/* ---- keys that do not change training memory ------------------------------------ */

struct ignored {
    const char *key;
    const char *why;
};
static const struct ignored ignored_keys[] = {
    {"architectures", "metadata"}, {"model_type", "read to pick the family"},
    {"transformers_version", "the version that saved the file, not the one training"},
    {"_name_or_path", "metadata"}, {"_commit_hash", "metadata"}, {"auto_map", "metadata"},
    {"torch_dtype", "the checkpoint dtype: training.precision decides"},
    {"dtype", "the checkpoint dtype: training.precision decides"},
    {"use_bfloat16", "the checkpoint dtype: training.precision decides"},
    {"_attn_implementation_autoset", "metadata"},
    {"bos_token_id", "a token id"}, {"eos_token_id", "a token id"}, {"pad_token_id", "a token id"},
    {"sep_token_id", "a token id"}, {"decoder_start_token_id", "a token id"},
    {"image_token_id", "a token id"}, {"image_token_index", "a token id"},
    {"video_token_id", "a token id"}, {"video_token_index", "a token id"},
    {"vision_start_token_id", "a token id"}, {"vision_end_token_id", "a token id"},
    {"vision_token_id", "a token id"}, {"boi_token_index", "a token id"},
    {"eoi_token_index", "a token id"}, {"ignore_index", "a label value"},
    {"image_seq_length", "derived from the image geometry"},
    {"initializer_range", "initialisation"}, {"initializer_factor", "initialisation"},
    {"rms_norm_eps", "numerics"}, {"layer_norm_eps", "numerics"}, {"norm_eps", "numerics"},
    {"rope_theta", "rotary frequencies are values, computed per batch"},
    {"rope_scaling", "rotary frequencies are values, computed per batch"},
    {"rope_parameters", "rotary frequencies are values, computed per batch"},
    {"rope_local_base_freq", "rotary frequencies are values, computed per batch"},
    {"max_position_embeddings", "no position table (rotary)"},
    {"cache_implementation", "the generation cache is off in training"},
    {"output_attentions", "an inference option"}, {"output_hidden_states", "an inference option"},
    {"return_dict", "an inference option"}, {"output_scores", "an inference option"},
    {"return_dict_in_generate", "an inference option"}, {"torchscript", "an export option"},
    {"tie_encoder_decoder", "not an encoder-decoder"}, {"is_encoder_decoder", "checked: false"},
    {"is_decoder", "metadata"}, {"add_cross_attention", "metadata"},
    {"cross_attention_hidden_size", "metadata"}, {"chunk_size_feed_forward", "0 (no chunking)"},
    {"problem_type", "metadata"}, {"finetuning_task", "metadata"}, {"id2label", "metadata"},
    {"label2id", "metadata"}, {"num_labels", "metadata"}, {"prefix", "metadata"},
    {"pruned_heads", "metadata"}, {"tokenizer_class", "metadata"},
    {"task_specific_params", "metadata"}, {"tf_legacy_loss", "metadata"},
    {"remove_invalid_values", "a generation setting"}, {"temperature", "a generation setting"},
    {"top_k", "a generation setting"}, {"top_p", "a generation setting"},
    {"typical_p", "a generation setting"}, {"num_beams", "a generation setting"},
    {"num_beam_groups", "a generation setting"}, {"num_return_sequences", "a generation setting"},
    {"repetition_penalty", "a generation setting"}, {"length_penalty", "a generation setting"},
    {"no_repeat_ngram_size", "a generation setting"},
    {"encoder_no_repeat_ngram_size", "a generation setting"},
    {"bad_words_ids", "a generation setting"}, {"begin_suppress_tokens", "a generation setting"},
    {"suppress_tokens", "a generation setting"}, {"diversity_penalty", "a generation setting"},
    {"do_sample", "a generation setting"}, {"early_stopping", "a generation setting"},
    {"max_length", "a generation setting"}, {"min_length", "a generation setting"},
    {"exponential_decay_length_penalty", "a generation setting"},
    {"forced_bos_token_id", "a generation setting"}, {"forced_eos_token_id", "a generation setting"},
    {"drop_path_rate", "stochastic depth keeps one scalar per sample"},
    {"tokens_per_second", "video timing, not sizes"},
    {"spatial_patch_size", "the same as patch_size"},
    {"projection_dim", "the vision model has no projection head here"},
    {"router_aux_loss_coef", "a loss weight"},
    {"norm_topk_prob", "renormalises the top-k weights in place"},
    {"query_pre_attn_scalar", "the attention scale, a value"},
    {"pretraining_tp", "checked: 1"}, {"max_window_layers", "read with use_sliding_window"},
    {"template", "a chat template name"}, {"system_message", "a chat template"},
    {"ps_version", "pixel-shuffle variant: the same sizes"}, {"pad2square", "preprocessing"},
    {"image_fold", "preprocessing"}, {"use_flash_attn", "training.attention decides"},
    {"use_backbone_lora", "LoRA is set in the spec (lora:)"},
    {"use_llm_lora", "LoRA is set in the spec (lora:)"},
    {"vision_aspect_ratio", "read with the image processor"},
    {"use_absolute_position_embeddings", "read with the vision family"},
    {"use_mask_token", "masked image modelling, unused in training here"},
    {"image_seq_len", "derived from the image geometry"},
};

static const char *ignored_why(const char *key)
{
    for (size_t i = 0; i < sizeof ignored_keys / sizeof ignored_keys[0]; i++)
        if (strcmp(ignored_keys[i].key, key) == 0)
            return ignored_keys[i].why;
    return NULL;
}

static const char *const dropouts[] = {"attention_dropout", "dropout", "hidden_dropout",
                                       "hidden_dropout_prob", "attention_probs_dropout_prob",
                                       "projection_dropout", "resid_pdrop", "embd_pdrop",
                                       "attn_pdrop", NULL};

/* dropout probabilities: 0 changes nothing; > 0 would add masks we do not model */
static int dropout_key(hfc *h, size_t i)
{
    for (size_t k = 0; dropouts[k]; k++) {
        if (strcmp(h->map->keys[i], dropouts[k]))
            continue;
        double d;
        h->used[i] = 0;
        if (hf_f64(h, dropouts[k], 0, &d))
            return -1;
        if (d > 0)
            return hf_fail(h, dropouts[k], "dropout %g in training is not modelled (its masks); "
                                           "set it to 0", d);
        return 1;
    }
    return 0;
}

int hf_finish(hfc *h)
{
    if (!h->map)
        return 0;
    char where[160];
    for (size_t i = 0; i < h->map->n && i < sizeof h->used; i++) {
        if (h->used[i])
            continue;
        const char *key = h->map->keys[i];
        int dk = dropout_key(h, i);
        if (dk < 0)
            return -1;
        if (dk)
            continue; /* 0: no dropout */
        const char *why = ignored_why(key);
        const mm_node *val = h->map->vals[i];
        if (!why && val->type == MM_NODE_SCALAR && val->is_null)
            why = "null (unset)";
        if (why) {
            imp_note(h->s, "ignored %s: %s", hf_where(h, key, where, sizeof where), why);
            continue;
        }
        if (h->s->allow_unknown) {
            imp_note(h->s, "ignored %s: unknown to mmguard (--allow-unknown)",
                     hf_where(h, key, where, sizeof where));
            continue;
        }
        return hf_fail(h, key, "unknown key: mmguard does not know whether it changes memory "
                               "(--allow-unknown lists it and goes on)");
    }
    return 0;
}
