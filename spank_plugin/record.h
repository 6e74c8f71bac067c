/* record.h - the one variable the plugin publishes for a checked job.
 *
 * Why this file exists: Slurm 22.05's sbatch spends ~280 k instructions per
 * SPANK job-control variable (setenvfs callocs 256 KiB each), so every value
 * goes into a single variable, MMGUARD, instead of one variable per value.
 * job_submit.lua reads it from job_desc.spank_job_env; the job inherits it as
 * SLURM_SPANK_MMGUARD, from which slurmstepd (remote.c) derives the task-side
 * MMGUARD_* variables.  slurmstepd runs as root and the text comes from the
 * user, so the parser is strict, bounded and fuzzed (tests/fuzz/fuzz_record.c).
 *
 * Text: "v=4 key=value key=value ...", keys below, strings percent-encoded
 * (every byte outside '!'..'~' and '%' itself as %XX).  Unknown keys,
 * duplicates, bad numbers and over-long text are errors.  The format is
 * documented in docs/plugin.md; contrib/job_submit.lua has its own reader.
 */
#ifndef MMG_RECORD_H
#define MMG_RECORD_H

#include <stddef.h>
#include <stdint.h>

#include "mmguard.h"

#define MMG_RECORD_MAX 16384  /* longest accepted text */
#define MMG_RECORD_VERSION 4
#define MMG_RECORD_POINTS 64  /* most degree ranges in res= */
#define MMG_RECORD_CARDS 64   /* most (GPU type, count) verdicts in cards= */

/* The capacity-aware verdict (mm_verdict_cards) for one GPU type at one
 * count: what `mmguard check SPEC --gpu-mem MEM --set
 * training.data_parallel=N` answers, from one capped replay.  cards= item
 * "TYPE:USABLE:N:KIND:RETRIES:PEAK", KIND fits|flushes|oom. */
struct mmg_card {
    char gpu[32];             /* GPU type */
    uint64_t usable;          /* its usable bytes as the plugin's mmguard.conf says */
    uint32_t n;               /* GPUs = data-parallel degree */
    mm_verdict_kind kind;
    uint64_t retries;         /* cudaMalloc retries (cache flushes) per step */
    uint64_t peak;            /* reserved peak at the capacity + CUDA context and NCCL:
                                 never above usable */
};

struct mmg_record {
    char decision[8];         /* decision=  accept | warn | error */
    char spec[1024];          /* spec=      absolute path of the spec */
    char sha256[65];          /* sha256=    of the spec bytes */
    char model[128];          /* model=     the spec's name */
    char gpu[32];             /* gpu=       GPU type judged */
    uint64_t gpu_mem;         /* gpu_mem=   its memory, bytes */
    uint64_t usable;          /* usable=    memory minus margin and reserve */
    uint32_t dp;              /* dp=        GPUs judged = data-parallel degree */
    char request[160];        /* request=   the request as derived, e.g. "h100:2x1" */
    uint64_t peak, alloc;     /* peak= alloc=  predicted device / allocated peak at dp */
    int has_mmb;
    uint32_t mmb;             /* mmb=       largest micro-batch that fits at dp */
    uint64_t host;            /* host=      predicted host bytes per GPU process at dp
                                            (CPU offload; absent: 0) */
    char error[1024];         /* error=     decision error: the message */
    char admission[160];      /* admission= set by job_submit.lua when it resized */
    /* the per-GPU peak at the degrees N it covers (mm_peak_for_dp): */
    int has_model;            /* all of ctx..res present */
    uint64_t ctx, nccl, afix, dp1;
    double afrac;
    size_t n_terms;
    mm_dp_term terms[MM_MAX_TERMS];
    size_t n_points;          /* res= "FROM-TO:RESERVED:PAGED,..." by FROM */
    mm_dp_point points[MMG_RECORD_POINTS];
    size_t n_cards;           /* cards= the verdicts job_submit.lua decides by */
    struct mmg_card cards[MMG_RECORD_CARDS];
};

/* The text of r; -1 when it does not fit n bytes. */
int mmg_record_format(const struct mmg_record *r, char *out, size_t n);
/* Parse text; 0 ok, -1 with a message naming the key. */
int mmg_record_parse(const char *text, struct mmg_record *r, char *err, size_t errlen);
/* The peak model of a prediction (has_model, ctx .. res): its first
 * MMG_RECORD_POINTS dp points. */
void mmg_record_set_model(struct mmg_record *r, const mm_prediction *p);
/* mm_peak_for_dp() from the published model (what job_submit.lua computes):
 * MM_PEAK_UNKNOWN for a degree no point covers. */
uint64_t mmg_record_peak_for_dp(const struct mmg_record *r, uint32_t n);
/* The published verdict for GPU type `gpu` (case-insensitive) at n GPUs;
 * NULL when the record has none. */
const struct mmg_card *mmg_record_card(const struct mmg_record *r, const char *gpu, uint32_t n);
const struct mmg_card *mmg_cards_find(const struct mmg_card *cards, size_t n_cards,
                                      const char *gpu, uint32_t n);
/* Append to cards[*n_cards] the verdicts of `spec` on each of the n_types
 * cards (name, memory, usable bytes) at each of the n_counts counts, counts
 * first, until MMG_RECORD_CARDS: per count one simulated step
 * (mm_verdict_cards); (type, count) pairs already there are skipped.  0, or
 * -1 with err when a count could not be judged (the spec refuses it: it is
 * left out, the other counts are judged). */
int mmg_cards_add(struct mmg_card *cards, size_t *n_cards, const mm_spec *spec, size_t n_types,
                  const char *const *names, const uint64_t *mem, const uint64_t *usable,
                  size_t n_counts, const uint32_t *counts, mm_error *err);
/* The card of a verdict as the record carries it. */
void mmg_card_from_verdict(struct mmg_card *c, const char *gpu, const mm_verdict *v);

#endif
