/* tokens.h - visual tokens as a function of the image: how the family's
 * processor cuts an image of H x W pixels into ViT sequences (tiles) of
 * patches, and how many tokens reach the language model after the connector.
 * The ViT runs on the pre-merge patch count. */
#ifndef MM_TOKENS_H
#define MM_TOKENS_H

#include "spec.h"

typedef struct vis_tokens {
    uint64_t tiles;        /* ViT sequences (batched layout) for one image */
    uint64_t grid_h, grid_w; /* patch grid of one tile (packed: of the whole image) */
    uint64_t seq;          /* one ViT sequence: patches + class token (+ padding) */
    uint64_t patches;      /* patches of the image over all tiles, no class tokens */
    uint64_t llm_tokens;   /* tokens the image puts into the language model */
} vis_tokens;

/* The image the spec trains on at worst: training.image_size or the
 * processor's largest (max_pixels, max_tiles). */
void tokens_worst_image(const mm_spec *s, const module_spec *vis, uint64_t *h, uint64_t *w);
/* The pixel bounds of a dynamic (Qwen-VL) processor: the image processor's
 * min/max_pixels, or a video frame's training.video_min/max_pixels. */
void tokens_pixel_bounds(const mm_spec *s, const module_spec *vis, uint64_t *lo, uint64_t *hi);
/* Tokens of one H x W image.  0, or -1 with err (impossible geometry). */
int tokens_per_image(const mm_spec *s, uint64_t h, uint64_t w, vis_tokens *out, mm_error *err);

#endif
