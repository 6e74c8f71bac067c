/* import_titan_rules.c (layer import) - reading a torchtitan TOML job config:
 * each table by its reader (import_titan.c) and the table of the keys that
 * are not mapped, each ignored with why it does not change the GPU memory of
 * a step, accepted only at the default that is modelled, or refused.  Keys
 * and tables not listed are errors with file:line:col (torchtitan's
 * config/job_config.py @ 238fa995 names them all). */
#include "import_rd.h"
#include "import_titan.h"
#include "toml.h"

#include <stdio.h>
#include <string.h>

static const char *const HOST = "host side: logging, files, the data loader";
static const char *const PP = "pipeline parallelism only (its degree is 1)";
static const char *const TP = "tensor parallelism only (its degree is 1)";
static const char *const VAL = "validation only (validation.enable is false)";

static const imp_rule model_rules[] = {
    {"hf_assets_path", 'i', "where the tokenizer and weights load from"},
    {"tokenizer_path", 'i', "where the tokenizer loads from"},
    {"print_after_conversion", 'i', "logging"},
};
static const imp_rule optimizer_rules[] = {
    {"lr", 'i', "the learning rate: a value, no tensor"},
    {"eps", 'i', "Adam's epsilon: a value, no tensor"},
    {"weight_decay", 'i', "a value, no tensor"},
    {"beta1", 'i', "a value, no tensor"}, {"beta2", 'i', "a value, no tensor"},
};
static const imp_rule training_rules[] = {
    {"dataset", 'i', HOST}, {"dataset_path", 'i', HOST}, {"steps", 'i', "how long it runs"},
    {"global_batch_size", 'd', "-1|a larger one accumulates gradients over micro-batches, "
                                "a count that depends on the GPUs"},
    {"enable_cpu_offload", 'd', "false|FSDP2's CPUOffloadPolicy is not mapped"},
    {"gc_freq", 'i', "Python's garbage collector"}, {"gc_debug", 'i', "Python's garbage collector"},
    {"dataloader", 'i', HOST}, {"seed", 'i', "a value"}, {"deterministic", 'i', "kernel choice"},
};
static const imp_rule parallel_rules[] = {
    {"disable_loss_parallel", 'i', TP}, {"enable_async_tensor_parallel", 'i', TP},
    {"module_fqns_per_model_part", 'i', PP}, {"pipeline_parallel_first_stage_less_layers", 'i', PP},
    {"pipeline_parallel_last_stage_less_layers", 'i', PP},
    {"pipeline_parallel_layers_per_stage", 'i', PP}, {"pipeline_parallel_schedule", 'i', PP},
    {"pipeline_parallel_schedule_csv", 'i', PP}, {"pipeline_parallel_microbatch_size", 'i', PP},
    {"pipeline_parallel_expert_parallel_overlap", 'i', PP},
    {"context_parallel_load_balancer", 'i', "context parallelism only (its degree is 1)"},
    {"context_parallel_rotate_method", 'i', "context parallelism only (its degree is 1)"},
    {"expert_parallel_comm_backend", 'i', "expert parallelism only (llama3 has no experts)"},
};
static const imp_rule ac_rules[] = {
    {"per_op_sac_force_recompute_mm_shapes_by_fqns", 'i', "MoE router shapes (llama3 has none)"},
    {"early_stop", 'd', "false|early-stopped recomputation is not modelled"},
    {"memory_budget", 'i', "mode memory_budget only"},
    {"visualize_memory_budget_pareto", 'i', "mode memory_budget only"},
    {"preserve_rng_state", 'i', "an RNG state per checkpoint: bytes"},
    {"determinism_check", 'i', "a check of the recomputation"}, {"debug", 'i', "logging"},
};
static const imp_rule compile_rules[] = {
    /* training.torch_compile exists; torchtitan always shards with FSDP2,
     * which the spec refuses with torch_compile (docs/oracle.md) */
    {"enable", 'd', "false|torch.compile under FSDP2 is not modelled (training.torch_compile "
                    "is refused with FSDP)"},
    {"components", 'i', "compile.enable only (false)"}, {"backend", 'i', "compile.enable only"},
};
static const imp_rule validation_rules[] = {
    {"enable", 'd', "false|validation forwards between steps are not modelled"},
    {"dataset", 'i', VAL}, {"dataset_path", 'i', VAL}, {"local_batch_size", 'i', VAL},
    {"seq_len", 'i', VAL}, {"freq", 'i', VAL}, {"steps", 'i', VAL}, {"dataloader", 'i', VAL},
};
static const imp_rule ft_rules[] = {
    {"enable", 'd', "false|torchft's replica groups are not modelled"},
};
static const imp_rule debug_rules[] = {
    {"seed", 'i', "a value"}, {"deterministic", 'i', "kernel choice"},
    {"deterministic_warn_only", 'i', "kernel choice"},
    {"moe_force_load_balance", 'i', "MoE only (llama3 has no experts)"},
};

/* tables ignored whole, with the reason */
static const imp_rule table_rules[] = {
    {"job", 'i', "the run's name and output folder"},
    {"profiling", 'i', "the profiler and memory snapshots record on the host"},
    {"metrics", 'i', "logging"}, {"lr_scheduler", 'i', "the learning-rate schedule: values"},
    {"checkpoint", 'i', "distributed checkpoints of the sharded state: saved between steps"},
    {"comm", 'i', "timeouts and NCCL trace buffers"},
    {"memory_estimation", 'i', "an estimation run before training"},
    {"experimental", 'i', "extension modules: the model is named by model.name"},
};

typedef int (*table_fn)(imp_job *j, hfc *h);
static const struct table {
    const char *name;
    table_fn fn;
    const imp_rule *rules;
    size_t n;
} tables[] = {
#define T(name, fn, r) {name, fn, r, sizeof r / sizeof r[0]}
    T("model", imp_titan_model, model_rules),
    T("training", imp_titan_training, training_rules),
    T("parallelism", imp_titan_parallel, parallel_rules),
    T("activation_checkpoint", imp_titan_ac, ac_rules),
    T("optimizer", imp_titan_optimizer, optimizer_rules),
    T("compile", NULL, compile_rules), T("validation", NULL, validation_rules),
    T("fault_tolerance", NULL, ft_rules), T("debug", NULL, debug_rules),
#undef T
};

/* float8 / MX settings (quantize.*, the older float8 and mx tables) take
 * effect only when model.converters names them; a converter is refused */
static int titan_quantize(imp_job *j, hfc *root, const char *key)
{
    if (!mm_node_get(root->map, key))
        return 0;
    hf_mark(root, key);
    imp_note(j->s, "ignored %s: its float8 / MX settings act only through model.converters "
                   "(none here)", key);
    return 0;
}

static int titan_table(imp_job *j, hfc *root, const struct table *t, const char *name)
{
    const mm_node *m = mm_node_get(root->map, t->name);
    if (m && m->type != MM_NODE_MAP)
        return hf_fail(root, t->name, "expected a table");
    hfc h;
    hfc_init(&h, j->s, m, t->name, name, root->err);
    hf_mark(root, t->name);
    if (t->fn && t->fn(j, &h))
        return -1;
    return imp_rules_finish(&h, t->rules, t->n, "torchtitan");
}

int imp_torchtitan_buffer(imp_job *j, const char *buf, size_t len, const char *name,
                          mm_error *err)
{
    mm_node *root = mm_toml_parse(buf, len, name, err);
    if (!root)
        return -1;
    imp_source(j->s, name, buf, len);
    hfc h;
    hfc_init(&h, j->s, root, "", name, err);
    int rc = -1;
    j->trainer = 1;
    snprintf(j->trainer_file, sizeof j->trainer_file, "%s", name);
    for (size_t i = 0; i < root->n; i++)
        if (root->vals[i]->type != MM_NODE_MAP) {
            hf_fail(&h, root->keys[i], "a value outside any table (torchtitan's keys all "
                                       "live in tables)");
            goto out;
        }
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++)
        if (titan_table(j, &h, &tables[i], name))
            goto out;
    if (titan_quantize(j, &h, "quantize") || titan_quantize(j, &h, "float8") ||
        titan_quantize(j, &h, "mx"))
        goto out;
    if (imp_rules_finish(&h, table_rules, sizeof table_rules / sizeof table_rules[0],
                         "torchtitan"))
        goto out;
    imp_set(&j->s->training, "attention", "torchtitan's llama3 attn_type sdpa "
                                          "(F.scaled_dot_product_attention)", "sdpa");
    rc = 0;
out:
    mm_node_free(root);
    return rc;
}

int imp_torchtitan(imp_job *j, const char *path, mm_error *err)
{
    return imp_read_with(j, path, imp_torchtitan_buffer, err);
}
