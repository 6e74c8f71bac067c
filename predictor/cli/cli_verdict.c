/* cli_verdict.c - `mmguard check SPEC --gpu-mem SIZE`: the capacity-aware
 * verdict (mm_verdict_for) in the user's terms.  CLI layer.
 *
 * Three answers: fits; fits with cache flushes (the allocator frees its cache
 * and retries cudaMalloc, each flush synchronising the device: slower, and
 * how many per step); out of memory (the request that fails, what is live,
 * what the cache could still offer).  When fragmentation, not live tensors,
 * decides, it says so and gives the remedy with its predicted effect:
 * PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, judged by the same model. */
#include "cli_verdict.h"
#include "util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fmtb(uint64_t b, char *buf)
{
    mm_format_bytes(b, buf, 32);
}

/* the same job with expandable segments, when it does not use them yet */
static int with_expandable(const mm_spec *s, uint64_t gpu, uint64_t usable, mm_verdict *v)
{
    mm_spec *x = mm_spec_clone(s);
    mm_error e;
    int rc = -1;
    if (x && mm_spec_set(x, "device.alloc_conf=expandable_segments:True", &e) == 0)
        rc = mm_verdict_for(x, gpu, usable, 0, v, &e);
    mm_spec_free(x);
    return rc;
}

static void print_remedy(const mm_spec *s, const mm_verdict *v, uint64_t gpu)
{
    char a[32], b[32];
    mm_verdict x;
    fmtb(v->allocated_peak, a);
    fmtb(v->capacity, b);
    if (v->allocated_peak > v->capacity) {
        printf("  live tensors alone need %s, more than the %s the card leaves the allocator: "
               "a smaller micro-batch, checkpointing or more GPUs (mmguard fit)\n", a, b);
        return;
    }
    printf("  fragmentation decides, not live tensors: they need %s of the allocator's %s\n", a,
           b);
    if (strstr(mm_spec_alloc_conf(s), "expandable_segments:True") ||
        with_expandable(s, gpu, v->usable_bytes, &x))
        return;
    printf("  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: predicted %s", mm_verdict_name(x.kind));
    if (x.kind == MM_VERDICT_FLUSHES)
        printf(" (%" PRIu64 " per step)", x.retries_step);
    printf("\n");
}

static void print_text(const mm_spec *s, const mm_verdict *v, const char *margin)
{
    char us[32], gm[32], res[32], un[32], cap[32], al[32], ctx[32];
    fmtb(v->usable_bytes, us);
    fmtb(v->gpu_bytes, gm);
    fmtb(mm_sat_add(v->reserved_peak, v->context_bytes), res);
    fmtb(mm_sat_add(v->reserved_uncapped, v->context_bytes), un);
    fmtb(v->capacity, cap);
    fmtb(v->allocated_peak, al);
    fmtb(v->context_bytes, ctx);
    const char *mg = margin ? ", margin " : "", *mv = margin ? margin : "";
    if (v->kind == MM_VERDICT_FITS) {
        printf("fits: predicted peak %s per GPU <= usable %s (GPU %s%s%s)\n", un, us, gm, mg, mv);
    } else if (v->kind == MM_VERDICT_FLUSHES) {
        printf("fits with cache flushes: predicted peak %s per GPU in usable %s (GPU %s%s%s); "
               "without a limit the allocator would reserve %s\n", res, us, gm, mg, mv, un);
        printf("  the caching allocator frees its cache and retries cudaMalloc %" PRIu64
               " time%s per step (num_alloc_retries); each flush synchronises the device: "
               "slower, not an OOM\n", v->retries_step, v->retries_step == 1 ? "" : "s");
    } else {
        char rq[32], lv[32], rv[32], lf[32];
        fmtb(v->oom_request, rq);
        fmtb(v->oom_allocated, lv);
        fmtb(v->oom_reserved, rv);
        fmtb(v->oom_largest_free, lf);
        printf("does not fit: out of memory at %s: a request of %s with %s live and %s reserved "
               "after freeing the cache (largest free block %s); the allocator has %s of usable "
               "%s (GPU %s%s%s)\n", v->oom_event, rq, lv, rv, lf, cap, us, gm, mg, mv);
    }
    printf("  outside the allocator: CUDA context%s %s; live tensors at the peak %s\n",
           v->n > 1 ? " and NCCL" : "", ctx, al);
    if (v->min_usable_runs) {
        char r1[32], r2[32];
        fmtb(v->min_usable_runs, r1);
        fmtb(v->min_usable_no_flush, r2);
        printf("  runs with usable >= %s, without cache flushes with >= %s\n", r1, r2);
    }
    if (v->kind != MM_VERDICT_FITS)
        print_remedy(s, v, v->gpu_bytes);
    if (mm_spec_bound(s))
        printf("  judged by a bound: %s\n", mm_spec_bound(s));
}

static void print_json(const mm_spec *s, const mm_verdict *v)
{
    const char *bound = mm_spec_bound(s);
    printf("{\"verdict\": \"%s\", \"fits\": %s, \"gpus\": %u, \"gpu_bytes\": %" PRIu64
           ", \"usable_bytes\": %" PRIu64 ", \"allocator_capacity\": %" PRIu64
           ", \"outside_allocator_bytes\": %" PRIu64 ", \"allocated_peak_bytes\": %" PRIu64
           ", \"reserved_peak_bytes\": %" PRIu64 ", \"reserved_uncapped_bytes\": %" PRIu64
           ", \"peak_bytes\": %" PRIu64 ", \"paged_bytes\": %" PRIu64
           ", \"alloc_retries_per_step\": %" PRIu64 ", \"min_usable_runs\": %" PRIu64
           ", \"min_usable_no_flush\": %" PRIu64,
           v->kind == MM_VERDICT_FITS ? "fits" : v->kind == MM_VERDICT_FLUSHES ? "flushes" : "oom",
           v->kind == MM_VERDICT_OOM ? "false" : "true", v->n, v->gpu_bytes, v->usable_bytes,
           v->capacity, v->context_bytes, v->allocated_peak, v->reserved_peak,
           v->reserved_uncapped, mm_sat_add(v->reserved_peak, v->context_bytes),
           v->paged_bytes, v->retries_step, v->min_usable_runs, v->min_usable_no_flush);
    if (v->kind == MM_VERDICT_OOM)
        printf(", \"oom\": {\"event\": \"%s\", \"request_bytes\": %" PRIu64
               ", \"allocated_bytes\": %" PRIu64 ", \"reserved_bytes\": %" PRIu64
               ", \"largest_free_block\": %" PRIu64 "}",
               v->oom_event, v->oom_request, v->oom_allocated, v->oom_reserved,
               v->oom_largest_free);
    if (bound)
        printf(", \"bound\": \"%s\"", bound);
    printf("}\n");
}

int mm_cli_check(mm_spec *s, uint64_t gpu, uint64_t usable, const char *margin, int json)
{
    mm_verdict v;
    mm_error err;
    if (mm_verdict_for(s, gpu, usable, 1, &v, &err)) {
        fprintf(stderr, "mmguard check: %s\n", err.msg);
        return 2;
    }
    if (json)
        print_json(s, &v);
    else
        print_text(s, &v, margin);
    return v.kind == MM_VERDICT_OOM ? 1 : 0;
}
