/* parallel.h - what a training framework holds around the step, per
 * strategy: DDP (parallel_ddp.c), DeepSpeed ZeRO 1-3 (parallel_zero*.c),
 * FSDP1 flat parameters and FSDP2 per-parameter sharding (parallel_fsdp.c).
 * docs/parallel.md says what each keeps alive when, with the library lines.
 *
 * Per rank, N-way data parallel: "sharded" tensors are divided by N on the
 * timeline (sim.c), so one run serves every N. */
#ifndef MM_PARALLEL_H
#define MM_PARALLEL_H

#include "prog.h"

/* DeepSpeed's partitions of the busiest rank (parallel_zero_layout.c), in elements */
typedef struct zlayout {
    uint64_t S;                        /* partition size (padded group / N), the largest group */
    uint64_t gip;                      /* whole tensors overlapping the partitions, all groups */
    uint64_t piece;                    /* the largest tensor piece inside a partition */
    int pieces;                        /* pieces in the largest group's partition */
} zlayout;

typedef struct par_state {
    parallel_kind kind;
    const resolved_model *rm;
    lctx *c;
    uint64_t P_all, P_tr, P_grad;      /* all, trainable, with a gradient buffer */
    uint64_t root, root_tr;            /* parameters outside the wrapped layer units */
    uint64_t store, sdt;               /* parameter storage and optimizer-state dtype bytes */
    uint32_t llm, r_gather, r_bucket, r_part, r_step, r_grads;
    int32_t partition, bucket, gathered;
    /* ZeRO (parallel_zero*.c) */
    zlayout zl;
    uint64_t z_fill;                   /* elements in the IPG bucket */
    int32_t z_xl;                      /* an extra-large gradient waiting for its reduction */
    int32_t zpf;                       /* ZeRO-3: parameters prefetched for the next layer */
    int32_t zg[256];                   /* ZeRO-3: the gathered tensors fetched so far that may */
    uint32_t nzg;                      /* still be alive (available()); zg_over: more than */
    int zg_over;                       /* zg holds, every tensor is looked at instead */
    uint64_t z_pers[MM_MAX_MODULES];   /* ZeRO-3: persistent elements of a layer of each module, */
    uint64_t z_head;                   /* the decoder head's; read once from the rows (the */
    uint8_t z_pers_ok[MM_MAX_MODULES]; /* counting pass made them: later rows hold no */
    uint8_t z_head_ok;                 /* parameters) */
    uint64_t z_rd_l, z_rd_after;       /* ZeRO-3: the last reuse distance asked, of layer */
    uint32_t z_rd_m;                   /* (z_rd_m, z_rd_l): the later units' parameters */
    int z_rd_ok;
    int32_t step_mark;                 /* first tensor of the step proper */
    /* DDP (parallel_ddp.c) */
    int32_t ddp_first, ddp_cur;        /* buckets: consecutive tensor ids, the one filling */
    size_t ddp_n, ddp_next;
    /* FSDP (parallel_fsdp.c) */
    uint64_t pdt, rdt;                 /* compute (param_dtype) and reduce dtype bytes */
    int32_t root_p;                    /* the root unit's unsharded parameters, -1 sharded */
    uint64_t w_esz;                    /* FSDP2, no MixedPrecision: bytes of a wide (fp32
                                          adapter) element, 0 none */
    uint64_t w_tr[MM_MAX_MODULES];     /* wide elements of each module's layers, */
    uint64_t l_tr[MM_MAX_MODULES];     /* of all their trainable elements */
    uint64_t root_w;                   /* wide elements in the root */
    int32_t ag_held;                   /* FSDP2: the last all-gather output, freed by the next */
    int32_t rs_held;                   /* FSDP2: the last reduce-scatter input, freed by the next */
    int32_t pf_f, pf_p;                /* the unit prefetched for backward (flat output, params) */
    size_t pf_k;                       /* its marker's tape index + 1 (0: none) */
    int32_t cur_p, cur_mark;           /* the unit in backward: params, its first gradient id */
    int32_t fwd_p, ffp;                /* the unit in forward: params; the next, prefetched */
    size_t cur_k;                      /* the tape index of the unit in backward */
    size_t fwd_k;                      /* the tape index of its post-backward marker */
    uint64_t ad_left;                  /* FSDP1 peft_lora: the unit's adapters whose backward is
                                          still to come before its deferred prefetch (0: none) */
    /* FSDP1 wrap_policy size (parallel_wrap.c): the units outside the layers, their
       parameters and trainable ones (0: not a unit); the layers walked at all */
    uint64_t w_emb, w_emb_tr, w_head, w_head_tr, w_base, w_base_tr;
    int layers_walked;
    int32_t base_p, base_mark;         /* the base model's unit: gathered, its first gradient */
    size_t base_k;                     /* its post-backward marker's tape index + 1 */
    uint64_t keep_layer;               /* the layer whose units reduce now (UINT64_MAX: none) */
} par_state;

/* ---- parallel.c: the step's hand-offs, dispatched to the strategy files ---- */
/* parameters, optimizer states and persistent gradients at step start */
void par_model_states(par_state *ps, lctx *c, const resolved_model *rm, uint32_t llm);
/* gathered parameters (ZeRO-3, FSDP) for the forward, and at its end */
void par_forward_begin(par_state *ps, lctx *c);
void par_forward_end(par_state *ps, lctx *c);
/* reduce buckets and gradient partitions */
void par_backward_begin(par_state *ps, lctx *c);
void par_backward_end(par_state *ps, lctx *c);
/* the optimizer step's temporaries and zero_grad (parallel_opt.c) */
void par_optimizer(par_state *ps, lctx *c);

/* ---- parallel_unit.c: what the parallel*.c files share (below them all) ---- */
int par_is_fsdp(const par_state *ps);
/* parameters of a row that require grad (DeepSpeed partitions them all) */
uint64_t par_requires_grad(const par_state *ps, const sim_row *R);
/* Idefics3 / SmolVLM vision: only the layers' self_attn is a unit */
int par_attention_only(const par_state *ps, uint32_t module);
int par_attention_row(const sim_row *R);
/* parameters of one wrapped layer unit (FSDP: a _no_split_modules layer) */
uint64_t par_unit_params(const par_state *ps, uint32_t module, uint64_t layer);
uint64_t par_unit_trainable(const par_state *ps, uint32_t module, uint64_t layer);
/* drop every alive, unsharded weight gradient made since tensor `mark`
 * (not the strategy's own buffers) */
void par_drop_grads(const par_state *ps, int32_t mark);
/* a backward marker on the tape (sim_node.marker): aux[0] module, aux[1] layer,
 * aux[2] a tensor, aux[3] kind, aux[4] count; returns its tape index */
size_t par_marker(sim *s, uint32_t row, void (*fn)(sim *, const sim_node *, void *), void *ctx,
                  uint32_t module, uint64_t layer, int kind, uint64_t count);

/* parallel_wrap.c: FSDP1 size-based auto-wrap (fsdp.wrap_policy size) */
/* the parameters of layer l (trainable: those that train) that units hold */
uint64_t wrap_layer(const par_state *ps, uint64_t l, int trainable);
/* the units outside the layers: ps->w_emb, w_head, w_base */
void wrap_plan(par_state *ps);
/* the unit of layer l holding layer row R: -1 none (its parent's), else the
 * trainable parameters of that unit */
int64_t wrap_row_unit(const par_state *ps, const sim_row *R, uint64_t l);

/* parallel_ddp.c: DDP's reduce buckets, and the gradients that become views of them */
void ddp_buckets(par_state *ps, lctx *c);
void ddp_backward_begin(par_state *ps, lctx *c);
void ddp_forward_end(par_state *ps, lctx *c);

/* parallel_fsdp.c */
void fsdp_setup(par_state *ps, lctx *c);
void fsdp_forward_begin(par_state *ps);
void fsdp_forward_end(par_state *ps);
void fsdp_backward_begin(par_state *ps);
void fsdp_backward_end(par_state *ps);
/* elements of the gradients gradient accumulation keeps between micro-batches */
uint64_t fsdp_accum_grad_elems(const par_state *ps);
/* FSDP1: trainable elements in the busiest rank's chunks beyond P_tr / N */
uint64_t fsdp1_state_excess(const par_state *ps);

/* parallel_zero_layout.c: the partitions of stages 1-2 and of stage 3 */
int zero_layout(par_state *ps, int round_robin_order, zlayout *z);
int zero3_layout(par_state *ps, zlayout *z);
/* parallel_zero.c: DeepSpeed ZeRO stages 1-2 and the shared parts */
uint64_t zero_bucket(const par_state *ps);
void zero_backward_begin(par_state *ps);
void zero_backward_end(par_state *ps);
void zero_step(par_state *ps, lctx *c);
/* parallel_zero3.c: stage 3's gathered parameters */
uint64_t zero3_threshold(const par_state *ps);
void zero3_setup(par_state *ps);
void zero3_forward_begin(par_state *ps);
void zero3_forward_end(par_state *ps);
void zero3_backward_begin(par_state *ps);
void zero3_backward_end(par_state *ps);

/* parallel_tp.c: tensor parallelism (torchtitan's block plan, no data parallel beside it) */
/* the all-reduces around the sharded Linears (lctx.on_linear), when tensor_parallel > 1 */
void tp_attach(lctx *c);

#endif
