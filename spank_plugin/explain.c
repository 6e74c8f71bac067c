/* explain.c - what a user reads when the job does not fit: where the memory
 * goes at the peak (factors, modules) and concrete ways to fit, written in the
 * user's own terms: spec keys they can change, and their GPU request rewritten
 * ("ask for 6 GPUs (--gres=gpu:h100:6) with training.zero_stage=3"). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "plugin.h"

static uint64_t module_total(const mm_module_result *m)
{
    uint64_t v[MM_NFACTORS], s = 0;
    mm_factor_values(&m->factors, v);
    for (int i = 0; i < MM_NFACTORS; i++)
        s = (s > UINT64_MAX - v[i]) ? UINT64_MAX : s + v[i];
    return s;
}

/* Where the peak goes: the five tensor factors, then what lies beyond the
 * live tensors on this card - the CUDA context (and NCCL's buffers, N > 1)
 * outside the allocator, and the allocator's cache (reserved - allocated,
 * without a limit) - by name, largest first. */
static void explain_factors(struct mmg_check *chk)
{
    const mm_prediction *p = &chk->pred;
    const mm_verdict *vd = &chk->verdict;
    uint64_t v[MM_NFACTORS + 1], unc = vd->reserved_uncapped;
    const char *names[MM_NFACTORS + 1];
    int idx[MM_NFACTORS + 1];
    char buf[MMG_LINE_MAX], b[32];
    size_t used = 0;
    uint64_t total = 0;

    mm_factor_values(&p->factors, v);
    for (int i = 0; i < MM_NFACTORS - 1; i++)
        names[i] = mm_factor_names[i];
    names[MM_NFACTORS - 1] = vd->n > 1 ? "CUDA context and NCCL" : "CUDA context";
    v[MM_NFACTORS - 1] = vd->context_bytes;
    names[MM_NFACTORS] = "allocator cache";
    v[MM_NFACTORS] = unc > vd->allocated_peak ? unc - vd->allocated_peak : 0;
    for (int i = 0; i <= MM_NFACTORS; i++) {
        idx[i] = i;
        total = total > UINT64_MAX - v[i] ? UINT64_MAX : total + v[i];
    }
    for (int i = 0; i <= MM_NFACTORS; i++)
        for (int j = i + 1; j <= MM_NFACTORS; j++)
            if (v[idx[j]] > v[idx[i]]) {
                int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
            }
    buf[0] = '\0';
    for (int i = 0; i < 3 && v[idx[i]] > 0 && used < sizeof(buf); i++) {
        mm_format_bytes(v[idx[i]], b, sizeof(b));
        used += (size_t)snprintf(buf + used, sizeof(buf) - used, "%s%s %s (%.0f%%)", i ? ", " : "",
                                 names[idx[i]], b,
                                 total ? 100.0 * (double)v[idx[i]] / (double)total : 0.0);
    }
    mmg_check_line(chk, "top factors: %s (peak in %s: %s)", buf, mm_phase_name(p->peak_phase),
                   p->peak_event);
}

static void explain_modules(struct mmg_check *chk)
{
    const mm_prediction *p = &chk->pred;
    size_t order[MM_MAX_MODULES], n = p->n_modules < MM_MAX_MODULES ? p->n_modules : MM_MAX_MODULES;
    char buf[MMG_LINE_MAX], b[32];
    size_t used = 0;

    if (n == 0 || !p->modules)
        return;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = 0; i < n; i++)
        for (size_t j = i + 1; j < n; j++)
            if (module_total(&p->modules[order[j]]) > module_total(&p->modules[order[i]])) {
                size_t t = order[i]; order[i] = order[j]; order[j] = t;
            }
    buf[0] = '\0';
    for (size_t i = 0; i < n && i < 4 && used < sizeof(buf); i++) {
        const mm_module_result *m = &p->modules[order[i]];
        mm_format_bytes(module_total(m), b, sizeof(b));
        used += (size_t)snprintf(buf + used, sizeof(buf) - used, "%s%s %s", i ? ", " : "",
                                 m->name, b);
    }
    mmg_check_line(chk, "top modules: %s", buf);
}

/* The request the suggestions rewrite: the job's own, or (when --mm-gpus
 * replaced an unknown request) a plain per-node --gres request. */
static void suggest_base(const struct mmg_check *chk, struct mmg_reqin *in, struct mmg_gpureq *g)
{
    if (chk->have_req && chk->req.status == MMG_REQ_OK) {
        *in = chk->req.in;
        *g = chk->req.gpus;
        return;
    }
    mmg_reqin_init(in, MMG_TOOL_SBATCH);
    memset(g, 0, sizeof(*g));
    g->kind = MMG_PER_NODE;
    g->nodes_min = g->nodes_max = 1;
    g->count = g->gpus_min = chk->dp;
    snprintf(g->type, sizeof(g->type), "%s", chk->gpu->name);
}

/* whether a verdict fits under the site's flush= policy */
static int acceptable(const struct mmg_check *chk, mm_verdict_kind k)
{
    return k == MM_VERDICT_FITS || (k == MM_VERDICT_FLUSHES && chk->cfg.flush != MMG_FLUSH_REJECT);
}

/* A suggestion's predicted effect, judged as the job is (the capacity-aware
 * verdict on the card): "predicted: fits, peak 38.1 GiB" or "predicted: fits
 * with cache flushes (2 cudaMalloc retries per step: slower)". */
static void effect(const mm_fit_judged *j, char *buf, size_t n)
{
    char t[128];
    if (!j->judged) {
        snprintf(buf, n, "%s", "");
        return;
    }
    mm_fit_judged_text(j, t, sizeof(t));
    snprintf(buf, n, "predicted: %s", t);
}

/* More GPUs of the same type (with a ZeRO stage that shards over them). */
static void suggest_gpus(struct mmg_check *chk, const struct mmg_reqin *in,
                         const struct mmg_gpureq *g)
{
    const mm_fit_result *f = &chk->fit;
    char spelled[MMG_LINE_MAX / 2], with[160] = "", eff[160];
    uint32_t total;
    int zero = mm_spec_zero_stage(chk->spec);

    /* mm_fit's count is the smallest whose verdict on this card fits */
    if (f->min_data_parallel <= chk->dp)
        return;
    total = mmg_request_spell(in, g, f->min_data_parallel, "", chk->cfg.max_gpus_per_node, spelled,
                              sizeof(spelled));
    if (!total)
        return;
    if (f->min_data_parallel_zero > zero)
        snprintf(with, sizeof(with), " with training.zero_stage=%d", f->min_data_parallel_zero);
    if (f->min_data_parallel_ckpt)
        snprintf(with + strlen(with), sizeof(with) - strlen(with), "%s"
                 "training.gradient_checkpointing=true", with[0] ? " and " : " with ");
    effect(&f->dp, eff, sizeof(eff));
    mmg_check_line(chk, "to fit: ask for %" PRIu32 " GPUs (%s)%s%s; %s", total, spelled, with,
                   mmg_opts.gpus ? " and --mm-gpus to match" : "", eff);
}

/* The smallest GPU type of the site's table on which the job fits, by its
 * verdict on that card (one simulated step for all of them). */
static void suggest_type(struct mmg_check *chk, const struct mmg_reqin *in,
                         const struct mmg_gpureq *g)
{
    const struct mmg_gpu *best = NULL, *cand[MMG_MAX_GPU_TYPES];
    uint64_t mem[MMG_MAX_GPU_TYPES], usable[MMG_MAX_GPU_TYPES];
    mm_verdict v[MMG_MAX_GPU_TYPES];
    mm_fit_judged j = {0};
    char b[32], spelled[MMG_LINE_MAX / 2], eff[160];
    size_t k = 0;
    mm_error e;
    for (size_t i = 0; i < chk->cfg.n_gpus && k < MMG_MAX_GPU_TYPES; i++) {
        const struct mmg_gpu *t = &chk->cfg.gpus[i];
        if (t == chk->gpu || t->bytes <= chk->gpu->bytes)
            continue; /* a smaller card than the one it does not fit */
        cand[k] = t, mem[k] = t->bytes, usable[k++] = mmg_config_usable(&chk->cfg, t->bytes);
    }
    memset(&e, 0, sizeof(e));
    if (!k || mm_verdict_cards(chk->spec, k, mem, usable, v, &e) != 0)
        return;
    for (size_t i = 0; i < k; i++) {
        if (!acceptable(chk, v[i].kind) || (best && cand[i]->bytes >= best->bytes))
            continue;
        best = cand[i];
        j = (mm_fit_judged){1, v[i].kind, v[i].retries_step, v[i].retries,
                            v[i].reserved_peak + v[i].context_bytes, v[i].allocated_peak};
    }
    if (!best || !mmg_request_spell(in, g, g->gpus_min, best->name, chk->cfg.max_gpus_per_node,
                                    spelled, sizeof(spelled)))
        return;
    mm_format_bytes(mmg_config_usable(&chk->cfg, best->bytes), b, sizeof(b));
    effect(&j, eff, sizeof(eff));
    mmg_check_line(chk, "to fit: a larger GPU: %s (%s usable)%s%s; %s", spelled, b,
                   mmg_opts.gpu ? " and --mm-gpu=" : "", mmg_opts.gpu ? best->name : "", eff);
}

/* Changes to the spec itself, each with its verdict on this card. */
static void suggest_spec(struct mmg_check *chk)
{
    const mm_fit_result *f = &chk->fit;
    uint32_t mb = mm_spec_micro_batch(chk->spec);
    char eff[160];
    if (f->max_micro_batch > 0 && f->max_micro_batch < mb) {
        effect(&f->at_max, eff, sizeof(eff));
        mmg_check_line(chk, "to fit: training.micro_batch_size=%" PRIu32 " (largest that fits; "
                       "raise gradient_accumulation_steps to keep the global batch); %s",
                       f->max_micro_batch, eff);
    } else if (f->max_micro_batch == 0) {
        mmg_check_line(chk, "to fit: no micro_batch_size fits as configured, not even 1");
    }
    if (f->expandable_helps) {
        effect(&f->expandable, eff, sizeof(eff));
        mmg_check_line(chk, "to fit: export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in "
                       "the job (and device.alloc_conf in the spec); %s", eff);
    }
    if (f->checkpointing_helps) {
        effect(&f->ckpt, eff, sizeof(eff));
        mmg_check_line(chk, "to fit: training.gradient_checkpointing=true (then micro_batch_size "
                       "up to %" PRIu32 " fits); %s", f->max_micro_batch_ckpt, eff);
    }
    if (f->min_zero_stage > mm_spec_zero_stage(chk->spec)) {
        effect(&f->zero, eff, sizeof(eff));
        mmg_check_line(chk, "to fit: training.zero_stage=%d on the same %" PRIu32 " GPUs; %s",
                       f->min_zero_stage, chk->dp, eff);
    }
}

void mmg_explain_misfit(struct mmg_check *chk)
{
    struct mmg_reqin in;
    struct mmg_gpureq g;
    mm_error e;

    memset(&e, 0, sizeof(e));
    chk->have_fit = mm_fit(chk->spec, chk->gpu->bytes, chk->usable,
                           chk->cfg.flush == MMG_FLUSH_REJECT, &chk->fit, &e) == 0;
    explain_factors(chk);
    explain_modules(chk);
    suggest_base(chk, &in, &g);
    if (chk->have_fit) {
        suggest_spec(chk);
        suggest_gpus(chk, &in, &g);
    }
    suggest_type(chk, &in, &g);
}
