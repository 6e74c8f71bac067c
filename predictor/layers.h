/* layers.h - context for the layer programs in layers.c. */
#ifndef MM_LAYERS_H
#define MM_LAYERS_H

#include "sim.h"
#include "spec.h"

typedef struct lctx {
    sim *s;
    const mm_spec *spec;
    const module_spec *m;
    uint32_t mi;
    int counting;        /* parameter-counting pass: no tensors */
    int grad;            /* autograd records (not under no_grad) */
    int ckpt;            /* checkpoint transformer layers */
    int per_layer;       /* rows registered now belong to the repeated layers */
    int amp;             /* fp32 master weights at ZeRO 0: autocast */
    int zero;
    int has_vit;
    int dead;            /* layer output never reaches the loss */
    int unused;          /* module does not run (no images): no grads, no states */
    int nofold;          /* simulate every layer (tests compare both) */
    int grads_accumulate; /* gradient accumulation: .grad exists, grads add in */
    int pretrain_input_grads;
    attn_kind attn;
    uint64_t dt;         /* activation dtype bytes */
    uint64_t gdt;        /* weight-gradient dtype bytes */
    uint64_t B, S, T;    /* sequences, tokens per sequence, tokens */
    uint64_t largest_param;
    int32_t cos, sin, mask, pixels;
    int32_t late_drop[2];
    int32_t *scratch;    /* MM_MAX_LAYERS + 2 entries */
} lctx;

void layers_enter_module(lctx *c, uint32_t mi);
int32_t layers_forward(lctx *c);
int32_t layers_recompute(sim *s, const sim_node *ck, void *ctx);

#endif
