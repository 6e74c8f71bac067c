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

/* compile.*: torchtitan @ 9810191bb^ models/llama3/infra/parallelize.py l.107-123 compiles
 * each TransformerBlock after activation checkpointing and before fully_shard (apply_compile
 * l.256-267: torch.compile(block, backend=compile.backend, fullgraph=True)) when "model" is in
 * compile.components (config/job_config.py l.721-727: enable false, components ["model",
 * "loss"], backend "inductor"); "loss" compiles the loss function (components/loss.py
 * l.33-35).  Both map to training.torch_compile: the truth rows compile this way, with and
 * without the loss (tests/truth/feat_compile.py titan_setups); the spec refuses it under
 * FSDP2 with what those rows measured (spec_links.c, docs/oracle.md) */
static int titan_compile(imp_job *j, hfc *h)
{
    int on;
    char be[64], w[160];
    if (imp_bool(h, "enable", 0, &on) || hf_str(h, "backend", "inductor", be, sizeof be))
        return -1;
    const mm_node *c = hf_node(h, "components");
    int model = c == NULL, loss = c == NULL;       /* absent: ["model", "loss"] */
    if (c && c->type != MM_NODE_SEQ)
        return hf_fail(h, "components", "expected a list of \"model\" and \"loss\"");
    for (size_t i = 0; c && i < c->n; i++) {
        const mm_node *v = c->vals[i];
        if (v->type == MM_NODE_SCALAR && !strcmp(v->str, "model"))
            model = 1;
        else if (v->type == MM_NODE_SCALAR && !strcmp(v->str, "loss"))
            loss = 1;
        else
            return hf_fail(h, "components", "expected \"model\" and / or \"loss\"");
    }
    if (!on) {
        imp_note(j->s, "ignored compile.enable: false is torchtitan's default (compile.components "
                       "and compile.backend act only when it is true)");
        return 0;
    }
    if (strcmp(be, "inductor"))
        return hf_fail(h, "backend", "'%s' is not measured (inductor is)", be);
    if (!model && loss)
        return hf_fail(h, "components", "the loss compiled alone, the blocks eager, is not "
                                        "measured (\"model\" with or without \"loss\" is)");
    if (!model)
        return 0;                                   /* components = []: nothing compiled */
    imp_set(&j->s->training, "torch_compile", hf_where(h, "enable", w, sizeof w), "true");
    imp_note(j->s, "compile.components %s: each TransformerBlock compiled before fully_shard",
             loss ? "model, loss" : "model");
    return 0;
}

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
    {"compile", titan_compile, NULL, 0}, T("validation", NULL, validation_rules),
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
