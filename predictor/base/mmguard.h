/* mmguard.h - public API of libmmguard, the peak-GPU-memory predictor.
 *
 * Why this file exists: it is the only header the CLI, the SPANK plugin and the
 * tests include.  It knows nothing about Slurm.  All byte counts are uint64_t and
 * every computation behind them is overflow-checked; an overflow is an error, never
 * a wrapped number.
 */
#ifndef MMGUARD_H
#define MMGUARD_H

#include <stddef.h>
#include <stdint.h>

#define MM_VERSION "0.1.0"

/* Hard limits for hostile input (see README "Limits"). */
#define MM_MAX_SPEC_BYTES   (1u << 20) /* 1 MiB spec file */
#define MM_MAX_MODULES      3          /* vision encoder, connector, decoder */
#define MM_MAX_DEPTH        32         /* YAML/JSON nesting */
#define MM_MAX_LAYERS       4096       /* hidden layers per module */
#define MM_MAX_NAME         64

/* One error message: "file:line:col: key.path: what is wrong" (line/col omitted
 * when unknown).  Filled by every function that can fail. */
typedef struct mm_error {
    char msg[768];
} mm_error;

typedef struct mm_spec mm_spec; /* opaque, see spec.h */

typedef enum { MM_FMT_AUTO = 0, MM_FMT_YAML, MM_FMT_JSON } mm_format;

/* Load a spec file (YAML or JSON by extension/content).  Refuses non-regular
 * files, files over MM_MAX_SPEC_BYTES, never blocks on a FIFO.  NULL on error. */
mm_spec *mm_spec_load_file(const char *path, mm_error *err);
/* Same from memory; `name` is used in error messages as the file name. */
mm_spec *mm_spec_load_buffer(const char *buf, size_t len, const char *name,
                             mm_format fmt, mm_error *err);
/* Apply one override "dotted.key=value" (modules addressed by name, e.g.
 * "language_model.num_hidden_layers=40", "training.micro_batch_size=8").
 * The spec is re-validated; on error the spec is unchanged. 0 ok, -1 error. */
int mm_spec_set(mm_spec *spec, const char *assignment, mm_error *err);
mm_spec *mm_spec_clone(const mm_spec *spec);
void mm_spec_free(mm_spec *spec);

const char *mm_spec_name(const mm_spec *spec);
const char *mm_spec_path(const mm_spec *spec);
/* sha256 (hex, 64 chars) of the exact bytes the spec was loaded from. */
const char *mm_spec_digest(const mm_spec *spec);
uint32_t mm_spec_data_parallel(const mm_spec *spec);
/* training.tensor_parallel: GPUs per model replica (1 without tensor parallel) */
uint32_t mm_spec_tensor_parallel(const mm_spec *spec);
uint32_t mm_spec_micro_batch(const mm_spec *spec);
int mm_spec_zero_stage(const mm_spec *spec);
int mm_spec_checkpointing(const mm_spec *spec);
/* NULL when the prediction models the job; else the sentence that says the
 * prediction is an upper bound and what shows it (training.torch_compile) */
const char *mm_spec_bound(const mm_spec *spec);

typedef enum {
    MM_PHASE_FORWARD = 0,
    MM_PHASE_BACKWARD,
    MM_PHASE_OPTIMIZER,
    MM_PHASE_COUNT
} mm_phase;
const char *mm_phase_name(mm_phase p); /* "forward" | "backward" | "optimizer" */

/* The six factors reported at the peak.  parameters+gradients+optimizer_states+
 * activations+temporaries == allocated bytes; overhead is device-level only. */
typedef struct mm_factors {
    uint64_t parameters;
    uint64_t gradients;
    uint64_t optimizer_states;
    uint64_t activations;  /* tensors saved for backward */
    uint64_t temporaries;  /* transient working set of the op at the peak */
    uint64_t overhead;     /* allocator rounding/fragmentation, CUDA context, NCCL */
} mm_factors;
/* The factors in their one order (JSON keys, reports): names and values. */
#define MM_NFACTORS 6
extern const char *const mm_factor_names[MM_NFACTORS];
void mm_factor_values(const mm_factors *f, uint64_t v[MM_NFACTORS]);

typedef struct mm_layer_result {
    char name[MM_MAX_NAME];     /* e.g. "layers.0-31.self_attn.q_proj" */
    char kind[32];              /* linear, norm, embedding, attention, ... */
    uint32_t count;             /* identical instances folded into this row */
    uint64_t parameters_count;  /* total over `count` instances */
    uint64_t trainable_count;
    mm_factors factors;         /* contribution at the peak, all instances */
} mm_layer_result;

typedef struct mm_module_result {
    char name[MM_MAX_NAME];
    char type[16];              /* vision | connector | decoder (0.1: vit | mlp | llama) */
    uint64_t parameters_count;
    uint64_t trainable_count;
    mm_factors factors;         /* contribution at the peak */
    size_t n_layers;
    mm_layer_result *layers;
} mm_module_result;

/* Per-GPU peak as a function of the data-parallel degree N:
 *   allocated(1) = allocated_dp1
 *   allocated(N) = max_k (terms[k].fixed + ceil(terms[k].sharded / N))   for N >= 2
 *   peak(N)      = ceil(allocated(N) * (1 + alloc_frac)) + alloc_fixed
 *                  + (max(reserved(N), allocated(N)) - allocated(N))
 *                  + context + (N > 1 ? nccl : 0) + paged(N)
 * The terms are every pareto point of the step's timeline that is the maximum
 * at some N, so allocated(N) is exact for every N (terms_exact; 0 only when
 * more than MM_MAX_TERMS points were needed and two were merged into their
 * maximum, an over-estimate).  reserved(N) - what the caching-allocator model
 * holds - has no closed form in N: it is replayed at each N, and dp_points
 * lists the degrees replayed (a prediction: its own N, or every N >= 2 when
 * no tensor is sharded over N; mm_dp_cover adds more).  mm_peak_for_dp()
 * evaluates this, and returns MM_PEAK_UNKNOWN for an N no point covers. */
#define MM_MAX_TERMS 8
#define MM_PEAK_UNKNOWN UINT64_MAX
typedef struct mm_dp_term {
    uint64_t fixed;
    uint64_t sharded;
} mm_dp_term;

typedef struct mm_dp_point {
    uint32_t n_from, n_to;    /* the degrees N in [n_from, n_to] */
    uint64_t reserved;        /* the allocator model's reserved peak at those N */
    uint64_t paged;           /* on the GPU outside the allocator (paged optimizer states) */
    uint64_t allocated;       /* the sim's allocated peak at those N where the dp terms do
                                 not give it (ZeRO / FSDP lay partitions out per N); 0 = terms */
} mm_dp_point;

typedef struct mm_overheads {
    uint64_t cuda_context;    /* CUDA context + cuBLAS workspace + kernels */
    uint64_t nccl;            /* NCCL buffers, only when data_parallel > 1 */
    uint64_t alloc_fixed;     /* extra slack on top of the allocator model (default 0) */
    double alloc_frac;        /* extra slack, a fraction of allocated (default 0) */
} mm_overheads;

typedef struct mm_prediction {
    char name[128];
    uint64_t peak_bytes;            /* what the GPU must hold */
    uint64_t allocated_peak_bytes;  /* ~ torch.cuda.max_memory_allocated() */
    uint64_t reserved_peak_bytes;   /* ~ torch.cuda.max_memory_reserved(): the
                                       allocator model replaying two steps */
    uint64_t allocator_slack;       /* reserved - allocated at the spec's N */
    uint64_t paged_bytes;           /* on the GPU outside the caching allocator (paged
                                       optimizer states), included in peak_bytes */
    uint64_t host_peak_bytes;       /* per rank, on the host: CPU-offloaded states and
                                       activations (0 without offload) */
    mm_phase peak_phase;
    char peak_event[96];            /* e.g. "backward language_model lm_head loss" */
    uint64_t phase_peak[MM_PHASE_COUNT]; /* allocated peak within each phase */
    mm_factors factors;             /* at the peak */
    mm_overheads overheads;         /* the constants used */
    uint32_t data_parallel;
    uint32_t micro_batch_size;
    uint32_t seq_len;
    uint64_t parameters_count, trainable_count;
    uint64_t allocated_dp1;         /* allocated peak at N = 1; terms hold for N >= 2 */
    size_t n_terms;
    mm_dp_term terms[MM_MAX_TERMS];
    int terms_exact;                /* 1: allocated(N) from the terms is exact for every N */
    size_t n_dp_points;             /* degrees the allocator was replayed at, by n_from */
    mm_dp_point *dp_points;
    size_t n_modules;
    mm_module_result *modules;
    /* the worst image the spec admits (0 without a vision tower or images):
     * its size, ViT tiles, patches over all tiles, tokens in the language model */
    uint32_t image_height, image_width;
    uint64_t image_tiles, image_patches, image_tokens;
    char bound[192];                /* "" or mm_spec_bound(): the peak is a bound, not a model */
} mm_prediction;

/* Predict; 0 ok, -1 error (err filled, e.g. arithmetic overflow). */
int mm_predict(const mm_spec *spec, mm_prediction *out, mm_error *err);
void mm_prediction_free(mm_prediction *p);
/* Device-level peak at data-parallel degree n (0 counts as 1): equal to
 * peak_bytes of a prediction made at n, for every n a dp point covers;
 * MM_PEAK_UNKNOWN otherwise. */
uint64_t mm_peak_for_dp(const mm_prediction *p, uint32_t n);
/* Replay the step at the degrees ns[0..k) not yet covered, so that
 * mm_peak_for_dp() is exact there too.  `spec` is the one p was predicted
 * from.  One simulated step, then one allocator replay per degree (every
 * N >= 2 at once when no tensor is sharded over N).  0 ok, -1 error. */
int mm_dp_cover(const mm_spec *spec, mm_prediction *p, const uint32_t *ns, size_t k,
                mm_error *err);
/* JSON text (malloc'd, caller frees).  Schema in README "JSON output". */
char *mm_prediction_json(const mm_prediction *p, int pretty);

/* Sizes: "80GiB", "80GB", "81559MiB", "512MB", "1.5TiB", "123" (bytes).
 * Binary (KiB/MiB/GiB/TiB) and decimal (KB/MB/GB/TB) units, case-insensitive,
 * optional space.  0 ok, -1 error. */
int mm_parse_size(const char *s, uint64_t *out, mm_error *err);

/* Safety margin: "10%" (of GPU memory) or a size ("4GiB"); both may be combined
 * by the caller (usable = mem - mem*pct - bytes). */
typedef struct mm_margin {
    double percent;  /* 0..100 */
    uint64_t bytes;
} mm_margin;
int mm_parse_margin(const char *s, mm_margin *out, mm_error *err);
/* gpu_mem minus the margin; 0 if the margin eats everything. */
uint64_t mm_usable_bytes(uint64_t gpu_mem, const mm_margin *m);

/* "71.3 GiB", "512.0 MiB", "12 B"; writes at most n bytes. */
void mm_format_bytes(uint64_t bytes, char *buf, size_t n);

/* Does the step run on a card?  The allocator model replays the step with
 * the capacity the card leaves it (its usable bytes less the CUDA context and,
 * N > 1, NCCL); on a failed cudaMalloc it frees its cache and retries, as
 * DeviceCachingAllocator::malloc does, before it gives up (docs/allocator.md). */
typedef enum mm_verdict_kind {
    MM_VERDICT_FITS = 0,   /* no cudaMalloc ever fails: the uncapped replay fits */
    MM_VERDICT_FLUSHES,    /* runs, but frees its cache and retries (slower) */
    MM_VERDICT_OOM,        /* a request finds no room even with the cache freed */
} mm_verdict_kind;
const char *mm_verdict_name(mm_verdict_kind k); /* "fits" | "fits with cache flushes" | ... */
const char *mm_spec_alloc_conf(const mm_spec *spec); /* device.alloc_conf, "" = unset */
typedef struct mm_verdict {
    mm_verdict_kind kind;
    uint32_t n;                   /* GPUs (data-parallel degree) judged */
    uint64_t gpu_bytes;           /* the card's memory */
    uint64_t usable_bytes;        /* less the margin and reserve */
    uint64_t capacity;            /* what the caching allocator may reserve */
    uint64_t context_bytes;       /* CUDA context and, N > 1, NCCL: outside the allocator */
    uint64_t allocated_peak;      /* live tensors at the peak (the sim) */
    uint64_t reserved_uncapped;   /* the allocator's reserved peak on a card without limit */
    uint64_t reserved_peak;       /* at this capacity (never above it) */
    uint64_t paged_bytes;         /* paged optimizer states: evicted to host under
                                     pressure, not the allocator's, not in the verdict */
    uint64_t retries_step;        /* cudaMalloc retries (cache flushes) per steady step */
    uint64_t retries;             /* the same over the replay's two steps */
    /* the smallest usable bytes on which the step runs at all, and without a
     * flush: the boundaries the published record carries (0 = not searched) */
    uint64_t min_usable_runs, min_usable_no_flush;
    /* out of memory: the failing request */
    char oom_event[160];          /* "backward language_model layers.31" */
    uint64_t oom_request, oom_allocated, oom_reserved, oom_largest_free;
} mm_verdict;
/* The verdict for `spec` at its training.data_parallel on a card of
 * `gpu_bytes` of which `usable` may be used; with `boundaries`, also the
 * capacities where the verdict changes (a search over replays).  0, or -1 with
 * err. */
int mm_verdict_for(const mm_spec *spec, uint64_t gpu_bytes, uint64_t usable, int boundaries,
                   mm_verdict *out, mm_error *err);
/* The same verdict on several cards at once, without the boundaries: out[i]
 * equals mm_verdict_for(spec, gpu_bytes[i], usable[i], 0, ...), from one
 * simulated step and one uncapped replay (the plugin's published record). */
int mm_verdict_cards(const mm_spec *spec, size_t n_cards, const uint64_t *gpu_bytes,
                     const uint64_t *usable, mm_verdict *out, mm_error *err);

/* mm_predict(spec, pred) and mm_verdict_for(spec, gpu_bytes, usable, 0, v)
 * at once, the same results from one simulated step log and one uncapped
 * replay (what the plugin asks for every --mm-model).  0, or -1 with err
 * (then pred holds nothing to free). */
int mm_predict_verdict(const mm_spec *spec, uint64_t gpu_bytes, uint64_t usable,
                       mm_prediction *pred, mm_verdict *v, mm_error *err);

/* What would fit on a card, every answer judged by the capacity-aware
 * verdict (mm_verdict_for) of the configuration it names, at the card of
 * `gpu_bytes` with `usable` bytes (less margin and reserve).  What counts as
 * fitting: the job runs (not out of memory); with no_flush, without a cache
 * flush either (the plugin's flush=reject). */
typedef struct mm_fit_judged {   /* one suggested configuration on the card */
    int judged;                  /* 0: not asked (the suggestion does not apply) */
    mm_verdict_kind kind;
    uint64_t retries_step;       /* cudaMalloc retries (cache flushes) per steady step */
    uint64_t retries;            /* the same over the first two steps (> 0 with flushes) */
    uint64_t peak_bytes;         /* on the card: reserved + CUDA context (+ NCCL); 0 = OOM */
    uint64_t live_bytes;         /* live tensors at the peak (allocated) */
} mm_fit_judged;

/* A judged suggestion in words, for the CLI and the plugin alike: "fits, peak
 * 38.1 GiB" | "fits with cache flushes (2 cudaMalloc retries per step:
 * slower), peak 40.0 GiB" | "out of memory (live tensors 41.0 GiB)". */
void mm_fit_judged_text(const mm_fit_judged *j, char *buf, size_t n);
typedef struct mm_fit_result {
    int fits;                    /* the spec as given fits (runs; with no_flush: without flushes) */
    uint64_t peak_bytes;         /* the spec as given, on the card (reserved + context), 0 = OOM */
    mm_verdict verdict;          /* the spec as given (mm_verdict_for, no boundaries) */
    uint32_t max_micro_batch;    /* largest micro-batch that fits, 0 = none */
    mm_fit_judged at_max;        /* its verdict */
    uint32_t max_micro_batch_no_flush; /* largest micro-batch that fits without a flush */
    mm_fit_judged at_max_no_flush;
    int checkpointing_helps;     /* spec has no checkpointing and turning it on fits */
    uint32_t max_micro_batch_ckpt; /* largest micro-batch with checkpointing on */
    mm_fit_judged ckpt;          /* the spec's micro-batch with checkpointing on */
    int expandable_helps;        /* the spec does not fit, with expandable segments it does */
    uint32_t max_micro_batch_expandable; /* with PYTORCH_CUDA_ALLOC_CONF expandable_segments:True */
    mm_fit_judged expandable;    /* the spec with expandable_segments:True (judged = 0 when
                                    it uses them already) */
    int min_zero_stage;          /* smallest ZeRO stage that fits at the spec's N, -1 none
                                    (not judged under FSDP: the two exclude each other) */
    mm_fit_judged zero;
    uint32_t min_data_parallel;  /* smallest N (<= 1024) that fits at max(zero,1), 0 none */
    int min_data_parallel_zero;  /* the ZeRO stage min_data_parallel was computed for */
    int min_data_parallel_fsdp;  /* or the spec's own FSDP version (it shards by itself) */
    int min_data_parallel_ckpt;  /* min_data_parallel needs gradient checkpointing on
                                    (activations are not sharded: without it no N fits) */
    mm_fit_judged dp;
} mm_fit_result;
int mm_fit(const mm_spec *spec, uint64_t gpu_bytes, uint64_t usable, int no_flush,
           mm_fit_result *out, mm_error *err);
/* Only the largest micro-batch (1..65536) that fits the card (as mm_fit, at
 * the spec's own data-parallel degree), 0 if none: mm_fit's max_micro_batch
 * (or max_micro_batch_no_flush).  at_spec, when not NULL, is the verdict of
 * the spec as given on that card (mm_predict_verdict's) and saves one.  0
 * also when out of memory. */
uint32_t mm_max_micro_batch(const mm_spec *spec, uint64_t gpu_bytes, uint64_t usable,
                            int no_flush, const mm_verdict *at_spec);

/* ---- the CUDA caching allocator (alloc.c, alloc_conf.c, alloc_trace.c) ---- */

/* PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF settings that change memory. */
#define MM_ROUNDUP_INTERVALS 16   /* power-of-two intervals from 1 MiB to 64 GiB */
typedef struct mm_alloc_conf {
    uint64_t max_split_size;          /* max_split_size_mb; UINT64_MAX = unlimited */
    uint64_t max_non_split_rounding;  /* max_non_split_rounding_mb; default 20 MiB */
    double gc_threshold;              /* garbage_collection_threshold; 0 = off */
    uint32_t roundup_divisions[MM_ROUNDUP_INTERVALS]; /* roundup_power2_divisions */
    int expandable_segments;          /* expandable_segments:True */
    double memory_fraction;           /* set_per_process_memory_fraction; 0 = unset */
} mm_alloc_conf;
void mm_alloc_conf_default(mm_alloc_conf *c);
/* Parse the PyTorch syntax ("expandable_segments:True,max_split_size_mb:128",
 * "roundup_power2_divisions:[256:1,512:2,>:4]").  Keys that do not change
 * device memory (pinned_*, release_lock_on_cudamalloc, backend) are accepted;
 * unknown keys and bad values are errors naming them.  0 ok, -1 error (c
 * unchanged). */
int mm_alloc_conf_parse(mm_alloc_conf *c, const char *s, mm_error *err);

/* What the allocator model counts (names as in torch.cuda.memory_stats()). */
typedef struct mm_alloc_stats {
    uint64_t allocated, allocated_peak;   /* allocated_bytes.all: block sizes */
    uint64_t requested, requested_peak;   /* requested_bytes.all: tensor sizes */
    uint64_t reserved, reserved_peak;     /* reserved_bytes.all: segments */
    uint64_t segments, segments_peak;     /* segment.all (expandable: mapped pages) */
    uint64_t inactive_split;              /* inactive_split_bytes.all: free, split */
    uint64_t num_device_alloc, num_device_free, num_alloc_retries, num_ooms;
    uint64_t num_allocs;
} mm_alloc_stats;

/* Replay an allocator trace (format: docs/allocator.md; tests/gpu_data/traces)
 * through the model.  `capacity` 0 = unlimited.  truth_* come from the trace's
 * own segment events (0 when absent).  0 ok, -1 error naming file and line. */
typedef struct mm_replay_result {
    mm_alloc_stats stats;            /* the model's */
    uint64_t events;                 /* alloc/free events replayed */
    uint64_t truth_reserved_peak;    /* the real allocator's, from segment events */
    uint64_t truth_allocated_peak;   /* requested bytes, from alloc/free events */
    uint64_t truth_segments;         /* segment_alloc / segment_map events */
    uint64_t segments_matched;       /* leading segment sizes equal to the trace's */
    char id[128];                    /* the trace header's "id" */
} mm_replay_result;
#define MM_REPLAY_CONF_FROM_TRACE 1u /* model the alloc_conf of the trace header */
#define MM_REPLAY_TRACE_ADDRESSES 2u /* new segments at the trace's addresses */
#define MM_REPLAY_STOP_AT_OOM     4u /* end at the first out-of-memory, as the program did */
int mm_alloc_replay_file(const char *path, const mm_alloc_conf *conf, unsigned flags,
                         uint64_t capacity, mm_replay_result *out, mm_error *err);
/* Same from memory; `name` is the file name used in errors. */
int mm_alloc_replay_buffer(const char *buf, size_t len, const char *name,
                           const mm_alloc_conf *conf, unsigned flags, uint64_t capacity,
                           mm_replay_result *out, mm_error *err);

/* SHA-256 of a buffer, hex into out[65]. */
void mm_sha256_hex(const void *data, size_t len, char out[65]);

#endif
