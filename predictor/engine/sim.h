/* sim.h - the timeline engine.  A training step is replayed as tensor
 * allocations and frees: forward ops allocate outputs and mark what autograd
 * saves; a tape of backward nodes frees saved tensors and creates gradients in
 * reverse order; the optimizer step adds its temporaries.  Live bytes are
 * tracked per factor and the maximum (with its phase and event) is the peak.
 * Layer programs (model/) drive it; they hold the formulas. */
#ifndef MM_SIM_H
#define MM_SIM_H

#include <stdint.h>
#include "mmguard.h"
#include "alloc.h"

enum { F_PARAM = 0, F_GRAD, F_OPT, F_ACT, F_TEMP, F_NFACT }; /* F_ACT: saved for backward */
/* how a tensor's bytes depend on the data-parallel degree N */
enum { SIM_FIXED = 0, SIM_SHARDED = 1, SIM_MULTI = 2 /* exists only when N > 1 (DDP buckets) */ };

typedef struct sim_tensor {
    uint64_t bytes;      /* unsharded size (0 for a view: its base holds the storage) */
    uint64_t vbytes;     /* a view's own size: what its gradient takes */
    int32_t base;        /* a view's base tensor, -1 for a tensor with storage */
    uint32_t row;        /* owning breakdown row */
    uint8_t cls;         /* F_PARAM, F_GRAD, F_OPT, or F_TEMP (data; F_ACT while saved) */
    uint8_t sharded;     /* SIM_FIXED, SIM_SHARDED (ZeRO partitions: / N) or SIM_MULTI */
    uint8_t alive;
    uint8_t rg;          /* requires grad */
    uint8_t esz;         /* bytes per element (dtype), for ops that follow their input */
    uint32_t holds;      /* Python references (variables, tuples, caches) */
    uint32_t refs;       /* autograd saved-variable references */
    uint32_t vrefs;      /* saved views of this tensor (it counts as an activation) */
    uint32_t hrefs;      /* saved references whose copy waits on the host */
    int32_t grad;        /* tensor id of its gradient, -1 none */
} sim_tensor;

/* one allocation or free, as the allocator model sees it (reserve.c): bytes
 * on this rank (sharded ones divided by N), the tensor (id), its row, phase
 * and class */
typedef mm_alloc_ev sim_ev;

struct sim;
#define SIM_MAX_SAVED 6
#define SIM_MAX_IN 3
#define SIM_MAX_OUT 3
typedef struct sim_node {
    uint32_t row;
    int32_t out;                      /* its output; the output's grad is consumed here */
    int32_t outs[SIM_MAX_OUT - 1];    /* more outputs (unbind, split, chunk) */
    int32_t in[SIM_MAX_IN];           /* inputs that need a gradient */
    int32_t saved[SIM_MAX_SAVED];
    uint8_t nin, nsaved, nouts;
    uint8_t grad_views;               /* cat: the inputs' gradients are views of the output's */
    uint8_t ckpt;                     /* checkpointed layer: recompute in backward */
    uint8_t wgrad_sharded;
    uint8_t wgrad_transient;          /* ZeRO-2/3: reduced into a bucket, then freed */
    uint8_t free_first;               /* folded layers: release saved before the grads */
    uint8_t host_saved;               /* saved[i] waits on the host (bit i): activation
                                         offloading, offloaded checkpoint inputs; a
                                         folded node's come back one group at a time
                                         (its bwd_tmp) */
    uint32_t wgrad_row;
    uint64_t wgrad_bytes;             /* weight gradient this node creates */
    uint64_t bwd_tmp;                 /* transient working set of its backward */
    uint32_t ckpt_layer;              /* layer index for the recompute */
    int32_t aux[7];                   /* checkpoint: input, cos, sin, mask, sliding mask, cross
                                         states, cross-attention mask */
    const void *ckpt_prog;            /* layer program to re-run */
    /* a marker the parallel strategy put on the tape (parallel*.c): backward
     * calls it when it gets there and does nothing else with the node */
    void (*marker)(struct sim *s, const struct sim_node *n, void *ctx);
    void *marker_ctx;
} sim_node;

/* a boundary of stack.c's layer loop, for the parallel strategy (FSDP
 * units, ZeRO-3 fetches): before or after layer `layer` of module `module`
 * runs, or (SIM_LAYERS_FOLDED) `count` layers from `layer` that the loop
 * stands in for with a ballast */
enum { SIM_LAYER_BEGIN = 0, SIM_LAYER_END, SIM_LAYERS_FOLDED };
typedef struct sim_layer_ev {
    uint32_t module;
    uint64_t layer, count;
    int what;
    int grad;                         /* autograd records the layer */
} sim_layer_ev;

typedef struct sim_row {
    char name[MM_MAX_NAME];
    char kind[32];
    uint32_t module;
    uint32_t count;
    uint32_t trainable_count;  /* instances with trainable parameters */
    uint32_t lora_a, lora_b;   /* rows of this linear's LoRA adapters (0 = none yet) */
    uint64_t params, trainable;
    uint64_t qbytes;           /* quantized base (QLoRA): storage bytes of all instances */
    uint64_t mat_rows, mat_cols; /* a matrix parameter's shape per instance (Adafactor) */
    uint8_t pesz;              /* bytes per parameter when not the model's (PEFT's fp32
                                  adapters on a 16-bit model), 0 = the model's */
} sim_row;

typedef struct sim {
    /* configuration */
    uint64_t dp;               /* data-parallel degree used to evaluate sharded bytes */
    int symbolic;              /* collect (fixed + multi, sharded) pareto terms for N >= 2 */
    /* tensors and tape */
    sim_tensor *t;
    size_t nt, capt;
    size_t ngrads;             /* tensors whose gradient (grad) is set */
    sim_node *tape;
    size_t ntape, captape;
    /* live bytes: fixed, sharded and N > 1 only, per factor */
    uint64_t live_fixed, live_sharded, live_multi;
    uint64_t fact_fixed[F_NFACT], fact_sharded[F_NFACT], fact_multi[F_NFACT];
    uint64_t peak_dp1;         /* the allocated peak the same step has at N = 1 */
    uint64_t leftover;         /* activations and temporaries still alive when the
                                  optimizer starts (the batch aside): 0 unless the
                                  engine or a formula leaks (tests/unit/test_engine.c) */
    /* peak tracking */
    mm_phase phase;
    const char *event_label;   /* current op, for the peak description */
    uint32_t event_row;
    uint64_t nevents;
    uint64_t peak;
    uint64_t peak_event;
    mm_phase peak_phase;
    uint32_t peak_row;
    const char *peak_label;
    uint64_t phase_peak[MM_PHASE_COUNT];
    uint64_t phase_peak_event[MM_PHASE_COUNT]; /* the event of each phase's peak */
    /* snapshot at a given event, the run stopped there (dp_paged_at; a prediction
     * keeps its breakdown at the peak with track_peak instead) */
    uint64_t snap_at;          /* 0 = none */
    int snapped;
    int stopped;               /* snapshot taken: the rest of the replay is skipped */
    uint64_t snap_fact[F_NFACT];
    uint64_t *snap_row_fact;   /* snap_nrows * F_NFACT, filled at the snapshot */
    size_t snap_nrows;
    /* the breakdown at the peak without a second run (track_peak): every change
     * of the live bytes since the newest peak, undone from the end state by
     * sim_peak_snapshot */
    int track_peak;
    struct sim_undo *undo;
    size_t nundo, capundo;
    /* pareto terms (symbolic mode) */
    mm_dp_term *terms;
    size_t nterms, capterms;
    /* breakdown rows; names are mostly string literals, so a cache keyed by
     * the name pointer avoids a strcmp per op */
    struct { const char *name; uint32_t module, row; } rcache[512];
    sim_row *rows;
    size_t nrows, caprows;
    uint64_t largest_param;    /* largest single parameter tensor (optimizer temporaries) */
    uint64_t *layer_tp;        /* trainable parameters per (module, layer): MM_MAX_MODULES x
                                  layer_stride, filled by the counting pass */
    uint64_t *layer_gb;        /* their gradient bytes (fp32 LoRA adapters beside bf16 grads) */
    /* event log for the allocator model (log = 1) */
    int log;
    sim_ev *ev;
    size_t nev, capev;
    size_t step_ev;            /* first event of the step proper (after model states) */
    int overflow;              /* an arithmetic overflow happened: result invalid */
    int oom;                   /* allocation failure */
    int32_t ckpt_extra;        /* a recompute's own input copy (offloaded checkpoints) */
    uint64_t host_bytes;       /* per rank, on the host: offloaded states and activations */
    int offload_acts;          /* forward saves of >= 1 KiB go to the host (activation
                                  offloading); their device copies die with their holds */
    uint64_t host_act, host_act_peak; /* activations on the host now / at most */
    uint64_t outside_bytes;    /* on the GPU outside the caching allocator (paged optimizers) */
    uint64_t cublas_workspace; /* bytes of each of the two cuBLAS workspaces the replay holds
                                  (the forward thread's and autograd's); 0 = none */
    /* each weight gradient a backward node makes, right after it is allocated:
     * the parallel strategy's reduction takes it (parallel*.c); NULL = none */
    void (*on_wgrad)(struct sim *s, int32_t grad, void *ctx);
    void *on_wgrad_ctx;
    void (*on_layer)(struct sim *s, const sim_layer_ev *e, void *ctx);
    void *on_layer_ctx;
    uint64_t *layer_p;         /* parameters per (module, layer): MM_MAX_MODULES x layer_stride,
                                  filled by the counting pass (wrapped units' sizes) */
    uint64_t layer_stride;     /* layers per module in those tables: the spec's most (step.c),
                                  not MM_MAX_LAYERS, so a run does not clear 288 KiB of them */
    int tables_borrowed;       /* layer_tp, layer_gb, layer_p are an earlier run's (rows_from,
                                  read only after its counting pass): not freed here */
} sim;

/* entry (module, layer) of a per-layer table (layer_tp, layer_gb, layer_p), or NULL
 * past its end (a layer no run registers parameters for: 0) */
static inline uint64_t *sim_layer_slot(const sim *s, uint64_t *tab, uint64_t module,
                                       uint64_t layer)
{
    return tab && module < MM_MAX_MODULES && layer < s->layer_stride
               ? &tab[module * s->layer_stride + layer] : NULL;
}

static inline uint64_t sim_layer_get(const sim *s, uint64_t *tab, uint64_t module, uint64_t layer)
{
    const uint64_t *p = sim_layer_slot(s, tab, module, layer);
    return p ? *p : 0;
}

void sim_init(sim *s, uint64_t dp, int symbolic);
void sim_free(sim *s);
/* The row of (module, name), created on first use.  `name` must have static
 * storage (a string literal): it is cached by address.  Names built in a
 * temporary buffer go through sim_row_get_tmp, which never caches. */
uint32_t sim_row_get(sim *s, uint32_t module, const char *name, const char *kind);
uint32_t sim_row_get_tmp(sim *s, uint32_t module, const char *name, const char *kind);

/* room for `tensors` tensors (and, with the log on, their events) up front:
 * what a run expects to create is then never copied by a growing array */
void sim_reserve(sim *s, size_t tensors);
int32_t sim_alloc(sim *s, uint32_t row, uint64_t bytes, int cls, int sharded);
/* A view of `base` (reshape, transpose, slice, unbind ...): no storage of its
 * own; it keeps the base alive while it lives.  `vbytes` is its own size,
 * which its gradient takes. */
int32_t sim_view(sim *s, uint32_t row, int32_t base, uint64_t vbytes);
/* a second (third) output of node n */
void sim_node_out(sim *s, sim_node *n, int32_t out);
/* bytes a gradient of tensor id takes */
uint64_t sim_grad_bytes(const sim *s, int32_t id);
uint64_t sim_live_fixed(const sim *s);
void sim_hold(sim *s, int32_t id);
void sim_drop(sim *s, int32_t id);   /* release one hold */
/* a tensor that only ever exists on the host (folded offloaded activations) */
int32_t sim_host_tensor(sim *s, uint32_t row, uint64_t bytes);
/* save id for backward with its copy on the host (offloaded) */
void sim_save_host(sim *s, sim_node *n, int32_t id);
void sim_save(sim *s, sim_node *n, int32_t id);
sim_node *sim_node_new(sim *s, uint32_t row, int32_t out);
/* a transient working set: allocate, record the event, free */
void sim_transient(sim *s, uint32_t row, uint64_t bytes);
/* the same for a tensor sharded over the data-parallel ranks */
void sim_transient_sharded(sim *s, uint32_t row, uint64_t bytes);
void sim_set_phase(sim *s, mm_phase p);
void sim_label(sim *s, const char *label, uint32_t row);
uint64_t sim_live(const sim *s);

/* With track_peak set before the step: the snapshot a run with snap_at =
 * peak_event would take (snap_fact, snap_row_fact), from this run's end state.
 * 0, or -1 when there was no event (no peak) or no memory. */
int sim_peak_snapshot(sim *s);

/* Backward over tape[from, to) in reverse.  `recompute` re-runs a checkpointed
 * layer (implemented by layers.c) and returns its recomputed output. */
typedef int32_t (*sim_recompute_fn)(sim *s, const sim_node *ckpt, void *ctx);
/* bytes of the alive temporaries and activations (unsharded), from the live
 * bytes per factor: no tensor looked at */
uint64_t sim_alive_temp(const sim *s);
/* after backward: drop the gradients nothing consumed */
void sim_release_grads(sim *s);
void sim_backward(sim *s, size_t from, size_t to, sim_recompute_fn fn, void *ctx);

/* Per-parameter tensors in model order: module by module, layer by layer, the
 * rows of a layer in the order the forward created them.  Row r's
 * row_bytes[r] is split over its `count` instances (`use_trainable`: over
 * trainable_count); fn gets each instance.  What parameters() order gives
 * torch.optim's per-parameter state and foreach lists. */
typedef void (*sim_piece_fn)(void *ctx, uint32_t row, uint64_t bytes);
void sim_each_piece(const sim *s, const uint64_t *row_bytes, int use_trainable, sim_piece_fn fn,
                    void *ctx);

/* checked multiply helpers that flag overflow on the sim */
uint64_t sim_mul(sim *s, uint64_t a, uint64_t b);
uint64_t sim_mul3(sim *s, uint64_t a, uint64_t b, uint64_t c);
uint64_t sim_add(sim *s, uint64_t a, uint64_t b);

#endif
