/* reqtext.c - the GPU request in the user's own terms: which option (command
 * line, #SBATCH line, environment variable, the allocation) carries the GPU
 * count, and that option rewritten to ask for another count or GPU type, so
 * that a suggestion reads "ask for 6 GPUs (--gres=gpu:h100:6)" rather than
 * naming a flag the user never typed. */
#include <stdio.h>
#include <string.h>

#include "request.h"

static int has_gpu_entry(const char *gres)
{
    char t[MMG_REQ_TYPE_MAX], err[8];
    uint32_t k;
    return mmg_tres_gpu(gres, t, &k, err, sizeof(err)) == 1 && k > 0;
}

const struct mmg_optval *mmg_request_source(const struct mmg_reqin *r,
                                            const struct mmg_gpureq *g)
{
    const struct mmg_optval *o;
    switch (g->kind) {
    case MMG_PER_JOB: o = &r->o[MMG_O_GPUS]; break;
    case MMG_PER_TASK: o = &r->o[MMG_O_GPUS_PER_TASK]; break;
    default:
        o = r->o[MMG_O_GRES].set && has_gpu_entry(r->o[MMG_O_GRES].value) ? &r->o[MMG_O_GRES]
                                                                          : &r->o[MMG_O_GPUS_PER_NODE];
    }
    return o->set ? o : NULL;
}

/* The --gres value with its GPU entry replaced: other GRES are kept. */
static void gres_value(const char *old, const char *type, uint32_t count, char *out, size_t n)
{
    size_t used = 0;
    const char *p = old;
    out[0] = '\0';
    while (*p && used < n) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        char entry[MMG_REQ_VAL_MAX];
        snprintf(entry, sizeof(entry), "%.*s", (int)len, p);
        if (has_gpu_entry(entry))
            used += (size_t)snprintf(out + used, n - used, "%sgpu%s%s:%u", used ? "," : "",
                                     type[0] ? ":" : "", type, count);
        else
            used += (size_t)snprintf(out + used, n - used, "%s%s", used ? "," : "", entry);
        p += len + (c != NULL);
    }
}

/* The user's type unless another is asked for. */
static const char *pick_type(const struct mmg_gpureq *g, const char *type)
{
    return type && type[0] ? type : g->type;
}

static int is_gres(const struct mmg_optval *o)
{
    return !strcmp(o->spelled, "--gres") || strstr(o->spelled, "_GRES") != NULL;
}

/* Option text without its location: "--gres=gpu:h100:6", "SBATCH_GPUS=6". */
static void option_text(const struct mmg_optval *o, const struct mmg_gpureq *g, const char *type,
                        uint32_t count, char *out, size_t n)
{
    char val[MMG_REQ_VAL_MAX + 32];
    const char *t = pick_type(g, type);
    if (o && is_gres(o))
        gres_value(o->value, t, count, val, sizeof(val));
    else if (!o)
        snprintf(val, sizeof(val), "gpu%s%s:%u", t[0] ? ":" : "", t, count);
    else if (t[0])
        snprintf(val, sizeof(val), "%s:%u", t, count);
    else
        snprintf(val, sizeof(val), "%u", count);
    snprintf(out, n, "%s%s=%s", o && o->from == MMG_FROM_SCRIPT ? "#SBATCH " : "",
             o ? o->spelled : "--gres", val);
}

static uint32_t ceil_div32(uint32_t a, uint32_t b)
{
    return b ? a / b + (a % b != 0) : a;
}

uint32_t mmg_request_spell(const struct mmg_reqin *r, const struct mmg_gpureq *g, uint32_t want,
                           const char *type, uint32_t max_per_node, char *out, size_t n)
{
    const struct mmg_optval *o = mmg_request_source(r, g);
    uint32_t nodes = g->nodes_min ? g->nodes_min : 1, count;
    uint64_t total;
    char opt[MMG_REQ_VAL_MAX + 96];

    if (g->kind == MMG_PER_JOB) {
        count = want;
        total = want;
    } else if (g->kind == MMG_PER_TASK) {
        count = ceil_div32(want, g->tasks);
        total = (uint64_t)count * g->tasks;
    } else {
        if (max_per_node && ceil_div32(want, nodes) > max_per_node)
            nodes = ceil_div32(want, max_per_node);
        count = ceil_div32(want, nodes);
        total = (uint64_t)count * nodes;
    }
    if (total > MMG_REQ_MAX_GPUS || count == 0)
        return 0;
    option_text(o, g, type, count, opt, sizeof(opt));
    if (nodes != g->nodes_min && g->kind == MMG_PER_NODE)
        snprintf(out, n, "-N %u %s", nodes, opt);
    else if (o && o->from == MMG_FROM_SCRIPT)
        snprintf(out, n, "%s (%s line %u)", opt, r->script_name, o->line);
    else
        snprintf(out, n, "%s", opt);
    return (uint32_t)total;
}

void mmg_request_describe(const struct mmg_reqin *r, const struct mmg_gpureq *g, char *out,
                          size_t n)
{
    const struct mmg_optval *o = mmg_request_source(r, g);
    char opt[MMG_REQ_VAL_MAX + 96], where[96] = "", shape[64] = "";
    snprintf(opt, sizeof(opt), "%s%s%s", o ? o->spelled : "--gres", "=", o ? o->value : "");
    if (o && o->from == MMG_FROM_SCRIPT)
        snprintf(where, sizeof(where), ", #SBATCH line %u of %s", o->line, r->script_name);
    else if (o && o->from == MMG_FROM_ALLOC)
        snprintf(where, sizeof(where), ", the allocation's");
    if (g->kind == MMG_PER_NODE && g->nodes_max > g->nodes_min)
        snprintf(shape, sizeof(shape), " on %u-%u nodes", g->nodes_min, g->nodes_max);
    else if (g->kind == MMG_PER_NODE)
        snprintf(shape, sizeof(shape), " on %u node%s", g->nodes_min, g->nodes_min == 1 ? "" : "s");
    else if (g->kind == MMG_PER_TASK)
        snprintf(shape, sizeof(shape), " x %u tasks", g->tasks);
    snprintf(out, n, "%u GPU%s (%s%s%s)", g->gpus_min, g->gpus_min == 1 ? "" : "s", opt, shape,
             where);
}
