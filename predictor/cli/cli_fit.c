/* cli_fit.c - `mmguard fit SPEC --gpu-mem SIZE`: the largest micro-batch and
 * the ways to fit, each judged by the capacity-aware verdict of the very
 * configuration it names (mm_fit) and said in the user's terms: fits (its
 * peak on the card), fits with cache flushes (how many per step: slower), or
 * out of memory.  CLI layer. */
#include "cli_fit.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static const char *kind_key(mm_verdict_kind k)
{
    return k == MM_VERDICT_FITS ? "fits" : k == MM_VERDICT_FLUSHES ? "flushes" : "oom";
}


static void spec_line(const mm_spec *s, const mm_fit_result *f, uint64_t gpu, uint64_t usable)
{
    const mm_verdict *v = &f->verdict;
    char gm[32], us[32], what[256];
    mm_fit_judged j = {1, v->kind, v->retries_step, v->retries, f->peak_bytes,
                       v->allocated_peak};
    mm_format_bytes(gpu, gm, sizeof gm);
    mm_format_bytes(usable, us, sizeof us);
    if (v->kind == MM_VERDICT_OOM)
        snprintf(what, sizeof what, "out of memory at %s", v->oom_event);
    else
        mm_fit_judged_text(&j, what, sizeof what);
    uint32_t tp = mm_spec_tensor_parallel(s);
    if (tp > 1) /* each data-parallel replica spans tp GPUs */
        printf("%s on a %s GPU (usable %s), %u GPUs (tensor parallel %u x data parallel %u): "
               "%s\n", mm_spec_name(s), gm, us, v->n * tp, tp, v->n, what);
    else
        printf("%s on a %s GPU (usable %s), %u GPU%s: %s\n", mm_spec_name(s), gm, us, v->n,
               v->n == 1 ? "" : "s", what);
}

static void batch_lines(const mm_spec *s, const mm_fit_result *f)
{
    char a[192], b[192];
    if (!f->max_micro_batch) {
        printf("  no micro-batch runs with the current settings, not even 1\n");
        return;
    }
    mm_fit_judged_text(&f->at_max, a, sizeof a);
    printf("  largest micro-batch that runs: %u (spec: %u): %s\n", f->max_micro_batch,
           mm_spec_micro_batch(s), a);
    if (f->at_max.kind == MM_VERDICT_FITS)
        return;
    if (f->max_micro_batch_no_flush) {
        mm_fit_judged_text(&f->at_max_no_flush, b, sizeof b);
        printf("  largest micro-batch without cache flushes: %u: %s\n",
               f->max_micro_batch_no_flush, b);
    } else {
        printf("  no micro-batch runs without cache flushes\n");
    }
}

static void largest(uint32_t mb)
{
    if (mb)
        printf("; largest micro-batch %u\n", mb);
    else
        printf("; no micro-batch runs\n");
}

static void remedy_lines(const mm_spec *s, const mm_fit_result *f)
{
    char a[192];
    uint32_t n = mm_spec_data_parallel(s);
    if (f->expandable.judged) {
        mm_fit_judged_text(&f->expandable, a, sizeof a);
        printf("  with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: %s", a);
        largest(f->max_micro_batch_expandable);
    }
    if (f->ckpt.judged) {
        mm_fit_judged_text(&f->ckpt, a, sizeof a);
        printf("  with gradient checkpointing: %s", a);
        largest(f->max_micro_batch_ckpt);
    }
    if (mm_spec_tensor_parallel(s) > 1) { /* mm_fit tries neither (spec_tp.c refuses them) */
        printf("  ZeRO, FSDP and more data-parallel GPUs beside tensor parallelism are not "
               "modelled\n");
        return;
    }
    if (f->min_data_parallel_fsdp) {
        /* FSDP and ZeRO exclude each other: no stage to try */
    } else if (f->min_zero_stage >= 0) {
        mm_fit_judged_text(&f->zero, a, sizeof a);
        printf("  smallest ZeRO stage that runs at %u GPU%s: %d: %s\n", n, n == 1 ? "" : "s",
               f->min_zero_stage, a);
    } else {
        printf("  no ZeRO stage runs at %u GPU%s\n", n, n == 1 ? "" : "s");
    }
    char how[32];
    if (f->min_data_parallel_fsdp)
        snprintf(how, sizeof how, "FSDP%d", f->min_data_parallel_fsdp);
    else
        snprintf(how, sizeof how, "ZeRO-%d", f->min_data_parallel_zero);
    if (f->min_data_parallel) {
        mm_fit_judged_text(&f->dp, a, sizeof a);
        printf("  smallest number of GPUs with %s%s: %u: %s\n", how,
               f->min_data_parallel_ckpt ? " and gradient checkpointing" : "",
               f->min_data_parallel, a);
    } else {
        printf("  no number of GPUs up to 1024 runs with %s\n",
               f->min_data_parallel_fsdp ? how : "ZeRO");
    }
}

static void judged_json(const char *key, const mm_fit_judged *j)
{
    if (!j->judged) {
        printf(", \"%s\": null", key);
        return;
    }
    printf(", \"%s\": {\"verdict\": \"%s\", \"alloc_retries_per_step\": %" PRIu64
           ", \"alloc_retries\": %" PRIu64 ", \"peak_bytes\": %" PRIu64
           ", \"allocated_peak_bytes\": %" PRIu64 "}",
           key, kind_key(j->kind), j->retries_step, j->retries, j->peak_bytes, j->live_bytes);
}

static void print_json(const mm_fit_result *f, uint64_t gpu, uint64_t usable)
{
    const mm_verdict *v = &f->verdict;
    printf("{\"verdict\": \"%s\", \"fits\": %s, \"gpus\": %u, \"gpu_bytes\": %" PRIu64
           ", \"usable_bytes\": %" PRIu64 ", \"peak_bytes\": %" PRIu64
           ", \"alloc_retries_per_step\": %" PRIu64 ", \"max_micro_batch\": %u",
           kind_key(v->kind), f->fits ? "true" : "false", v->n, gpu, usable, f->peak_bytes,
           v->retries_step, f->max_micro_batch);
    judged_json("max_micro_batch_verdict", &f->at_max);
    printf(", \"max_micro_batch_no_flush\": %u", f->max_micro_batch_no_flush);
    judged_json("max_micro_batch_no_flush_verdict", &f->at_max_no_flush);
    printf(", \"checkpointing_helps\": %s, \"max_micro_batch_checkpointing\": %u",
           f->checkpointing_helps ? "true" : "false", f->max_micro_batch_ckpt);
    judged_json("checkpointing", &f->ckpt);
    printf(", \"expandable_segments_helps\": %s, \"max_micro_batch_expandable_segments\": %u",
           f->expandable_helps ? "true" : "false", f->max_micro_batch_expandable);
    judged_json("expandable_segments", &f->expandable);
    printf(", \"min_zero_stage\": %d", f->min_zero_stage);
    judged_json("min_zero_stage_verdict", &f->zero);
    printf(", \"min_data_parallel\": %u, \"min_data_parallel_zero_stage\": %d, "
           "\"min_data_parallel_fsdp_version\": %d, "
           "\"min_data_parallel_needs_checkpointing\": %s",
           f->min_data_parallel, f->min_data_parallel_zero, f->min_data_parallel_fsdp,
           f->min_data_parallel_ckpt ? "true" : "false");
    judged_json("min_data_parallel_verdict", &f->dp);
    printf("}\n");
}

int mm_cli_fit(mm_spec *s, uint64_t gpu, uint64_t usable, int json)
{
    mm_fit_result f;
    mm_error err;
    if (mm_fit(s, gpu, usable, 0, &f, &err)) {
        fprintf(stderr, "mmguard fit: %s\n", err.msg);
        return 2;
    }
    if (json) {
        print_json(&f, gpu, usable);
    } else {
        spec_line(s, &f, gpu, usable);
        batch_lines(s, &f);
        remedy_lines(s, &f);
        if (mm_spec_bound(s))
            printf("  judged by a bound: %s\n", mm_spec_bound(s));
    }
    return f.fits ? 0 : 1;
}
