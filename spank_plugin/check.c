/* check.c - the submit-time decision: the site's configuration, the GPUs the
 * job asks for (gather.c), the spec at that data-parallel degree, the
 * prediction, and accept / warn / reject / error.  Runs in sbatch, salloc and
 * srun as the submitting user; explain.c words a misfit, submit.c hands the
 * decision on. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

/* Error decision: the message plus the on_error policy.  A broken
 * configuration always blocks: its on_error line may be the broken one.  The
 * spec's own error (file:line: key) comes first, whatever else is wrong, so a
 * user fixes both at once. */
static int set_error(struct mmg_check *chk, const char *what)
{
    int allow = chk->cfg_ok && chk->cfg.on_error == MMG_ONERR_ALLOW;
    int both = chk->spec_err[0] && what != chk->spec_err;
    chk->decision = MMG_ERROR;
    chk->blocks = !allow;
    snprintf(chk->reason, sizeof(chk->reason), "%.500s%s%.500s", both ? chk->spec_err : "",
             both ? "; " : "", what);
    if (both)
        mmg_check_line(chk, "%s", chk->spec_err);
    mmg_check_line(chk, "%s", what);
    mmg_check_line(chk, allow ? "on_error=allow: submitting without a GPU memory check"
                              : "on_error=reject: job not submitted");
    return -1;
}

static int load_config(struct mmg_check *chk, int ac, char **av)
{
    char err[1024], msg[1100];
    if (mmg_config_parse_args(&chk->cfg, ac, av, err, sizeof(err)) != 0) {
        snprintf(msg, sizeof(msg), "plugin configuration error: %s", err);
        return set_error(chk, msg);
    }
    chk->cfg_ok = 1;
    return 0;
}

static int unknown_gpu(struct mmg_check *chk, const char *type, const char *from)
{
    char known[512], msg[1024];
    size_t used = 0;
    known[0] = '\0';
    for (size_t i = 0; i < chk->cfg.n_gpus && used < sizeof(known); i++)
        used += (size_t)snprintf(known + used, sizeof(known) - used, "%s%s", i ? ", " : "",
                                 chk->cfg.gpus[i].name);
    snprintf(msg, sizeof(msg), "GPU type '%s' (%s) is not in the site's GPU table (known: %s)",
             type, from, known);
    return set_error(chk, msg);
}

/* The GPU count and type to judge: the request, or --mm-gpus / --mm-gpu. */
static int judge_request(struct mmg_check *chk, mmg_tool tool)
{
    struct mmg_request *rq = &chk->req;
    const char *type = chk->cfg.default_gpu, *from = "default_gpu";
    char msg[1024];

    if (!mmg_opts.gpus || !mmg_opts.gpu) {
        mmg_gather_request(tool, rq);
        chk->have_req = 1;
    }
    if (mmg_opts.gpus) {
        chk->dp = mmg_opts.gpus;
    } else if (rq->status == MMG_REQ_OK) {
        chk->dp = rq->gpus.gpus_min;
    } else if (rq->status == MMG_REQ_NONE) {
        return set_error(chk, "the job asks for no GPU (no --gres=gpu, --gpus, --gpus-per-node or "
                              "--gpus-per-task), so there is nothing to check the spec against");
    } else {
        snprintf(msg, sizeof(msg), "cannot tell how many GPUs the job gets: %s", rq->why);
        return set_error(chk, msg);
    }
    if (mmg_opts.gpu) {
        type = mmg_opts.gpu;
        from = "--mm-gpu";
    } else if (chk->have_req && rq->status == MMG_REQ_OK && rq->gpus.type[0]) {
        type = rq->gpus.type;
        from = "the job's request";
    }
    chk->gpu = mmg_config_gpu(&chk->cfg, type);
    return chk->gpu ? 0 : unknown_gpu(chk, type, from);
}

/* The spec file alone, before the request is known: its error is kept in
 * spec_err and reported with the request's own (set_error). */
static int load_spec(struct mmg_check *chk)
{
    mm_error e;
    memset(&e, 0, sizeof(e));
    chk->spec = mm_spec_load_file(chk->spec_arg, &e);
    if (chk->spec)
        return 0;
    snprintf(chk->spec_err, sizeof(chk->spec_err), "--mm-model=%.*s: invalid spec: %.*s", 256,
             chk->spec_arg, 800, e.msg);
    return -1;
}

/* The spec at the judged data-parallel degree. */
static int spec_at_dp(struct mmg_check *chk)
{
    char msg[2048], assign[64];
    mm_error e;
    memset(&e, 0, sizeof(e));
    if (chk->spec_err[0])
        return set_error(chk, chk->spec_err);
    chk->spec_dp = mm_spec_data_parallel(chk->spec);
    if (chk->spec_dp == chk->dp)
        return 0;
    snprintf(assign, sizeof(assign), "training.data_parallel=%" PRIu32, chk->dp);
    if (mm_spec_set(chk->spec, assign, &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: %" PRIu32 " GPUs: %s", chk->spec_arg, chk->dp,
                 e.msg);
        return set_error(chk, msg);
    }
    return 0;
}

/* The degrees job_submit.lua may judge, so that the published record covers
 * them (the caching allocator is replayed at each; docs/plugin.md, "Cost"):
 * the job's own request - slurmctld judges it, whatever --mm-gpus said -, a
 * node range's next count, and every per-node count it may move the job to
 * (action=resize) or name in a rejection's hint (when it judges another
 * count than this check did: a job this check accepted), at most
 * MMG_RECORD_POINTS in all. */
static size_t ctld_degrees(const struct mmg_check *chk, uint32_t *ns, size_t max)
{
    const struct mmg_gpureq *g = &chk->req.gpus;
    int known = chk->have_req && chk->req.status == MMG_REQ_OK;
    uint32_t nodes = known && g->nodes_min ? g->nodes_min : 1;
    size_t k = 0;
    if (known && g->gpus_min)
        ns[k++] = g->gpus_min;
    if (known && g->kind == MMG_PER_NODE && g->nodes_max > g->nodes_min && g->gpus_min == 1)
        ns[k++] = mmg_gpureq_total(g, g->nodes_min + 1);
    if (chk->cfg.action != MMG_ACTION_RESIZE && !(known && g->gpus_min != chk->dp))
        return k;
    for (uint32_t c = 1; c <= chk->cfg.max_gpus_per_node && k < max; c++)
        if ((uint64_t)c * nodes <= UINT32_MAX)
            ns[k++] = c * nodes;
    return k;
}

/* The peak at the judged degree; for a node range starting at one GPU, also
 * at the next total (the allocated peak never grows with N >= 2, but going
 * from 1 to 2 GPUs adds NCCL), each replayed at its degree. */
static int predict(struct mmg_check *chk)
{
    char msg[2048];
    mm_error e;
    uint32_t ns[MMG_RECORD_POINTS];
    size_t k;
    const struct mmg_gpureq *g = &chk->req.gpus;
    memset(&e, 0, sizeof(e));
    if (mm_predict(chk->spec, &chk->pred, &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: prediction failed: %s", chk->spec_arg, e.msg);
        return set_error(chk, msg);
    }
    chk->have_pred = 1;
    chk->worst_dp = chk->dp;
    k = ctld_degrees(chk, ns, MMG_RECORD_POINTS - 2); /* + n2 + the own N: <= 64 points */
    if (!mmg_opts.gpus && g->kind == MMG_PER_NODE && g->nodes_max > g->nodes_min &&
        chk->dp == 1)
        ns[k++] = mmg_gpureq_total(g, g->nodes_min + 1);
    if (k && mm_dp_cover(chk->spec, &chk->pred, ns, k, &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: prediction failed: %s", chk->spec_arg, e.msg);
        return set_error(chk, msg);
    }
    chk->peak = mm_peak_for_dp(&chk->pred, chk->dp);
    if (!mmg_opts.gpus && g->kind == MMG_PER_NODE && g->nodes_max > g->nodes_min &&
        chk->dp == 1) {
        uint32_t n2 = mmg_gpureq_total(g, g->nodes_min + 1);
        uint64_t p2 = mm_peak_for_dp(&chk->pred, n2);
        if (p2 > chk->peak) {
            chk->peak = p2;
            chk->worst_dp = n2;
        }
    }
    chk->alloc_peak = chk->pred.allocated_peak_bytes;
    chk->usable = mmg_config_usable(&chk->cfg, chk->gpu->bytes);
    return 0;
}

/* "2 GPUs (--gres=gpu:h100:2 on 1 node)" or the --mm-gpus override. */
static void request_phrase(const struct mmg_check *chk, char *buf, size_t n)
{
    if (!mmg_opts.gpus)
        snprintf(buf, n, "%s", chk->req.text);
    else if (chk->have_req && chk->req.status == MMG_REQ_OK && chk->req.gpus.gpus_min != chk->dp)
        snprintf(buf, n, "%" PRIu32 " GPU%s (--mm-gpus=%" PRIu32 "; the job asks for %s)", chk->dp,
                 chk->dp == 1 ? "" : "s", chk->dp, chk->req.text);
    else
        snprintf(buf, n, "%" PRIu32 " GPU%s (--mm-gpus=%" PRIu32 ")", chk->dp,
                 chk->dp == 1 ? "" : "s", chk->dp);
}

static void decide(struct mmg_check *chk)
{
    char b1[32], b2[32], b3[32], what[600];
    int fits = chk->peak <= chk->usable;

    mm_format_bytes(chk->peak, b1, sizeof(b1));
    mm_format_bytes(chk->usable, b2, sizeof(b2));
    mm_format_bytes(chk->gpu->bytes, b3, sizeof(b3));
    request_phrase(chk, what, sizeof(what));
    snprintf(chk->reason, sizeof(chk->reason),
             "predicted peak %s per GPU %s %s (%s usable of %s) with %.500s", b1,
             fits ? "fits" : "does not fit", chk->gpu->name, b2, b3, what);
    if (chk->worst_dp != chk->dp)
        snprintf(chk->reason + strlen(chk->reason), sizeof(chk->reason) - strlen(chk->reason),
                 "; highest with %" PRIu32 " GPUs", chk->worst_dp);
    if (fits) {
        chk->decision = MMG_ACCEPT;
    } else {
        chk->decision = chk->cfg.action == MMG_ACTION_REJECT ? MMG_REJECT : MMG_WARN;
        chk->blocks = chk->decision == MMG_REJECT;
    }
    mmg_check_line(chk, "--mm-model=%s: %s%s", chk->spec_arg,
                   fits ? "" : chk->blocks ? "job rejected: " : "warning: ", chk->reason);
    if (chk->spec_dp != chk->dp)
        mmg_check_line(chk, "judged at %" PRIu32 " GPU%s, not the spec's training.data_parallel=%"
                       PRIu32, chk->dp, chk->dp == 1 ? "" : "s", chk->spec_dp);
}

void mmg_check_run(struct mmg_check *chk, mmg_tool tool, int ac, char **av)
{
    char *real;
    memset(chk, 0, sizeof(*chk));
    chk->source = mmg_tool_name(tool);
    snprintf(chk->spec_arg, sizeof(chk->spec_arg), "%s", mmg_opts.model ? mmg_opts.model : "");
    real = realpath(chk->spec_arg, NULL);
    snprintf(chk->spec_path, sizeof(chk->spec_path), "%s", real ? real : chk->spec_arg);
    free(real);

    if (load_config(chk, ac, av))
        return;
    load_spec(chk); /* its error waits for the request's, so both are told */
    if (judge_request(chk, tool) || spec_at_dp(chk) || predict(chk))
        return;
    decide(chk);
    if (chk->decision == MMG_ACCEPT) {
        /* only the largest micro-batch: a full mm_fit also searches
         * checkpointing, ZeRO stages and GPU counts, which only a misfit needs */
        uint32_t mb = mm_max_micro_batch(chk->spec, chk->usable, &chk->pred);
        chk->fit.fits = 1;
        chk->fit.max_micro_batch = mb;
        chk->have_fit = mb > 0;
    } else {
        mmg_explain_misfit(chk);
        if (chk->decision == MMG_WARN)
            mmg_check_line(chk, "action=%s: submitting anyway", mmg_action_name(chk->cfg.action));
    }
    /* the GPU processes' host memory against the job's --mem (host_mem=) */
    mmg_host_check(chk);
}

void mmg_check_free(struct mmg_check *chk)
{
    if (chk->have_pred)
        mm_prediction_free(&chk->pred);
    if (chk->spec)
        mm_spec_free(chk->spec);
    chk->spec = NULL;
    chk->have_pred = 0;
}
