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

static void request_phrase(const struct mmg_check *chk, char *buf, size_t n);

/* The data-parallel degree of n GPUs: a tensor-parallel spec spreads each
 * model replica over tp of them (torchtitan's mesh: dp x tp = world size). */
static uint32_t dp_of(const struct mmg_check *chk, uint32_t n)
{
    return n / chk->tp;
}

/* The spec at the judged data-parallel degree: the GPUs over its
 * tensor-parallel degree, which must divide them. */
static int spec_at_dp(struct mmg_check *chk)
{
    char msg[2048], assign[64], what[600];
    mm_error e;
    memset(&e, 0, sizeof(e));
    if (chk->spec_err[0])
        return set_error(chk, chk->spec_err);
    chk->spec_dp = mm_spec_data_parallel(chk->spec);
    chk->tp = mm_spec_tensor_parallel(chk->spec);
    if (chk->dp % chk->tp) {
        request_phrase(chk, what, sizeof(what));
        snprintf(msg, sizeof(msg), "--mm-model=%s: training.tensor_parallel=%" PRIu32 " splits each "
                 "model replica over %" PRIu32 " GPUs, but the job gets %.500s: ask for a multiple "
                 "of %" PRIu32 " GPUs", chk->spec_arg, chk->tp, chk->tp, what, chk->tp);
        return set_error(chk, msg);
    }
    if (chk->spec_dp == dp_of(chk, chk->dp))
        return 0;
    snprintf(assign, sizeof(assign), "training.data_parallel=%" PRIu32, dp_of(chk, chk->dp));
    if (mm_spec_set(chk->spec, assign, &e) != 0) {
        if (chk->tp > 1)
            snprintf(msg, sizeof(msg), "--mm-model=%s: %" PRIu32 " GPUs = training.data_parallel=%"
                     PRIu32 " x training.tensor_parallel=%" PRIu32 ": %s", chk->spec_arg, chk->dp,
                     dp_of(chk, chk->dp), chk->tp, e.msg);
        else
            snprintf(msg, sizeof(msg), "--mm-model=%s: %" PRIu32 " GPUs: %s", chk->spec_arg,
                     chk->dp, e.msg);
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

/* a node range starting at one GPU is judged at the next total too (going
 * from 1 to 2 GPUs adds NCCL); 0 when not */
static uint32_t next_count(const struct mmg_check *chk)
{
    const struct mmg_gpureq *g = &chk->req.gpus;
    if (mmg_opts.gpus || !chk->have_req || chk->req.status != MMG_REQ_OK ||
        g->kind != MMG_PER_NODE || g->nodes_max <= g->nodes_min || chk->dp != 1)
        return 0;
    return mmg_gpureq_total(g, g->nodes_min + 1);
}

/* GPU counts ns[0..k) as data-parallel degrees, in place, those the
 * tensor-parallel degree does not divide left out; their number */
static size_t dp_degrees(const struct mmg_check *chk, uint32_t *ns, size_t k)
{
    size_t out = 0;
    for (size_t i = 0; i < k; i++)
        if (ns[i] % chk->tp == 0)
            ns[out++] = dp_of(chk, ns[i]);
    return out;
}

/* The uncapped peak model at the judged degree (and the degrees
 * job_submit.lua may judge): MMGUARD_PEAK_BYTES, the explanation. */
static int predict(struct mmg_check *chk)
{
    char msg[2048];
    mm_error e;
    uint32_t ns[MMG_RECORD_POINTS], n2 = next_count(chk);
    size_t k;
    memset(&e, 0, sizeof(e));
    chk->usable = mmg_config_usable(&chk->cfg, chk->gpu->bytes);
    /* the verdict at the spec's own N comes with the prediction: one step
     * log, one uncapped replay for both (judge_card) */
    if (mm_predict_verdict(chk->spec, chk->gpu->bytes, chk->usable, &chk->pred, &chk->verdict,
                           &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: prediction failed: %s", chk->spec_arg, e.msg);
        return set_error(chk, msg);
    }
    chk->have_pred = 1;
    k = ctld_degrees(chk, ns, MMG_RECORD_POINTS - 2); /* + n2 + the own N: <= 64 points */
    if (n2)
        ns[k++] = n2;
    k = dp_degrees(chk, ns, k);
    if (k && mm_dp_cover(chk->spec, &chk->pred, ns, k, &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: prediction failed: %s", chk->spec_arg, e.msg);
        return set_error(chk, msg);
    }
    chk->peak = mm_peak_for_dp(&chk->pred, dp_of(chk, chk->dp));
    if (n2 && mm_peak_for_dp(&chk->pred, dp_of(chk, n2)) > chk->peak)
        chk->peak = mm_peak_for_dp(&chk->pred, dp_of(chk, n2));
    chk->alloc_peak = chk->pred.allocated_peak_bytes;
    return 0;
}

/* The spec's verdict at n GPUs on the judged card (docs/allocator.md). */
static int verdict_at(struct mmg_check *chk, uint32_t n, mm_verdict *v, mm_error *e)
{
    char assign[64];
    mm_spec *c;
    int rc;
    if (n == chk->dp)
        return mm_verdict_for(chk->spec, chk->gpu->bytes, chk->usable, 0, v, e);
    if (!(c = mm_spec_clone(chk->spec))) {
        snprintf(e->msg, sizeof(e->msg), "out of memory");
        return -1;
    }
    snprintf(assign, sizeof(assign), "training.data_parallel=%" PRIu32, dp_of(chk, n));
    rc = mm_spec_set(c, assign, e) != 0 ? -1
       : mm_verdict_for(c, chk->gpu->bytes, chk->usable, 0, v, e);
    mm_spec_free(c);
    return rc;
}

/* a worse than b: out of memory, then flushes, then more retries, then a
 * higher peak on the card */
static int worse(const mm_verdict *a, const mm_verdict *b)
{
    if (a->kind != b->kind)
        return a->kind > b->kind;
    if (a->retries_step != b->retries_step)
        return a->retries_step > b->retries_step;
    return a->reserved_peak + a->context_bytes > b->reserved_peak + b->context_bytes;
}

/* The capacity-aware verdict: the caching allocator replayed at the
 * capacity the judged card leaves it (one replay, no boundary search); a
 * node range at its worst count. */
static int judge_card(struct mmg_check *chk)
{
    char msg[2048];
    mm_error e;
    mm_verdict v2;
    uint32_t n2 = next_count(chk);
    memset(&e, 0, sizeof(e));
    chk->worst_dp = chk->dp;
    /* chk->verdict, at chk->dp: predict()'s */
    if (n2 && verdict_at(chk, n2, &v2, &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: prediction failed: %s", chk->spec_arg, e.msg);
        return set_error(chk, msg);
    }
    chk->have_verdict = 1;
    mmg_card_from_verdict(&chk->cards[chk->n_cards], chk->gpu->name, &chk->verdict);
    chk->cards[chk->n_cards++].n = chk->dp; /* cards= are by GPU count */
    if (n2) {
        mmg_card_from_verdict(&chk->cards[chk->n_cards], chk->gpu->name, &v2);
        chk->cards[chk->n_cards++].n = n2;
        if (worse(&v2, &chk->verdict)) {
            chk->verdict = v2;
            chk->worst_dp = n2;
        }
    }
    return 0;
}

/* The GPU type slurmctld judges (the request's, else default_gpu) and, for
 * action=resize, the resize_types with more memory: into names/mem/usable
 * after the judged card.  Their count. */
static size_t ctld_types(const struct mmg_check *chk, const char **names, uint64_t *mem,
                         uint64_t *usable, size_t max)
{
    const struct mmg_gpureq *g = &chk->req.gpus;
    int known = chk->have_req && chk->req.status == MMG_REQ_OK;
    const struct mmg_gpu *own = mmg_config_gpu(&chk->cfg, known && g->type[0] ? g->type
                                                                            : chk->cfg.default_gpu);
    char list[sizeof(chk->cfg.resize_types)], *save = NULL;
    size_t k = 0;
    const struct mmg_gpu *t;
    names[k] = chk->gpu->name, mem[k] = chk->gpu->bytes, usable[k++] = chk->usable;
    if (own && own != chk->gpu)
        names[k] = own->name, mem[k] = own->bytes, usable[k++] = mmg_config_usable(&chk->cfg, own->bytes);
    if (!own || chk->cfg.action != MMG_ACTION_RESIZE)
        return k;
    snprintf(list, sizeof(list), "%s", chk->cfg.resize_types);
    for (char *w = strtok_r(list, ",", &save); w && k < max; w = strtok_r(NULL, ",", &save))
        if ((t = mmg_config_gpu(&chk->cfg, w)) && t->bytes > own->bytes && t != chk->gpu)
            names[k] = t->name, mem[k] = t->bytes, usable[k++] = mmg_config_usable(&chk->cfg, t->bytes);
    return k;
}

/* The verdicts job_submit.lua decides by (record.h cards=): every type it
 * may judge or move the job to at every count it may judge (ctld_degrees);
 * the judged card's are there already.  A count the spec cannot be judged at
 * (past its data_parallel limit) is left out: job_submit.lua then says it has
 * no verdict there, and this check's own decision stands. */
static void publish_cards(struct mmg_check *chk)
{
    const char *names[MMG_MAX_GPU_TYPES + 2];
    uint64_t mem[MMG_MAX_GPU_TYPES + 2], usable[MMG_MAX_GPU_TYPES + 2];
    uint32_t ns[MMG_RECORD_POINTS];
    mm_error e;
    size_t nt = ctld_types(chk, names, mem, usable, MMG_MAX_GPU_TYPES + 2);
    size_t k = ctld_degrees(chk, ns, MMG_RECORD_POINTS);
    memset(&e, 0, sizeof(e));
    (void)mmg_cards_add(chk->cards, &chk->n_cards, chk->spec, nt, names, mem, usable, k, ns, &e);
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

/* what the verdict is, in chk->reason: the card's peak (never above it) */
static void verdict_reason(struct mmg_check *chk)
{
    const mm_verdict *v = &chk->verdict;
    char b1[32], b2[32], b3[32], what[600];
    size_t used;
    uint64_t need = v->kind == MM_VERDICT_OOM ? v->reserved_uncapped : v->reserved_peak;
    mm_format_bytes(need + v->context_bytes, b1, sizeof(b1));
    mm_format_bytes(chk->usable, b2, sizeof(b2));
    mm_format_bytes(chk->gpu->bytes, b3, sizeof(b3));
    request_phrase(chk, what, sizeof(what));
    used = (size_t)snprintf(chk->reason, sizeof(chk->reason),
                            "predicted peak %s per GPU %s %s (%s usable of %s) with %.500s", b1,
                            v->kind == MM_VERDICT_OOM ? "does not fit" : "fits", chk->gpu->name,
                            b2, b3, what);
    if (used < sizeof(chk->reason) && v->kind == MM_VERDICT_FLUSHES && !v->retries_step)
        used += (size_t)snprintf(chk->reason + used, sizeof(chk->reason) - used,
                                 " only with cache flushes (cudaMalloc retries in the first step "
                                 "only)");
    else if (used < sizeof(chk->reason) && v->kind == MM_VERDICT_FLUSHES)
        used += (size_t)snprintf(chk->reason + used, sizeof(chk->reason) - used,
                                 " only with cache flushes (%" PRIu64 " cudaMalloc retr%s per step)",
                                 v->retries_step, v->retries_step == 1 ? "y" : "ies");
    if (used < sizeof(chk->reason) && v->kind == MM_VERDICT_OOM)
        used += (size_t)snprintf(chk->reason + used, sizeof(chk->reason) - used,
                                 ": out of memory at %s", v->oom_event);
    if (used < sizeof(chk->reason) && chk->worst_dp != chk->dp)
        snprintf(chk->reason + used, sizeof(chk->reason) - used, "; highest with %" PRIu32 " GPUs",
                 chk->worst_dp);
}

/* The lines after the verdict: what the bytes are, and what a flush costs. */
static void verdict_lines(struct mmg_check *chk)
{
    const mm_verdict *v = &chk->verdict;
    char live[32], cache[32], ctx[32], rq[32], rs[32], lf[32], cap[32];
    uint64_t unc = v->reserved_uncapped;
    mm_format_bytes(v->allocated_peak, live, sizeof(live));
    mm_format_bytes(unc > v->allocated_peak ? unc - v->allocated_peak : 0, cache, sizeof(cache));
    mm_format_bytes(v->context_bytes, ctx, sizeof(ctx));
    mm_format_bytes(v->capacity, cap, sizeof(cap));
    if (v->kind == MM_VERDICT_FLUSHES)
        mmg_check_line(chk, "the caching allocator frees its cache and retries cudaMalloc %" PRIu64
                       " time%s per step (%" PRIu64 " over the first two steps, num_alloc_retries); "
                       "each flush synchronises the device: slower, not out of memory", v->retries_step,
                       v->retries_step == 1 ? "" : "s", v->retries);
    if (v->kind == MM_VERDICT_OOM) {
        mm_format_bytes(v->oom_request, rq, sizeof(rq));
        mm_format_bytes(v->oom_reserved, rs, sizeof(rs));
        mm_format_bytes(v->oom_largest_free, lf, sizeof(lf));
        mmg_check_line(chk, "out of memory at %s: a request of %s with %s reserved after freeing "
                       "the cache (largest free block %s); the allocator has %s", v->oom_event,
                       rq, rs, lf, cap);
    }
    if (v->kind != MM_VERDICT_FITS)
        mmg_check_line(chk, "without a limit: live tensors %s + allocator cache %s; outside the "
                       "allocator: CUDA context%s %s", live, cache,
                       v->n > 1 ? " and NCCL" : "", ctx);
}

static void decide(struct mmg_check *chk)
{
    int flushes = chk->verdict.kind == MM_VERDICT_FLUSHES;
    const char *prefix = "";
    chk->misfit = chk->verdict.kind == MM_VERDICT_OOM ||
                  (flushes && chk->cfg.flush == MMG_FLUSH_REJECT);
    verdict_reason(chk);
    if (!chk->misfit) {
        chk->decision = flushes && chk->cfg.flush == MMG_FLUSH_WARN ? MMG_WARN : MMG_ACCEPT;
        prefix = chk->decision == MMG_WARN ? "warning: " : "";
    } else {
        chk->decision = chk->cfg.action == MMG_ACTION_REJECT ? MMG_REJECT : MMG_WARN;
        chk->blocks = chk->decision == MMG_REJECT;
        prefix = chk->blocks ? "job rejected: " : "warning: ";
    }
    mmg_check_line(chk, "--mm-model=%s: %s%s", chk->spec_arg, prefix, chk->reason);
    if (chk->spec_dp != dp_of(chk, chk->dp) && chk->tp > 1)
        mmg_check_line(chk, "judged at %" PRIu32 " GPUs: training.data_parallel=%" PRIu32 " x "
                       "training.tensor_parallel=%" PRIu32 ", not the spec's training.data_parallel=%"
                       PRIu32, chk->dp, dp_of(chk, chk->dp), chk->tp, chk->spec_dp);
    else if (chk->spec_dp != chk->dp && chk->tp <= 1)
        mmg_check_line(chk, "judged at %" PRIu32 " GPU%s, not the spec's training.data_parallel=%"
                       PRIu32, chk->dp, chk->dp == 1 ? "" : "s", chk->spec_dp);
    verdict_lines(chk);
    if (flushes)
        mmg_check_line(chk, "flush=%s: %s", mmg_flush_name(chk->cfg.flush),
                       chk->cfg.flush == MMG_FLUSH_ACCEPT ? "submitted"
                       : chk->cfg.flush == MMG_FLUSH_WARN ? "submitting; the job runs, slower"
                       : "a job that needs cache flushes does not fit here");
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
    if (judge_request(chk, tool) || spec_at_dp(chk) || predict(chk) || judge_card(chk))
        return;
    publish_cards(chk);
    decide(chk);
    if (!chk->misfit && chk->cfg.max_micro_batch) {
        /* only the largest micro-batch: a full mm_fit also searches
         * checkpointing, ZeRO stages and GPU counts, which only a misfit
         * needs.  Judged as this job is, on the card (its capacity-aware
         * verdict; under flush=reject a flush does not fit); the verdict at
         * the job's own count seeds the search.  max_micro_batch=no: not
         * searched (mmb= and MMGUARD_MAX_MICRO_BATCH absent), most of what
         * an accepted --mm-model job costs sbatch (docs/plugin.md "Cost") */
        uint32_t mb = mm_max_micro_batch(chk->spec, chk->gpu->bytes, chk->usable,
                                         chk->cfg.flush == MMG_FLUSH_REJECT,
                                         chk->worst_dp == chk->dp ? &chk->verdict : NULL);
        chk->fit.fits = 1;
        chk->fit.max_micro_batch = mb;
        chk->have_fit = mb > 0;
    } else if (chk->misfit) {
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
