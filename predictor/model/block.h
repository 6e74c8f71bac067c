/* block.h - the pieces of a transformer layer that live in their own files:
 * the dense MLP (block_mlp.c), the MoE MLP (moe.c), Mllama's cross-attention
 * layer (cross.c), Pixtral's tower entry (vision_pixtral.c). */
#ifndef MM_BLOCK_H
#define MM_BLOCK_H

#include "prog.h"

int32_t block_dense_mlp(lctx *c, int32_t z, uint64_t intermediate);
int32_t moe_block(lctx *c, int32_t z);
int32_t block_cross_layer(lctx *c, int32_t x);
/* vision_pixtral.c: after the patch conv's output pe, Pixtral's cat, ln_pre, rotary
 * tables and block mask (c->cos, c->sin, c->mask); keep[] gets what lives to the
 * tower's end */
int32_t pixtral_embeddings(lctx *c, int32_t pe, int32_t keep[2]);

#endif
