/* import_ds_zero.c - zero_optimization of a DeepSpeed config -> training.
 * zero_stage and the deepspeed: section.  Every mapped key is written out,
 * DeepSpeed's own default when the file leaves it out (DeepSpeed 0.17
 * runtime/zero/config.py, offload_config.py), so the spec says what runs. */
#include "import_rd.h"

#include <stdio.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))

static const char *const at_save = "gathers the 16-bit weights when the model is saved, after "
                                   "the step";
static const imp_rule zero_rules[] = {
    {"allgather_partitions", 'i', "all-gather or broadcasts of the updated partitions: the "
                                  "same allgather_bucket_size buffers"},
    {"reduce_scatter", 'i', "reduce-scatter or all-reduce of the same reduce_bucket_size bucket"},
    {"elastic_checkpoint", 'i', "checkpoint files"}, {"load_from_fp32_weights", 'i',
                                                      "checkpoint loading"},
    {"ignore_unused_parameters", 'i', "a check"}, {"pipeline_loading_checkpoint", 'i',
                                                   "checkpoint loading"},
    {"stage3_gather_16bit_weights_on_model_save", 'i', at_save},
    {"gather_16bit_weights_on_model_save", 'i', at_save},
    {"stage3_gather_fp16_weights_on_model_save", 'i', at_save},
    {"override_module_apply", 'i', "module.apply() during initialisation"},
    {"log_trace_cache_warnings", 'i', "logging"}, {"enable_sanity_checks", 'i', "checks"},
    {"use_multi_rank_bucket_allreduce", 'i', "how buckets are all-reduced, not their size"},
    {"mics_hierarchical_params_gather", 'i', "MiCS only (refused)"},
    {"memory_efficient_linear", 'd', "true|ZeRO-3's linear saves its input only"},
    {"legacy_stage1", 'd', "false|the legacy stage-1 optimizer is not modelled"},
    {"zero_hpz_partition_size", 'd', "1|ZeRO++ hierarchical partitions are not modelled"},
    {"zero_quantized_weights", 'd', "false|ZeRO++ quantized weights are not modelled"},
    {"zero_quantized_nontrainable_weights", 'd', "false|ZeRO++ quantized weights are not modelled"},
    {"zero_quantized_gradients", 'd', "false|ZeRO++ quantized gradients are not modelled"},
    {"zeropp_loco_param", 'd', "null|ZeRO++ LoCo is not modelled"},
    {"mics_shard_size", 'd', "-1|MiCS is not modelled"},
    {"stage3_module_granularity_threshold", 'd', "0|leaf-module fetching is not modelled"},
    {"module_granularity_threshold", 'd', "0|leaf-module fetching is not modelled"},
    {"stage3_use_all_reduce_for_fetch_params", 'd', "false|parameters are fetched by all-gather"},
    {"use_all_reduce_for_fetch_params", 'd', "false|parameters are fetched by all-gather"},
    {"stage3_model_persistence_threshold", 'd', "9223372036854775807|no cap on persistent "
                                                "parameters"},
    {"model_persistence_threshold", 'd', "9223372036854775807|no cap on persistent parameters"},
    {"zenflow", 'r', "ZenFlow is not modelled"},
};

static const imp_rule offload_rules[] = {
    {"buffer_count", 'i', "host buffers (CPU memory)"}, {"buffer_size", 'i', "NVMe staging buffers"},
    {"max_in_cpu", 'i', "NVMe parameter offload only (refused)"}, {"nvme_path", 'i', "NVMe only"},
    {"pipeline_read", 'i', "NVMe only"}, {"pipeline_write", 'i', "NVMe only"},
    {"fast_init", 'i', "NVMe only"}, {"ratio", 'd', "1|partial optimizer offload is not modelled"},
};

/* offload_optimizer / offload_param: {device: none|cpu, pin_memory} */
static int offload(imp_job *j, hfc *z, const char *key, int stage, int *pin)
{
    const mm_node *o = hf_node(z, key);
    char w[160], dev[64];
    if (!o)
        return 0;
    hfc h;
    hfc_init(&h, j->s, o, hf_where(z, key, w, sizeof w), z->file, z->err);
    if (o->type != MM_NODE_MAP)
        return hf_fail(z, key, "expected a mapping {device: cpu, pin_memory: true}");
    int p;
    if (hf_str(&h, "device", "none", dev, sizeof dev) || imp_bool(&h, "pin_memory", 0, &p))
        return -1;
    if (!strcmp(dev, "nvme"))
        return hf_fail(&h, "device", "NVMe offload is not modelled");
    if (strcmp(dev, "cpu") && strcmp(dev, "none"))
        return hf_fail(&h, "device", "expected cpu or none, got '%s'", dev);
    if (!strcmp(key, "offload_param") && stage < 3 && !strcmp(dev, "cpu")) {
        imp_note(j->s, "ignored %s: only ZeRO stage 3 offloads parameters (stage is %d)", w, stage);
        hf_mark(&h, "pin_memory");
        return imp_rules_finish(&h, offload_rules, sizeof offload_rules / sizeof offload_rules[0],
                                "DeepSpeed");
    }
    imp_set(&j->s->deepspeed, key, hf_where(&h, "device", w, sizeof w), "%s", dev);
    if (!strcmp(dev, "cpu")) {
        if (*pin >= 0 && *pin != p)
            return hf_fail(&h, "pin_memory", "differs from the other offload's pin_memory: the "
                                             "spec has one");
        *pin = p;
        imp_set(&j->s->deepspeed, "pin_memory", hf_where(&h, "pin_memory", w, sizeof w), "%s",
                p ? "true" : "false");
    }
    return imp_rules_finish(&h, offload_rules, sizeof offload_rules / sizeof offload_rules[0],
                            "DeepSpeed");
}

/* the deprecated booleans cpu_offload / cpu_offload_params / cpu_offload_use_pin_memory */
static int legacy_offload(imp_job *j, hfc *z, int stage)
{
    int opt, par, pin;
    char w[160];
    if (imp_bool(z, "cpu_offload", 0, &opt) || imp_bool(z, "cpu_offload_params", 0, &par) ||
        imp_bool(z, "cpu_offload_use_pin_memory", 0, &pin))
        return -1;
    if (opt)
        imp_set(&j->s->deepspeed, "offload_optimizer", hf_where(z, "cpu_offload", w, sizeof w), "cpu");
    if (par && stage == 3)
        imp_set(&j->s->deepspeed, "offload_param", hf_where(z, "cpu_offload_params", w, sizeof w),
                "cpu");
    if ((opt || par) && mm_node_get(z->map, "cpu_offload_use_pin_memory"))
        imp_set(&j->s->deepspeed, "pin_memory", hf_where(z, "cpu_offload_use_pin_memory", w,
                                                         sizeof w), "%s", pin ? "true" : "false");
    return 0;
}

typedef struct zkey {
    const char *key, *alias;
    unsigned stages;      /* bit per ZeRO stage that uses it */
    double def;           /* DeepSpeed's default */
    int autok;            /* what transformers fills an "auto" with: 1 h^2, 2 0.9 h^2, 3 10 h */
    uint64_t min;
} zkey;
#define S(n) (1u << (n))
static const zkey zkeys[] = {
    {"reduce_bucket_size", NULL, S(1) | S(2) | S(3), 5e8, 1, 0},
    {"allgather_bucket_size", NULL, S(1) | S(2), 5e8, 0, 0},
    {"stage3_prefetch_bucket_size", "prefetch_bucket_size", S(3), 5e7, 2, 0},
    {"stage3_max_live_parameters", "max_live_parameters", S(3), 1e9, 0, 0},
    {"stage3_param_persistence_threshold", "param_persistence_threshold", S(3), 1e5, 3, 0},
    {"sub_group_size", NULL, S(3), 1e9, 0, 1},
    {"stage3_max_reuse_distance", "max_reuse_distance", S(3), 1e9, 0, 0},
};

/* transformers trainer_config_finalize: h*h, int(0.9*h*h) (Python evaluates
 * 0.9*h first, in doubles, as C does here), 10*h */
static uint64_t auto_value(int k, uint64_t h)
{
    return k == 1 ? h * h : k == 2 ? (uint64_t)(0.9 * (double)h * (double)h) : 10 * h;
}

static int zero_size(imp_job *j, hfc *z, const zkey *k, int stage, uint64_t hidden)
{
    const char *key = k->key;
    char w[160];
    if (k->alias && mm_node_get(z->map, k->alias)) {
        if (mm_node_get(z->map, k->key))
            return hf_fail(z, k->alias, "given twice (as %s and %s)", k->key, k->alias);
        key = k->alias;
    }
    const mm_node *v = hf_node(z, key);
    hf_where(z, key, w, sizeof w);
    if (!(k->stages & S(stage))) {
        if (v && imp_is_auto(v) && k->autok >= 2)
            return hf_fail(z, key, "\"auto\" is filled by transformers only at ZeRO stage 3; "
                                   "DeepSpeed refuses it at stage %d", stage);
        uint64_t unused;
        if (v && !imp_is_auto(v) && imp_u64(z, key, 0, k->min, 1000000000000ull, &unused))
            return -1; /* DeepSpeed validates it all the same */
        if (v)
            imp_note(j->s, "ignored %s: not used by ZeRO stage %d", w, stage);
        return 0;
    }
    uint64_t val;
    if (!v) {
        imp_set(&j->s->deepspeed, k->key, "DeepSpeed's default", "%llu", ULL(k->def));
        return 0;
    }
    if (imp_is_auto(v)) {
        if (!k->autok)
            return hf_fail(z, key, "transformers fills \"auto\" only in reduce_bucket_size, "
                                   "stage3_prefetch_bucket_size and "
                                   "stage3_param_persistence_threshold");
        if (!hidden)
            return hf_fail(z, key, "\"auto\" is the model's hidden size: give the model (--hf)");
        val = auto_value(k->autok, hidden);
        char from[320];
        snprintf(from, sizeof from, "%s \"auto\": %s, the language model's hidden_size %llu", w,
                 k->autok == 1 ? "h*h" : k->autok == 2 ? "int(0.9*h*h)" : "10*h", ULL(hidden));
        imp_set(&j->s->deepspeed, k->key, from, "%llu", ULL(val));
        return 0;
    }
    if (imp_u64(z, key, 0, k->min, 1000000000000ull, &val))
        return -1;
    imp_set(&j->s->deepspeed, k->key, w, "%llu", ULL(val));
    return 0;
}

static int zero_flags(imp_job *j, hfc *z, int stage)
{
    int ov, cg, rr;
    char w[160];
    if (imp_bool(z, "overlap_comm", stage == 3, &ov) ||
        imp_bool(z, "contiguous_gradients", 1, &cg) || imp_bool(z, "round_robin_gradients", 0, &rr))
        return -1;
    /* round_robin_gradients reorders stage 2's flat groups (the partitions' contents) */
    if (stage == 2)
        imp_set(&j->s->deepspeed, "round_robin_gradients",
                mm_node_get(z->map, "round_robin_gradients")
                    ? hf_where(z, "round_robin_gradients", w, sizeof w) : "DeepSpeed's default",
                "%s", rr ? "true" : "false");
    else if (mm_node_get(z->map, "round_robin_gradients"))
        imp_note(j->s, "ignored %s: only ZeRO stage 2 reorders gradients round-robin",
                 hf_where(z, "round_robin_gradients", w, sizeof w));
    imp_set(&j->s->deepspeed, "overlap_comm", mm_node_get(z->map, "overlap_comm")
            ? hf_where(z, "overlap_comm", w, sizeof w)
            : "DeepSpeed's default: true at stage 3 only", "%s", ov ? "true" : "false");
    imp_set(&j->s->deepspeed, "contiguous_gradients", mm_node_get(z->map, "contiguous_gradients")
            ? hf_where(z, "contiguous_gradients", w, sizeof w) : "DeepSpeed's default",
            "%s", cg ? "true" : "false");
    return 0;
}

int imp_ds_zero(imp_job *j, hfc *z, uint64_t hidden)
{
    uint64_t st;
    char w[160];
    if (!mm_node_get(z->map, "stage"))
        return hf_fail(z, "stage", "missing: DeepSpeed's default stage 0 (no ZeRO) is not "
                                   "modelled");
    if (imp_u64(z, "stage", 0, 0, 3, &st))
        return -1;
    if (st == 0)
        return hf_fail(z, "stage", "DeepSpeed without ZeRO (stage 0) is not modelled: its "
                                   "BF16/FP16 optimizer wrappers keep fp32 copies");
    int stage = (int)st;
    j->zero_stage = stage;
    imp_set(&j->s->training, "zero_stage", hf_where(z, "stage", w, sizeof w), "%d", stage);
    int pin = -1;
    if (offload(j, z, "offload_optimizer", stage, &pin) || offload(j, z, "offload_param", stage,
                                                                    &pin) ||
        legacy_offload(j, z, stage) || zero_flags(j, z, stage))
        return -1;
    for (size_t i = 0; i < sizeof zkeys / sizeof zkeys[0]; i++)
        if (zero_size(j, z, &zkeys[i], stage, hidden))
            return -1;
    return imp_rules_finish(z, zero_rules, sizeof zero_rules / sizeof zero_rules[0], "DeepSpeed");
}
