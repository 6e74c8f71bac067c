/* layer_set.h - a set of layer indices (0 .. MM_MAX_LAYERS-1), one bit each:
 * the spec's per-layer lists (`trainable_layers`, `cross_attention_layers`, ...)
 * as the key decoder (keys.c) fills them and the spec (spec.h) holds them. */
#ifndef MM_LAYER_SET_H
#define MM_LAYER_SET_H

#include <stdint.h>
#include "mmguard.h"

#define MM_LAYER_WORDS (MM_MAX_LAYERS / 64)
typedef struct layer_set { uint64_t w[MM_LAYER_WORDS]; } layer_set;
static inline int lset_has(const layer_set *s, uint64_t i)
{
    return i < MM_MAX_LAYERS && ((s->w[i / 64] >> (i % 64)) & 1u);
}
static inline void lset_add(layer_set *s, uint64_t i)
{
    if (i < MM_MAX_LAYERS)
        s->w[i / 64] |= 1ull << (i % 64);
}

/* the smallest index >= from in the set, or MM_MAX_LAYERS when none: a word
 * at a time (a spec check over every index cost 4096 bit tests per list) */
static inline uint64_t lset_first_from(const layer_set *s, uint64_t from)
{
    for (uint64_t w = from / 64; w < MM_LAYER_WORDS; w++) {
        uint64_t bits = s->w[w];
        if (w == from / 64)
            bits &= ~0ull << (from % 64);
        if (bits)
            return w * 64 + (uint64_t)__builtin_ctzll(bits);
    }
    return MM_MAX_LAYERS;
}

#endif
