/* publish.c - hand the decision on as the one MMGUARD variable (record.h):
 * job_submit.lua reads it at slurmctld (job_desc.spank_job_env), the job's
 * steps find it as SLURM_SPANK_MMGUARD and slurmstepd turns it into the
 * task-side MMGUARD_* variables (remote.c). */
#include <stdio.h>
#include <string.h>

#include "plugin.h"

/* "h100:2x1": type (or "gpu"), GPUs per node/job/task, and the shape. */
static void request_code(const struct mmg_check *chk, char *out, size_t n)
{
    const struct mmg_gpureq *g = &chk->req.gpus;
    const char *t = g->type[0] ? g->type : "gpu";
    if (!chk->have_req || chk->req.status != MMG_REQ_OK)
        out[0] = '\0';
    else if (g->kind == MMG_PER_JOB)
        snprintf(out, n, "%s:%u/job", t, g->count);
    else if (g->kind == MMG_PER_TASK)
        snprintf(out, n, "%s:%ux%u/task", t, g->count, g->tasks);
    else
        snprintf(out, n, "%s:%ux%u-%u/node", t, g->count, g->nodes_min, g->nodes_max);
}

void mmg_record_from_check(const struct mmg_check *chk, struct mmg_record *r)
{
    memset(r, 0, sizeof(*r));
    snprintf(r->decision, sizeof(r->decision), "%s", mmg_decision_name(chk->decision));
    snprintf(r->spec, sizeof(r->spec), "%s", chk->spec_path);
    if (chk->decision == MMG_ERROR)
        snprintf(r->error, sizeof(r->error), "%s", chk->reason);
    if (chk->gpu) {
        snprintf(r->gpu, sizeof(r->gpu), "%s", chk->gpu->name);
        r->gpu_mem = chk->gpu->bytes;
    }
    if (chk->spec) {
        snprintf(r->sha256, sizeof(r->sha256), "%s", mm_spec_digest(chk->spec));
        snprintf(r->model, sizeof(r->model), "%s", mm_spec_name(chk->spec));
    }
    request_code(chk, r->request, sizeof(r->request));
    if (!chk->have_pred)
        return;
    r->usable = chk->usable;
    r->dp = chk->dp;
    r->peak = chk->peak;
    r->alloc = chk->alloc_peak;
    r->has_mmb = chk->have_fit;
    r->mmb = chk->fit.max_micro_batch;
    r->host = chk->pred.host_peak_bytes;
    mmg_record_set_model(r, &chk->pred);
    r->n_cards = chk->n_cards;
    memcpy(r->cards, chk->cards, chk->n_cards * sizeof(r->cards[0]));
}

void mmg_publish(const struct mmg_check *chk, mmg_setenv_f set, void *ctx)
{
    struct mmg_record r;
    char text[MMG_RECORD_MAX + 1];
    mmg_record_from_check(chk, &r);
    if (mmg_record_format(&r, text, sizeof(text)) != 0) {
        /* a spec path or message too long for the record: drop the prose,
         * then the verdicts of the counts job_submit.lua is least likely to
         * judge (the last; the judged card's come first) */
        r.error[0] = '\0';
        while (mmg_record_format(&r, text, sizeof(text)) != 0) {
            if (r.n_cards <= 1)
                return;
            r.n_cards--;
        }
    }
    set(ctx, MMG_VAR, text);
}
