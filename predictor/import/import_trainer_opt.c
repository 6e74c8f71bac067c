/* import_trainer_opt.c - the trainer keys that pick kernels and strategies:
 * attention implementation, Liger's fused loss, packing / padding-free,
 * activation offloading, torch.compile (inductor, default mode), the DeepSpeed config path
 * and HF Trainer's fsdp / fsdp_config (accelerate's FSDP plugin). */
#include "import_rd.h"

#include <stdio.h>
#include <string.h>

static int tr_attention(imp_job *j, hfc *h)
{
    char a[64], w[160];
    if (hf_str(h, "attn_implementation", "", a, sizeof a))
        return -1;
    if (!a[0])
        return 0;
    const char *v = !strcmp(a, "eager") ? "eager" : !strcmp(a, "sdpa") ? "sdpa"
                    : !strncmp(a, "flash_attention_", 16) ? "flash" : NULL;
    if (!v)
        return hf_fail(h, "attn_implementation", "'%s' is not modelled (eager, sdpa, "
                                                 "flash_attention_2/3 are)", a);
    imp_set(&j->s->training, "attention", hf_where(h, "attn_implementation", w, sizeof w), "%s", v);
    return 0;
}

/* torch_compile / torch_compile_backend / torch_compile_mode: training_args.py
 * __post_init__ turns torch_compile on when either of the other two is set and
 * defaults the backend to "inductor"; accelerate then runs
 * torch.compile(model, backend=, mode=) in prepare_model (accelerator.py
 * l.2068-2073).  The truth rows measure inductor in its default mode; the
 * CUDA-graph modes keep a private memory pool with static copies of inputs and
 * outputs, which the eager prediction does not bound. */
static int tr_compile(imp_job *j, hfc *h)
{
    int comp;
    char be[64], mode[64], w[160];
    if (imp_bool(h, "torch_compile", 0, &comp) || hf_str(h, "torch_compile_backend", "", be, sizeof be) ||
        hf_str(h, "torch_compile_mode", "", mode, sizeof mode))
        return -1;
    if (hf_node(h, "torchdynamo"))
        return hf_fail(h, "torchdynamo", "removed from TrainingArguments: give torch_compile_backend");
    if (be[0] && strcmp(be, "inductor"))
        return hf_fail(h, "torch_compile_backend", "'%s' is not measured (inductor is: its compiled "
                                                   "step is bounded by the eager prediction)", be);
    if (mode[0] && strcmp(mode, "default"))
        return hf_fail(h, "torch_compile_mode", "'%s' is not measured (the default mode is); "
                       "reduce-overhead and max-autotune capture CUDA graphs, whose private pool "
                       "the eager prediction does not bound", mode);
    if (!comp && !be[0] && !mode[0])
        return 0;
    const char *key = comp ? "torch_compile" : be[0] ? "torch_compile_backend" : "torch_compile_mode";
    imp_set(&j->s->training, "torch_compile", hf_where(h, key, w, sizeof w), "true");
    return 0;
}

static int tr_flags(imp_job *j, hfc *h)
{
    int liger, pack, pf, off;
    char w[160];
    if (imp_bool(h, "use_liger_kernel", 0, &liger) || imp_bool(h, "packing", 0, &pack) ||
        imp_bool(h, "padding_free", 0, &pf) || imp_bool(h, "activation_offloading", 0, &off) ||
        tr_compile(j, h))
        return -1;
    if (liger && imp_liger(j, h, "use_liger_kernel", 1)) /* import_liger.c */
        return -1;
    if (pack || pf)
        imp_set(&j->s->training, "packing", hf_where(h, pf ? "padding_free" : "packing", w,
                                                     sizeof w), "true");
    if (off)
        imp_set(&j->s->training, "activation_offloading", hf_where(h, "activation_offloading", w,
                                                                   sizeof w), "true");
    return 0;
}

static int tr_deepspeed(imp_job *j, hfc *h)
{
    const mm_node *d = hf_node(h, "deepspeed");
    if (!d)
        return 0;
    if (d->type != MM_NODE_SCALAR)
        return hf_fail(h, "deepspeed", "expected the path of a DeepSpeed config file (an inline "
                                       "config is not read: give it as a file)");
    imp_resolve_path(h->file, d->str, j->ds_path, sizeof j->ds_path);
    imp_where_key(h, "deepspeed", j->ds_where, sizeof j->ds_where);
    return 0;
}

/* fsdp: "full_shard auto_wrap offload" (a string or a list of options) */
static int fsdp_options(hfc *h, const mm_node *v, int *shard, int *offload)
{
    char buf[256] = "";
    if (v->type == MM_NODE_SCALAR)
        snprintf(buf, sizeof buf, "%s", v->str ? v->str : "");
    for (size_t i = 0; v->type == MM_NODE_SEQ && i < v->n; i++)
        if (v->vals[i]->type == MM_NODE_SCALAR && v->vals[i]->str)
            snprintf(buf + strlen(buf), sizeof buf - strlen(buf), " %s", v->vals[i]->str);
    *shard = -1;
    *offload = 0;
    for (char *save = NULL, *tok = strtok_r(buf, " ,", &save); tok; tok = strtok_r(NULL, " ,", &save)) {
        if (!strcmp(tok, "full_shard"))
            *shard = 0;
        else if (!strcmp(tok, "shard_grad_op"))
            *shard = 1;
        else if (!strcmp(tok, "offload"))
            *offload = 1;
        else if (strcmp(tok, "auto_wrap"))
            return hf_fail(h, "fsdp", "'%s' is not modelled (full_shard, shard_grad_op, offload, "
                                      "auto_wrap are)", tok);
    }
    if (*shard < 0 && (*offload || buf[0]))
        *shard = 0; /* transformers: offload alone means full_shard */
    return 0;
}

static const imp_rule fsdp_rules[] = {
    {"transformer_layer_cls_to_wrap", 'i', "the spec wraps each transformer layer, as the auto "
                                           "wrap policy does with the model's _no_split_modules"},
    {"sync_module_states", 'i', "a broadcast at start-up"},
    {"cpu_ram_efficient_loading", 'i', "host memory at load time"},
    {"xla", 'd', "false|XLA is not modelled"}, {"xla_fsdp_v2", 'd', "false|XLA is not modelled"},
    {"xla_fsdp_grad_ckpt", 'd', "false|XLA is not modelled"},
    {"state_dict_type", 'i', "checkpoint files"},
};

/* The auto-wrap policy, the one place it is mapped (auto_wrap_policy and
 * min_num_params, with or without accelerate's "fsdp_" prefix).  transformers 5
 * (training_args.py, the accelerate plugin's kwargs: auto_wrap_policy, default
 * TRANSFORMER_BASED_WRAP; min_num_params passed when SIZE_BASED_WRAP and > 0);
 * transformers 4 chose SIZE_BASED_WRAP itself when fsdp_config.min_num_params > 0
 * (its `auto_wrap` option: FSDP_AUTO_WRAP_POLICY[1] and FSDP_MIN_NUM_PARAMS), so a
 * min_num_params without a policy is read that way.  accelerate builds
 * functools.partial(size_based_auto_wrap_policy, min_num_params=N) for N > 0 and no
 * policy at all for 0 (accelerate/utils/dataclasses.py:2102-2107): fsdp.wrap_policy
 * size (spec_train.c check_wrap_size).  NO_WRAP (one root unit) is refused. */
static int fsdp_wrap(hfc *f, imp_section *fs, int64_t ver)
{
    char pol[64], w[160];
    uint64_t n;
    int named = hf_node(f, "auto_wrap_policy") != NULL;
    if (hf_str(f, "auto_wrap_policy", "TRANSFORMER_BASED_WRAP", pol, sizeof pol) ||
        imp_u64(f, "min_num_params", 0, 0, 1000000000000000ull, &n))
        return -1;
    for (char *p = pol; *p; p++)
        *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    int size = !strcmp(pol, "SIZE_BASED_WRAP") || (!named && n > 0);
    if (!size && strcmp(pol, "TRANSFORMER_BASED_WRAP"))
        return hf_fail(f, "auto_wrap_policy", "%s is not modelled: only TRANSFORMER_BASED_WRAP (a "
                       "unit per transformer layer) and SIZE_BASED_WRAP (fsdp.wrap_policy size) "
                       "are; NO_WRAP leaves the whole model in one root unit", pol);
    if (!size) {
        if (n)
            imp_note(f->s, "ignored %s: read with SIZE_BASED_WRAP only",
                     hf_where(f, "min_num_params", w, sizeof w));
        return 0;
    }
    if (!n)
        return hf_fail(f, "min_num_params", "SIZE_BASED_WRAP with min_num_params 0: accelerate "
                       "then passes no policy (utils/dataclasses.py:2104-2107), one root unit: not "
                       "modelled");
    if (ver != 1)
        return hf_fail(f, "auto_wrap_policy", "SIZE_BASED_WRAP is modelled for FSDP1 only: "
                       "accelerate's FSDP2 policy (fsdp2_prepare_auto_wrap_policy) shards every "
                       "module above min_num_params and carves the embedding and lm_head out");
    imp_set(fs, "wrap_policy", named ? hf_where(f, "auto_wrap_policy", w, sizeof w)
                                     : "transformers 4: min_num_params > 0 selects SIZE_BASED_WRAP",
            "size");
    imp_set(fs, "min_num_params", hf_where(f, "min_num_params", w, sizeof w), "%llu",
            (unsigned long long)n);
    return 0;
}

/* transformers strips an "fsdp_" prefix from fsdp_config keys */
static mm_node *unprefixed(const mm_node *c)
{
    mm_node *u = c && c->type == MM_NODE_MAP ? mm_node_clone(c) : NULL;
    for (size_t i = 0; u && i < u->n; i++)
        if (!strncmp(u->keys[i], "fsdp_", 5) && !mm_node_get(c, u->keys[i] + 5))
            memmove(u->keys[i], u->keys[i] + 5, strlen(u->keys[i] + 5) + 1);
    return u;
}

static int fsdp_read(imp_job *j, hfc *h, const mm_node *c, int shard, int offload);

static int fsdp_config(imp_job *j, hfc *h, int shard, int offload)
{
    const mm_node *c0 = hf_node(h, "fsdp_config");
    if (c0 && c0->type != MM_NODE_MAP)
        return hf_fail(h, "fsdp_config", "expected a mapping (a path is not read: inline it)");
    mm_node *c = unprefixed(c0);
    if (c0 && !c) {
        mm_err(h->err, "%s: out of memory", h->file);
        return -1;
    }
    int rc = fsdp_read(j, h, c, shard, offload);
    mm_node_free(c);
    return rc;
}

static int fsdp_read(imp_job *j, hfc *h, const mm_node *c, int shard, int offload)
{
    hfc f;
    hfc_init(&f, j->s, c, "fsdp_config", h->file, h->err);
    imp_section *fs = &j->s->fsdp;
    int64_t ver;
    int orig, fwd, lim, ckpt, reshard, off2;
    char bp[64], w[160];
    if (hf_i64(&f, "version", 1, &ver) || imp_bool(&f, "use_orig_params", 1, &orig) ||
        imp_bool(&f, "forward_prefetch", 0, &fwd) || imp_bool(&f, "limit_all_gathers", 1, &lim) ||
        imp_bool(&f, "activation_checkpointing", 0, &ckpt) ||
        imp_bool(&f, "reshard_after_forward", shard == 0, &reshard) ||
        imp_bool(&f, "offload_params", offload, &off2) ||
        hf_str(&f, "backward_prefetch", "NO_PREFETCH", bp, sizeof bp))
        return -1;
    if (ver != 1 && ver != 2)
        return hf_fail(&f, "version", "expected 1 or 2");
    imp_set(fs, "version", c && mm_node_get(c, "version") ? "fsdp_config.version"
            : "accelerate's default FSDP version", "%d", (int)ver);
    if (ver == 1)
        imp_set(fs, "sharding_strategy", "fsdp", "%s", shard ? "SHARD_GRAD_OP" : "FULL_SHARD");
    else
        imp_set(fs, "reshard_after_forward", "fsdp / fsdp_config.reshard_after_forward", "%s",
                reshard ? "true" : "false");
    imp_set(fs, "use_orig_params", "fsdp_config.use_orig_params (default true)", "%s",
            orig ? "true" : "false");
    imp_set(fs, "forward_prefetch", "fsdp_config.forward_prefetch", "%s", fwd ? "true" : "false");
    /* the spec accepts only FSDP1's default (the rate limiter on): false has no bound
     * (spec_train.c decode_fsdp); FSDP2 has no limiter, accelerate ignores the key there */
    if (ver == 1 && !lim)
        return hf_fail(&f, "limit_all_gathers", "false is not modelled: without FSDP1's rate "
                       "limiter the unsharded units alive at once depend on the GPU's speed");
    if (ver == 1)
        imp_set(fs, "limit_all_gathers", "fsdp_config.limit_all_gathers (default true)", "true");
    for (char *p = bp; *p; p++)
        *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 32 : *p);
    if (strcmp(bp, "BACKWARD_PRE") && strcmp(bp, "BACKWARD_POST") && strcmp(bp, "NO_PREFETCH"))
        return hf_fail(&f, "backward_prefetch", "expected backward_pre, backward_post or no_prefetch");
    imp_set(fs, "backward_prefetch", "fsdp_config.backward_prefetch (HF default NO_PREFETCH)",
            "%s", bp);
    if (offload || off2)
        imp_set(fs, "cpu_offload", "fsdp offload", "true");
    if (ckpt)
        imp_set(&j->s->training, "gradient_checkpointing", hf_where(&f, "activation_checkpointing",
                w, sizeof w), "{enabled: true, use_reentrant: false}");
    if (fsdp_wrap(&f, fs, ver))
        return -1;
    return imp_rules_finish(&f, fsdp_rules, sizeof fsdp_rules / sizeof fsdp_rules[0], "FSDP");
}

/* accelerator_config.gradient_accumulation_kwargs.sync_each_batch: the Trainer's
 * no_sync between micro-batches, or a reduce-scatter every one (trainer.py,
 * _inner_training_loop; docs/parallel.md).  Read from the mapping only: a path
 * to a JSON file is left as it is (its default, no_sync, is assumed). */
static void fsdp_sync(imp_job *j, hfc *h)
{
    const mm_node *a = mm_node_get(h->map, "accelerator_config");
    const mm_node *g = a && a->type == MM_NODE_MAP ? mm_node_get(a, "gradient_accumulation_kwargs")
                                                   : NULL;
    const mm_node *v = g && g->type == MM_NODE_MAP ? mm_node_get(g, "sync_each_batch") : NULL;
    int on = v && v->type == MM_NODE_SCALAR && (!strcmp(v->str, "true") || !strcmp(v->str, "True"));
    imp_set(&j->s->fsdp, "sync_each_micro_batch",
            on ? "accelerator_config.gradient_accumulation_kwargs.sync_each_batch"
               : "HF Trainer: no_sync between micro-batches (sync_each_batch not true)",
            "%s", on ? "true" : "false");
}

static int tr_fsdp(imp_job *j, hfc *h)
{
    const mm_node *v = hf_node(h, "fsdp");
    int shard = -1, offload = 0;
    if (v && fsdp_options(h, v, &shard, &offload))
        return -1;
    if (shard < 0) {
        if (mm_node_get(h->map, "fsdp_config") && !(v && v->is_null))
            imp_note(j->s, "ignored fsdp_config: fsdp is not enabled (no fsdp option)");
        hf_mark(h, "fsdp_config");
        return 0;
    }
    j->fsdp = 1;
    fsdp_sync(j, h);
    return fsdp_config(j, h, shard, offload);
}

/* ddp_bucket_cap_mb, ddp_find_unused_parameters (null: torch's 25 MiB, the
 * Trainer's not gradient_checkpointing) -> ddp: (dropped when DeepSpeed or
 * FSDP wraps the model instead: imp_ddp_finish) */
static int tr_ddp(imp_job *j, hfc *h)
{
    char w[160];
    const mm_node *b = hf_node(h, "ddp_bucket_cap_mb"), *f = hf_node(h, "ddp_find_unused_parameters");
    if (b && !b->is_null) {
        uint64_t mb;
        if (imp_u64(h, "ddp_bucket_cap_mb", 25, 1, 1u << 20, &mb))
            return -1;
        imp_set(&j->s->ddp, "bucket_cap_mb", hf_where(h, "ddp_bucket_cap_mb", w, sizeof w), "%llu",
                (unsigned long long)mb);
    }
    if (f && !f->is_null) {
        int fu;
        if (imp_bool(h, "ddp_find_unused_parameters", 0, &fu))
            return -1;
        imp_set(&j->s->ddp, "find_unused_parameters",
                hf_where(h, "ddp_find_unused_parameters", w, sizeof w), "%s", fu ? "true" : "false");
    }
    hf_mark(h, "ddp_bucket_cap_mb");
    hf_mark(h, "ddp_find_unused_parameters");
    return 0;
}

void imp_ddp_finish(imp_job *j)
{
    imp_spec *s = j->s;
    if (!s->ddp.n || (!imp_get(&s->training, "zero_stage") && !s->fsdp.n))
        return;
    for (size_t i = 0; i < s->ddp.n; i++)
        imp_note(s, "ignored %s: %s wraps the model, not DDP", s->ddp.kv[i].from,
                 s->fsdp.n ? "FSDP" : "DeepSpeed");
    s->ddp.n = 0;
}

int imp_trainer_opt(imp_job *j, hfc *h)
{
    return tr_attention(j, h) || tr_flags(j, h) || tr_deepspeed(j, h) || tr_fsdp(j, h) ||
           tr_ddp(j, h) ? -1 : 0;
}
