/* import_titan.c (layer import) - a torchtitan job config (TOML, the
 * train_configs of torchtitan before its Python config registry, pytorch/
 * torchtitan @ 238fa995) -> the spec.  torchtitan trains its own Llama 3
 * (torchtitan/models/llama3/model/model.py) with FSDP2: fully_shard on every
 * TransformerBlock, then on the root (torchtitan/models/llama3/infra/
 * parallelize.py apply_fsdp), MixedPrecisionPolicy(param_dtype=
 * mixed_precision_param, reduce_dtype=mixed_precision_reduce) over fp32
 * weights (training.dtype "float32").  Every key of the file is mapped, ignored
 * with why it does not change GPU memory, or refused with why
 * (import_titan_rules.c); the tables are read in import_titan_rules.c too. */
#include "import_rd.h"
#include "import_titan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

/* torchtitan/models/llama3/__init__.py llama3_args (@ 238fa995): dim,
 * n_layers, n_heads, n_kv_heads (0 = n_heads), ffn_dim_multiplier x 10
 * (0 = none), multiple_of, vocab_size (args.py default 128256) */
static const struct flavor {
    const char *name, *catalog;
    uint64_t dim, layers, heads, kv, ffn_x10, multiple_of, vocab;
} flavors[] = {
    {"debugmodel", NULL, 256, 6, 16, 0, 0, 256, 2048},
    {"8B", "meta-llama/Llama-3.1-8B", 4096, 32, 32, 8, 13, 1024, 128256},
    {"70B", NULL, 8192, 80, 64, 8, 13, 4096, 128256},
    {"405B", NULL, 16384, 126, 128, 8, 12, 4096, 128256},
};

/* model.py FeedForward: hidden = int(2 * 4 * dim / 3), times the multiplier,
 * rounded up to multiple_of; 0 on overflow */
static uint64_t ffn_hidden(const struct flavor *f)
{
    uint64_t h, r;
    if (mm_mul(f->dim, 8, &h))
        return 0;
    h /= 3;
    if (f->ffn_x10) { /* int(1.3 * h): exact in decimal tenths */
        if (mm_mul(h, f->ffn_x10, &h))
            return 0;
        h /= 10;
    }
    if (mm_add(h, f->multiple_of - 1, &r))
        return 0;
    return r / f->multiple_of * f->multiple_of;
}

static int titan_flavor(imp_job *j, hfc *h, const struct flavor *f)
{
    char w[160], at[400];
    hf_where(h, "flavor", w, sizeof w);
    imp_where_key(h, "flavor", at, sizeof at);
    if (f->catalog) { /* the catalog's preset has the same shapes (test: check-import) */
        if (imp_model(j, f->catalog, at, h->err))
            return -1;
        imp_note(j->s, "assumed: torchtitan's Llama 3 %s has the shapes of %s (the catalog's "
                       "preset): dim %llu, %llu layers, %llu heads, %llu KV heads, FFN %llu",
                 f->name, f->catalog, ULL(f->dim), ULL(f->layers), ULL(f->heads), ULL(f->kv),
                 ULL(ffn_hidden(f)));
    } else {
        uint64_t ffn = ffn_hidden(f);
        if (!ffn)
            return hf_fail(h, "flavor", "FFN width overflows");
        imp_section *d = imp_module(j->s, "decoder");
        imp_set(d, "family", w, "llama");
        imp_set(d, "hidden_size", w, "%llu", ULL(f->dim));
        imp_set(d, "num_hidden_layers", w, "%llu", ULL(f->layers));
        imp_set(d, "num_attention_heads", w, "%llu", ULL(f->heads));
        imp_set(d, "num_key_value_heads", w, "%llu", ULL(f->kv ? f->kv : f->heads));
        imp_set(d, "intermediate_size", "FeedForward: 8 dim / 3 x ffn_dim_multiplier, rounded "
                                        "up to multiple_of", "%llu", ULL(ffn));
        imp_set(d, "vocab_size", w, "%llu", ULL(f->vocab));
        imp_set(d, "hidden_act", "FeedForward: silu(w1 x) * w3 x", "silu");
        imp_set(d, "tie_word_embeddings", "torchtitan's output Linear is its own", "false");
        j->have_model = 1;
    }
    imp_section *d = imp_find_module(j->s, "decoder");
    if (d)
        imp_set(d, "trainable", "torchtitan trains every parameter", "true");
    imp_note(j->s, "assumed: torchtitan's own Llama 3 (model.py) saves what transformers' "
                   "LlamaModel saves, the module mmguard models");
    return 0;
}

int imp_titan_model(imp_job *j, hfc *h)
{
    char name[64], fl[64];
    if (hf_str(h, "name", "llama3", name, sizeof name) ||
        hf_str(h, "flavor", "debugmodel", fl, sizeof fl))
        return -1;
    if (strcmp(name, "llama3"))
        return hf_fail(h, "name", "'%s': only torchtitan's llama3 flavors are mapped", name);
    const mm_node *c = hf_node(h, "converters");
    if (c && (c->type != MM_NODE_SEQ || c->n))
        return hf_fail(h, "converters", "model converters (float8, MX) are not modelled");
    for (size_t i = 0; i < sizeof flavors / sizeof flavors[0]; i++)
        if (!strcmp(flavors[i].name, fl))
            return titan_flavor(j, h, &flavors[i]);
    return hf_fail(h, "flavor", "'%s' is not mapped (debugmodel, 8B, 70B, 405B are; the _flex "
                                "and _varlen flavors use attention kernels not modelled)", fl);
}

static const char *dtype_of(const char *t)
{
    return !strcmp(t, "bfloat16") ? "bf16" : !strcmp(t, "float32") ? "fp32" : NULL;
}

/* training.*: batch, sequence, dtypes (FSDP's MixedPrecisionPolicy) */
int imp_titan_training(imp_job *j, hfc *h)
{
    uint64_t mb, seq;
    double norm;
    char dt[64], mp[64], mr[64], w[160];
    const char *bkey = mm_node_get(h->map, "batch_size") ? "batch_size" : "local_batch_size";
    if (mm_node_get(h->map, "batch_size") && mm_node_get(h->map, "local_batch_size"))
        return hf_fail(h, "batch_size", "given with local_batch_size (its newer name)");
    if (imp_u64(h, bkey, 8, 1, 1u << 16, &mb) || imp_u64(h, "seq_len", 2048, 1, 1u << 22, &seq) ||
        imp_num(h, "max_norm", 1.0, &norm) || hf_str(h, "dtype", "float32", dt, sizeof dt) ||
        hf_str(h, "mixed_precision_param", "bfloat16", mp, sizeof mp) ||
        hf_str(h, "mixed_precision_reduce", "float32", mr, sizeof mr))
        return -1;
    const char *md = dtype_of(dt), *pd = dtype_of(mp), *rd = dtype_of(mr);
    if (!md || !pd || !rd)
        return hf_fail(h, !md ? "dtype" : !pd ? "mixed_precision_param"
                                               : "mixed_precision_reduce",
                       "expected bfloat16 or float32");
    if (norm < 0)
        return hf_fail(h, "max_norm", "expected a number >= 0");
    j->micro_batch = mb;
    imp_set(&j->s->training, "micro_batch_size", mm_node_get(h->map, bkey)
            ? hf_where(h, bkey, w, sizeof w) : "torchtitan default local_batch_size",
            "%llu", ULL(mb));
    imp_set(&j->s->training, "seq_len", mm_node_get(h->map, "seq_len")
            ? hf_where(h, "seq_len", w, sizeof w) : "torchtitan default seq_len", "%llu", ULL(seq));
    imp_set(&j->s->training, "max_grad_norm", "training.max_norm (clip_grad_norm_)", "%g", norm);
    imp_set(&j->s->training, "precision", "training.mixed_precision_param: the compute dtype",
            "%s", pd);
    imp_set(&j->s->fsdp, "model_dtype", "training.dtype: the sharded weights and AdamW states",
            "%s", md);
    if (strcmp(md, pd))
        imp_set(&j->s->fsdp, "param_dtype", "training.mixed_precision_param "
                                            "(MixedPrecisionPolicy)", "%s", pd);
    imp_set(&j->s->fsdp, "reduce_dtype", "training.mixed_precision_reduce (MixedPrecisionPolicy)",
            "%s", rd);
    imp_set(&j->s->training, "gradient_accumulation_steps", "global_batch_size -1: one "
                                                            "micro-batch a step", "1");
    return 0;
}

/* parallelism.*: FSDP2 only; HSDP, TP, PP, CP and EP are refused */
int imp_titan_parallel(imp_job *j, hfc *h)
{
    int64_t shard;
    char pol[64], w[160];
    static const char *const one[] = {"data_parallel_replicate_degree", "tensor_parallel_degree",
                                      "pipeline_parallel_degree", "context_parallel_degree",
                                      "expert_parallel_degree", "expert_tensor_parallel_degree"};
    static const char *const why[] = {
        "HSDP (replicated FSDP groups) is not modelled",
        "not mapped: mmguard models one tensor-parallel group without FSDP (training."
        "tensor_parallel, with sequence_parallel: true for torchtitan's plan; "
        "docs/parallel.md), while this importer reads torchtitan's FSDP2 set-up; with "
        "data_parallel_shard_degree > 1 torchtitan adds FSDP2 over the TP groups (2-D, not "
        "modelled)",
        "pipeline parallelism is not modelled (no safe bound)",
        "context parallelism is not modelled",
        "expert parallelism is not modelled (llama3 has no experts)",
        "expert tensor parallelism is not modelled"};
    for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
        int64_t d;
        if (hf_i64(h, one[i], 1, &d))
            return -1;
        if (d != 1)
            return hf_fail(h, one[i], "%lld: %s", (long long)d, why[i]);
    }
    if (hf_i64(h, "data_parallel_shard_degree", -1, &shard) ||
        hf_str(h, "fsdp_reshard_after_forward", "default", pol, sizeof pol))
        return -1;
    if (shard == 0 || shard < -1 || shard > (1 << 20))
        return hf_fail(h, "data_parallel_shard_degree", "expected -1 (every GPU) or 1..2^20");
    if (shard > 0)
        imp_set(&j->s->training, "data_parallel", hf_where(h, "data_parallel_shard_degree", w,
                                                          sizeof w), "%lld", (long long)shard);
    else
        imp_note(j->s, "assumed: data_parallel_shard_degree -1 shards over every GPU of the job "
                       "(training.data_parallel: the plugin sets it from the GPU request)");
    /* parallelize.py apply_fsdp: "default" = not pp_enabled = true, without PP */
    if (strcmp(pol, "default") && strcmp(pol, "always") && strcmp(pol, "never"))
        return hf_fail(h, "fsdp_reshard_after_forward", "expected default, always or never");
    imp_set(&j->s->fsdp, "version", "torchtitan applies fully_shard (FSDP2)", "2");
    imp_set(&j->s->fsdp, "reshard_after_forward", "parallelism.fsdp_reshard_after_forward",
            "%s", strcmp(pol, "never") ? "true" : "false");
    imp_note(j->s, "assumed: FSDP2 units are the decoder layers and the root; torchtitan also "
                   "keeps norm + output unresharded after forward (%s)",
             "parallelize.py apply_fsdp, a unit of its own: not modelled separately");
    j->fsdp = 1;
    return 0;
}

/* activation_checkpoint.*: none / full / selective (every N layers, or op) */
int imp_titan_ac(imp_job *j, hfc *h)
{
    char mode[64], opt[64], w[160];
    if (hf_str(h, "mode", "selective", mode, sizeof mode) ||
        hf_str(h, "selective_ac_option", "2", opt, sizeof opt))
        return -1;
    const char *from = mm_node_get(h->map, "mode") ? hf_where(h, "mode", w, sizeof w)
                                                   : "torchtitan default mode selective";
    imp_section *t = &j->s->training;
    /* torchtitan/distributed/activation_checkpoint.py: checkpoint_wrapper
     * (non-reentrant) around each TransformerBlock */
    if (!strcmp(mode, "none")) {
        imp_set(t, "gradient_checkpointing", from, "false");
    } else if (!strcmp(mode, "full")) {
        imp_set(t, "gradient_checkpointing", from, "{enabled: true, use_reentrant: false}");
    } else if (!strcmp(mode, "selective") && !strcmp(opt, "op")) {
        /* the op policy (_apply_op_sac): the single place selective "op" is
         * mapped, to the spec's selective_op granularity */
        imp_set(t, "gradient_checkpointing", "activation_checkpoint.selective_ac_option op",
                "{enabled: true, use_reentrant: false, granularity: selective_op}");
    } else if (!strcmp(mode, "selective")) {
        char *end;
        long n = strtol(opt, &end, 10);
        if (!opt[0] || *end || n < 0 || n > 4096)
            return hf_fail(h, "selective_ac_option", "'%s': expected op or a layer count 0..4096",
                           opt);
        if (n == 0) /* `not ac_freq`: every layer */
            n = 1;
        imp_set(t, "gradient_checkpointing", "activation_checkpoint.selective_ac_option: every "
                "Nth TransformerBlock", "{enabled: true, use_reentrant: false, "
                "every_n_layers: %ld}", n);
        if (n > 1)
            imp_note(j->s, "assumed: torchtitan checkpoints blocks N, 2N, ... (1-based, "
                           "_apply_layer_sac); the spec's every_n_layers picks as many blocks");
    } else {
        return hf_fail(h, "mode", "'%s': none, full and selective are modelled (memory_budget "
                                  "is torch.compile's partitioner: not modelled)", mode);
    }
    return 0;
}

/* optimizer.*: AdamW / Adam and its implementation */
int imp_titan_optimizer(imp_job *j, hfc *h)
{
    char name[64], impl[64];
    int early;
    if (hf_str(h, "name", "AdamW", name, sizeof name) ||
        hf_str(h, "implementation", "fused", impl, sizeof impl) ||
        imp_bool(h, "early_step_in_backward", 0, &early))
        return -1;
    const char *o = !strcmp(name, "AdamW") ? "adamw" : !strcmp(name, "Adam") ? "adam" : NULL;
    if (!o)
        return hf_fail(h, "name", "'%s': AdamW and Adam are modelled", name);
    const char *im = !strcmp(impl, "fused") ? "fused" : !strcmp(impl, "foreach") ? "foreach"
                     : !strcmp(impl, "for-loop") ? "for_loop" : NULL;
    if (!im)
        return hf_fail(h, "implementation", "expected fused, foreach or for-loop");
    imp_set(&j->s->training, "optimizer", "optimizer.name (torchtitan default AdamW)", "%s", o);
    imp_set(&j->s->training, "optimizer_impl", "optimizer.implementation (torchtitan default "
                                                "fused)", "%s", im);
    if (early)
        imp_set(&j->s->training, "optimizer_in_backward", "optimizer.early_step_in_backward",
                "true");
    return 0;
}
