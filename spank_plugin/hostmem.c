/* hostmem.c - the host memory of the job's GPU processes against the memory
 * the job asks for (issue 14).  The predictor reports what each GPU process
 * keeps on the host (host_peak_bytes: CPU-offloaded optimizer states and
 * parameters); each process also needs its runtime (host_overhead=: Python,
 * torch, CUDA).  The busiest GPU node of the job holds `ranks` processes and
 * gets what memreq.c reads from its request (or the site's default): a
 * misfit is rejected or warned about as host_mem= and action= say, in the
 * user's own terms ("to fit: --mem=162G (#SBATCH line 3 of train.sh)"). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "plugin.h"

static const char *const kind_unit[] = { "node", "CPU", "GPU", "node" };

/* The request option with the value replaced by `value` (NULL: the user's):
 * as a suggestion "--mem=162G", "#SBATCH --mem=162G (train.sh line 3)",
 * "SBATCH_MEM_PER_NODE=162G"; as a description (where) "--mem=64G, #SBATCH
 * line 3 of train.sh" (the GPU request's words). */
static void spell(const struct mmg_check *chk, const char *value, int where, char *out, size_t n)
{
    const struct mmg_optval *o = chk->req.mem.src;
    const struct mmg_memnode *m = &chk->host.node;
    const char *v = value ? value : o ? o->value : "?";
    if (!o || m->from_default || o->from == MMG_FROM_ALLOC)
        snprintf(out, n, "--mem=%.60s", v);
    else if (o->from == MMG_FROM_SCRIPT && where)
        snprintf(out, n, "%s=%.60s, #SBATCH line %u of %.60s", o->spelled, v, o->line,
                 chk->req.in.script_name);
    else if (o->from == MMG_FROM_SCRIPT)
        snprintf(out, n, "#SBATCH %s=%.60s (%.60s line %u)", o->spelled, v,
                 chk->req.in.script_name, o->line);
    else
        snprintf(out, n, "%s=%.60s", o->spelled, v);
}

/* What the node gets, in the user's words. */
static void describe(struct mmg_check *chk)
{
    struct mmg_hostcheck *h = &chk->host;
    const struct mmg_memnode *m = &h->node;
    char own[200], b[32];
    static const char *const defkey[] = { "def_mem_per_node", "def_mem_per_cpu", "def_mem_per_gpu" };
    spell(chk, NULL, 1, own, sizeof(own));
    if (m->kind == MMG_MEMK_WHOLE)
        snprintf(h->request, sizeof(h->request), "a whole node: %s, node_mem in mmguard.conf",
                 m->from_default ? "no --mem and no def_mem_* default" : own);
    else if (m->from_default) {
        uint32_t k = m->kind == MMG_MEMK_CPU ? m->cpus : m->ranks;
        mm_format_bytes(m->per_mb * MMG_MB, b, sizeof(b));
        if (m->kind == MMG_MEMK_NODE)
            snprintf(h->request, sizeof(h->request), "no --mem: the site's %s=%s", defkey[0], b);
        else
            snprintf(h->request, sizeof(h->request), "no --mem: the site's %s=%s x %" PRIu32
                     " %s%s", defkey[m->kind], b, k, kind_unit[m->kind], k == 1 ? "" : "s");
    } else if (m->kind == MMG_MEMK_NODE)
        snprintf(h->request, sizeof(h->request), "%s", own);
    else
        snprintf(h->request, sizeof(h->request), "%s x %" PRIu32 " %s%s", own,
                 m->kind == MMG_MEMK_CPU ? m->cpus : m->ranks, kind_unit[m->kind],
                 (m->kind == MMG_MEMK_CPU ? m->cpus : m->ranks) == 1 ? "" : "s");
}

/* Not checked: said when the spec offloads (then it matters), else silent. */
static void unchecked(struct mmg_check *chk, const char *why)
{
    char b[32];
    chk->host.result = MMG_HOST_UNCHECKED;
    snprintf(chk->host.reason, sizeof(chk->host.reason), "host memory not checked: %s", why);
    if (chk->host.per_rank == 0)
        return;
    mm_format_bytes(chk->host.need, b, sizeof(b));
    mmg_check_line(chk, "host memory not checked (%s needed per node): %s", b, why);
}

/* Cannot tell what the node gets: on_error, as for the GPU request. */
static void unknown(struct mmg_check *chk, const char *why)
{
    int allow = chk->cfg.on_error == MMG_ONERR_ALLOW;
    chk->host.result = MMG_HOST_UNKNOWN;
    snprintf(chk->host.reason, sizeof(chk->host.reason), "cannot tell the job's host memory: %s",
             why);
    mmg_check_line(chk, "%s", chk->host.reason);
    if (allow) {
        mmg_check_line(chk, "on_error=allow: host memory not checked");
        return;
    }
    chk->decision = MMG_ERROR;
    chk->blocks = 1;
    snprintf(chk->reason, sizeof(chk->reason), "%s", chk->host.reason);
    mmg_check_line(chk, "on_error=reject: job not submitted");
}

/* "161.0 GiB per node (4 GPU processes x (37.3 GiB offloaded + 3.0 GiB runtime))" */
static void need_text(const struct mmg_hostcheck *h, char *out, size_t n)
{
    char b1[32], b2[32], b3[32];
    mm_format_bytes(h->need, b1, sizeof(b1));
    mm_format_bytes(h->per_rank, b2, sizeof(b2));
    mm_format_bytes(h->overhead, b3, sizeof(b3));
    snprintf(out, n, "%s per node (%" PRIu32 " GPU process%s x (%s offloaded + %s runtime))", b1,
             h->node.ranks, h->node.ranks == 1 ? "" : "es", b2, b3);
}

static void misfit(struct mmg_check *chk)
{
    struct mmg_hostcheck *h = &chk->host;
    mmg_decision sev = chk->cfg.host_mem == MMG_HOSTMEM_CHECK &&
                       chk->cfg.action == MMG_ACTION_REJECT ? MMG_REJECT : MMG_WARN;
    char need[200], have[32], fix[260];
    size_t len = strlen(chk->reason);

    h->result = MMG_HOST_MISFIT;
    need_text(h, need, sizeof(need));
    mm_format_bytes(h->node.have_bytes, have, sizeof(have));
    snprintf(h->reason, sizeof(h->reason), "predicted host memory %s does not fit the %s the job "
             "gets (%s)", need, have, h->request);
    if (sev > chk->decision) {
        chk->decision = sev;
        chk->blocks = sev == MMG_REJECT;
    }
    snprintf(chk->reason + len, sizeof(chk->reason) - len, "; %s", h->reason);
    mmg_check_line(chk, "--mm-model=%s: %s%s", chk->spec_arg,
                   sev == MMG_REJECT ? "job rejected: " : "warning: ", h->reason);
    if (h->node.kind == MMG_MEMK_WHOLE) {
        mmg_check_line(chk, "to fit: a node holds no more: fewer GPU processes per node (more "
                       "nodes) or less CPU offload (deepspeed.offload_param, offload_optimizer)");
    } else {
        spell(chk, h->ask, 0, fix, sizeof(fix));
        mmg_check_line(chk, "to fit: %s", fix);
    }
    if (sev == MMG_WARN)
        mmg_check_line(chk, "%s: submitting anyway", chk->cfg.host_mem == MMG_HOSTMEM_WARN
                       ? "host_mem=warn" : "action=warn");
}

static void fits(struct mmg_check *chk)
{
    struct mmg_hostcheck *h = &chk->host;
    char need[200], have[32];
    h->result = MMG_HOST_FITS;
    need_text(h, need, sizeof(need));
    mm_format_bytes(h->node.have_bytes, have, sizeof(have));
    snprintf(h->reason, sizeof(h->reason), "predicted host memory %s fits the %s the job gets "
             "(%s)", need, have, h->request);
    if (h->per_rank)
        mmg_check_line(chk, "%s", h->reason);
}

void mmg_host_check(struct mmg_check *chk)
{
    struct mmg_hostcheck *h = &chk->host;
    struct mmg_memsite site;
    char err[256];
    mmg_mem_status st;

    if (!chk->have_pred || chk->decision == MMG_ERROR || chk->cfg.host_mem == MMG_HOSTMEM_OFF)
        return;
    h->per_rank = chk->pred.host_peak_bytes;
    h->overhead = chk->cfg.host_overhead;
    if (!chk->have_req || chk->req.status != MMG_REQ_OK) {
        unchecked(chk, "the job's GPUs per node are not known (--mm-gpus)");
        return;
    }
    if (!chk->req.mem_ok) {
        unknown(chk, chk->req.mem_why);
        return;
    }
    site.def_per_node = chk->cfg.def_mem_per_node;
    site.def_per_cpu = chk->cfg.def_mem_per_cpu;
    site.def_per_gpu = chk->cfg.def_mem_per_gpu;
    site.node_mem = chk->cfg.node_mem;
    site.max_gpus_per_node = chk->cfg.max_gpus_per_node;
    st = mmg_mem_eval(&chk->req.mem, &chk->req.job, &chk->req.gpus, &site, &h->node, err,
                      sizeof(err));
    if (st == MMG_MEM_UNKNOWN) {
        unknown(chk, err);
        return;
    }
    h->need = mmg_mem_need(h->node.ranks, h->per_rank, h->overhead);
    if (st == MMG_MEM_WHOLE) {
        unchecked(chk, h->node.from_default
                           ? "the job gets a whole node's memory (no --mem, and no def_mem_* in "
                             "mmguard.conf), whose size is not configured (node_mem)"
                           : "--mem=0 gives the job a whole node's memory, whose size is not "
                             "configured (node_mem)");
        return;
    }
    mmg_mem_ask(&h->node, h->need, h->ask, sizeof(h->ask));
    describe(chk);
    if (h->need > h->node.have_bytes)
        misfit(chk);
    else
        fits(chk);
}
