/* check.c - the submit-time check: config, spec, prediction, decision and the
 * explanation the user sees.  Runs in sbatch/salloc/srun as the submitting user. */
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

const char *mmg_decision_name(mmg_decision d)
{
    switch (d) {
    case MMG_ACCEPT: return "accept";
    case MMG_WARN: return "warn";
    case MMG_REJECT: return "reject";
    default: return "error";
    }
}

__attribute__((format(printf, 2, 3)))
static void line(struct mmg_check *chk, const char *fmt, ...)
{
    va_list ap;
    if (chk->n_lines >= MMG_MAX_LINES)
        return;
    va_start(ap, fmt);
    vsnprintf(chk->lines[chk->n_lines++], MMG_LINE_MAX, fmt, ap);
    va_end(ap);
}

static void fmt_b(uint64_t b, char *buf, size_t n)
{
    mm_format_bytes(b, buf, n);
}

/* Error decision: the message plus the on_error policy. */
static void set_error(struct mmg_check *chk, const char *what)
{
    int allow = chk->cfg_ok && chk->cfg.on_error == MMG_ONERR_ALLOW;
    chk->decision = MMG_ERROR;
    chk->blocks = !allow;
    snprintf(chk->reason, sizeof(chk->reason), "%s", what);
    line(chk, "%s", what);
    if (allow)
        line(chk, "on_error=allow: submitting without a GPU memory check");
    else
        line(chk, "on_error=reject: job not submitted");
}

static uint64_t module_total(const mm_module_result *m)
{
    uint64_t v[MM_NFACTORS], s = 0;
    mm_factor_values(&m->factors, v);
    for (int i = 0; i < MM_NFACTORS; i++)
        s = (s > UINT64_MAX - v[i]) ? UINT64_MAX : s + v[i];
    return s;
}

static void explain_breakdown(struct mmg_check *chk)
{
    const mm_prediction *p = &chk->pred;
    uint64_t v[MM_NFACTORS];
    int idx[MM_NFACTORS] = { 0, 1, 2, 3, 4, 5 };
    char buf[MMG_LINE_MAX], b[32];
    size_t used = 0;

    mm_factor_values(&p->factors, v);
    /* the overhead (the last factor) at N (device-level) is peak - allocated */
    v[MM_NFACTORS - 1] = chk->peak > chk->alloc_peak ? chk->peak - chk->alloc_peak
                                                      : v[MM_NFACTORS - 1];
    for (int i = 0; i < MM_NFACTORS; i++)
        for (int j = i + 1; j < MM_NFACTORS; j++)
            if (v[idx[j]] > v[idx[i]]) {
                int t = idx[i]; idx[i] = idx[j]; idx[j] = t;
            }
    buf[0] = '\0';
    for (int i = 0; i < 3 && v[idx[i]] > 0; i++) {
        fmt_b(v[idx[i]], b, sizeof(b));
        used += (size_t)snprintf(buf + used, used < sizeof(buf) ? sizeof(buf) - used : 0,
                                 "%s%s %s (%.0f%%)", i ? ", " : "", mm_factor_names[idx[i]], b,
                                 chk->peak ? 100.0 * (double)v[idx[i]] / (double)chk->peak : 0.0);
        if (used >= sizeof(buf))
            break;
    }
    line(chk, "top factors: %s (peak in %s: %s)", buf, mm_phase_name(p->peak_phase),
         p->peak_event);

    /* modules by contribution at the peak */
    if (p->n_modules > 0 && p->modules) {
        size_t order[MM_MAX_MODULES], n = p->n_modules < MM_MAX_MODULES ? p->n_modules
                                                                         : MM_MAX_MODULES;
        for (size_t i = 0; i < n; i++)
            order[i] = i;
        for (size_t i = 0; i < n; i++)
            for (size_t j = i + 1; j < n; j++)
                if (module_total(&p->modules[order[j]]) > module_total(&p->modules[order[i]])) {
                    size_t t = order[i]; order[i] = order[j]; order[j] = t;
                }
        used = 0;
        buf[0] = '\0';
        for (size_t i = 0; i < n && i < 4; i++) {
            const mm_module_result *m = &p->modules[order[i]];
            fmt_b(module_total(m), b, sizeof(b));
            used += (size_t)snprintf(buf + used, used < sizeof(buf) ? sizeof(buf) - used : 0,
                                     "%s%s %s", i ? ", " : "", m->name, b);
            if (used >= sizeof(buf))
                break;
        }
        line(chk, "top modules: %s", buf);
    }
}

static void explain_fixes(struct mmg_check *chk)
{
    const mm_fit_result *f = &chk->fit;
    char b[32];
    uint32_t mb = mm_spec_micro_batch(chk->spec);
    int zero = mm_spec_zero_stage(chk->spec);
    const struct mmg_gpu *best = NULL;

    if (chk->have_fit) {
        if (f->max_micro_batch > 0 && f->max_micro_batch < mb)
            line(chk, "to fit: training.micro_batch_size=%" PRIu32 " (largest that fits; "
                 "raise gradient_accumulation_steps to keep the global batch)",
                 f->max_micro_batch);
        else if (f->max_micro_batch == 0)
            line(chk, "to fit: no micro_batch_size fits as configured, not even 1");
        if (f->checkpointing_helps)
            line(chk, "to fit: training.gradient_checkpointing=true (then micro_batch_size up "
                 "to %" PRIu32 " fits)", f->max_micro_batch_ckpt);
        if (f->min_zero_stage > zero)
            line(chk, "to fit: training.zero_stage=%d on %" PRIu32 " GPUs", f->min_zero_stage,
                 chk->dp);
        if (f->min_data_parallel > chk->dp)
            line(chk, "to fit: train on %" PRIu32 " GPUs (--mm-gpus=%" PRIu32
                 ") with training.zero_stage=%d", f->min_data_parallel, f->min_data_parallel,
                 f->min_data_parallel_zero);
    }
    /* the smallest GPU type of the table that holds the peak */
    for (size_t i = 0; i < chk->cfg.n_gpus; i++) {
        const struct mmg_gpu *g = &chk->cfg.gpus[i];
        if (g == chk->gpu || mmg_config_usable(&chk->cfg, g->bytes) < chk->peak)
            continue;
        if (!best || g->bytes < best->bytes)
            best = g;
    }
    if (best) {
        fmt_b(mmg_config_usable(&chk->cfg, best->bytes), b, sizeof(b));
        line(chk, "to fit: a larger GPU: --mm-gpu=%s (%s usable)", best->name, b);
    }
}

static uint64_t ceil_div(uint64_t a, uint32_t n)
{
    return n ? a / n + (a % n != 0) : a;
}

void mmg_check_run(struct mmg_check *chk, const char *source, int ac, char **av)
{
    char err[1024], b1[32], b2[32], b3[32], msg[3072];
    char *real;
    mm_error e;

    memset(chk, 0, sizeof(*chk));
    memset(&e, 0, sizeof(e));
    chk->source = source;
    snprintf(chk->spec_arg, sizeof(chk->spec_arg), "%s", mmg_opts.model ? mmg_opts.model : "");
    real = realpath(chk->spec_arg, NULL);
    snprintf(chk->spec_path, sizeof(chk->spec_path), "%s", real ? real : chk->spec_arg);
    free(real);

    if (mmg_config_parse_args(&chk->cfg, ac, av, err, sizeof(err)) != 0) {
        /* the admin's configuration is broken: on_error cannot be trusted */
        snprintf(msg, sizeof(msg), "plugin configuration error: %s", err);
        set_error(chk, msg);
        return;
    }
    chk->cfg_ok = 1;

    chk->gpu = mmg_config_gpu(&chk->cfg, mmg_opts.gpu ? mmg_opts.gpu : chk->cfg.default_gpu);
    if (!chk->gpu) {
        size_t used = 0;
        err[0] = '\0';
        for (size_t i = 0; i < chk->cfg.n_gpus && used < sizeof(err); i++)
            used += (size_t)snprintf(err + used, sizeof(err) - used, "%s%s", i ? ", " : "",
                                     chk->cfg.gpus[i].name);
        snprintf(msg, sizeof(msg), "--mm-gpu=%s: unknown GPU type (known: %s)", mmg_opts.gpu,
                 err);
        set_error(chk, msg);
        return;
    }

    chk->spec = mm_spec_load_file(chk->spec_arg, &e);
    if (!chk->spec) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: invalid spec: %s", chk->spec_arg, e.msg);
        set_error(chk, msg);
        return;
    }
    if (mmg_opts.gpus) {
        char assign[64];
        snprintf(assign, sizeof(assign), "training.data_parallel=%" PRIu32, mmg_opts.gpus);
        if (mm_spec_set(chk->spec, assign, &e) != 0) {
            snprintf(msg, sizeof(msg), "--mm-gpus=%" PRIu32 ": %s", mmg_opts.gpus, e.msg);
            set_error(chk, msg);
            return;
        }
    }
    chk->dp = mm_spec_data_parallel(chk->spec);

    if (mm_predict(chk->spec, &chk->pred, &e) != 0) {
        snprintf(msg, sizeof(msg), "--mm-model=%s: prediction failed: %s", chk->spec_arg, e.msg);
        set_error(chk, msg);
        return;
    }
    chk->have_pred = 1;
    chk->peak = mm_peak_for_dp(&chk->pred, chk->dp);
    chk->alloc_peak = chk->pred.allocated_peak_bytes;
    for (size_t k = 0, best = 0; k < chk->pred.n_terms && k < MM_MAX_TERMS; k++) {
        uint64_t v = chk->pred.terms[k].fixed + ceil_div(chk->pred.terms[k].sharded, chk->dp);
        if (k == 0 || v > best) {
            best = v;
            chk->dom_term = k;
        }
    }
    chk->usable = mmg_config_usable(&chk->cfg, chk->gpu->bytes);

    fmt_b(chk->peak, b1, sizeof(b1));
    fmt_b(chk->usable, b2, sizeof(b2));
    fmt_b(chk->gpu->bytes, b3, sizeof(b3));
    if (chk->peak <= chk->usable) {
        /* only the largest micro-batch: a full mm_fit also searches
         * checkpointing, ZeRO stages and GPU counts, which only a misfit needs */
        uint32_t mb = mm_max_micro_batch(chk->spec, chk->usable, &chk->pred);
        if (mb > 0) {
            chk->fit.fits = 1;
            chk->fit.peak_bytes = chk->peak;
            chk->fit.max_micro_batch = mb;
            chk->have_fit = 1;
        }
        chk->decision = MMG_ACCEPT;
        snprintf(chk->reason, sizeof(chk->reason),
                 "predicted peak %s per GPU fits %s (%s usable of %s) on %" PRIu32 " GPU(s)",
                 b1, chk->gpu->name, b2, b3, chk->dp);
        line(chk, "--mm-model=%s: %s", chk->spec_arg, chk->reason);
        return;
    }
    if (mm_fit(chk->spec, chk->usable, &chk->fit, &e) == 0)
        chk->have_fit = 1;
    chk->decision = chk->cfg.action == MMG_ACTION_REJECT ? MMG_REJECT : MMG_WARN;
    chk->blocks = chk->decision == MMG_REJECT;
    snprintf(chk->reason, sizeof(chk->reason),
             "predicted peak %s per GPU does not fit %s (%s usable of %s) on %" PRIu32
             " GPU(s)", b1, chk->gpu->name, b2, b3, chk->dp);
    line(chk, "--mm-model=%s: %s: %s", chk->spec_arg,
         chk->decision == MMG_REJECT ? "job rejected" : "warning", chk->reason);
    explain_breakdown(chk);
    explain_fixes(chk);
    if (chk->decision == MMG_WARN)
        line(chk, "action=%s: submitting anyway", mmg_action_name(chk->cfg.action));
}

int mmg_check_submit(const char *source, mmg_setenv_f set, void *ctx, int ac, char **av)
{
    struct mmg_check *chk = calloc(1, sizeof(*chk));
    int rc;

    if (!chk) {
        slurm_error(MMG_PREFIX "--mm-model: out of memory");
        return -1;
    }
    mmg_check_run(chk, source, ac, av);
    mmg_check_print(chk);
    mmg_publish(chk, set, ctx);
    mmg_log_decision(chk);
    rc = chk->blocks ? -1 : 0;
    mmg_check_free(chk);
    free(chk);
    return rc;
}

void mmg_check_print(const struct mmg_check *chk)
{
    for (size_t i = 0; i < chk->n_lines; i++) {
        if (chk->blocks)
            slurm_error(MMG_PREFIX "%s", chk->lines[i]);
        else
            slurm_info(MMG_PREFIX "%s", chk->lines[i]);
    }
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
