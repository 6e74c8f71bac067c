/* parallel.h - what a training framework holds around the step, per
 * strategy: DDP, DeepSpeed ZeRO 1-3 (with CPU offload), FSDP1 (flat
 * parameters) and FSDP2 (per-parameter sharding). */
#ifndef MM_PARALLEL_H
#define MM_PARALLEL_H

#include "prog.h"

typedef struct par_state {
    parallel_kind kind;
    const mm_spec *sp;
    uint64_t P_all, P_tr, P_grad;      /* all, trainable, with a gradient buffer */
    uint64_t largest_layer, root;      /* unsharded unit sizes (parameters) */
    uint64_t store, sdt;               /* parameter storage and optimizer-state dtype bytes */
    uint32_t llm, r_gather, r_bucket, r_part, r_step;
    int32_t partition, gathered, bucket, root_buf;
} par_state;

/* parameters, optimizer states and persistent gradients at step start */
void par_model_states(par_state *ps, lctx *c, const mm_spec *sp, uint32_t llm);
/* gathered parameters (ZeRO-3, FSDP) for the forward */
void par_forward_begin(par_state *ps, lctx *c);
/* reduce buckets and gradient partitions */
void par_backward_begin(par_state *ps, lctx *c);
void par_backward_end(par_state *ps, lctx *c);
/* the optimizer step's temporaries and zero_grad */
void par_optimizer(par_state *ps, lctx *c);

#endif
