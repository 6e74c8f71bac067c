/* spec_video.c (spec layer) - training.video_frames and a frame's pixel
 * bounds against the vision module that would take them.
 *
 * A video is modelled for the Qwen-VL towers only: their processors turn
 * frames into temporal patches (temporal_patch_size frames each, Qwen2-VL
 * PatchEmbed's Conv3d; transformers models/qwen2_vl/video_processing_qwen2_vl.py
 * pads the frames to a multiple of it), which tokens.c counts.  Every other
 * tower resizes each image to a fixed size and has no video path in the
 * spec, so video_frames there would change nothing: refused.  The frames'
 * own bounds (video_min_pixels / video_max_pixels) mean something only for
 * a video, and must leave a non-empty range with the image processor's
 * bounds they replace (tokens_pixel_bounds). */
#include "spec_internal.h"
#include "tokens.h"

#include <stdio.h>

#define ULL(x) ((unsigned long long)(x))

int spec_check_video(dctx *c, const mm_node *root, const mm_spec *s)
{
    const mm_node *tr = mm_node_get(root, "training");
    const training_spec *t = &s->training;
    const module_spec *v = mm_spec_module(s, MOD_VISION);
    if (!t->video_frames) {
        const char *k = t->video_min_pixels ? "video_min_pixels"
                        : t->video_max_pixels ? "video_max_pixels" : NULL;
        if (!k)
            return 0;
        char path[64];
        snprintf(path, sizeof path, "training.%s", k);
        return key_fail(c, mm_node_get(tr, k), path, "a video frame's bound, but the samples "
                                                     "have no video (training.video_frames is 0)");
    }
    if (!v || v->img.kind != IMG_DYNAMIC || !v->temporal_patch_size)
        return key_fail(c, mm_node_get(tr, "video_frames"), "training.video_frames",
                        "videos are modelled for Qwen-VL towers (a dynamic image processor with "
                        "temporal patches); %s", v ? "this vision module resizes every image to "
                                                     "its fixed size and has no video path"
                                                   : "the spec has no vision module");
    uint64_t lo, hi;
    tokens_pixel_bounds(s, v, &lo, &hi);
    if (lo > hi)
        return key_fail(c, mm_node_get(tr, t->video_min_pixels ? "video_min_pixels"
                                                              : "video_max_pixels"),
                        t->video_min_pixels ? "training.video_min_pixels"
                                            : "training.video_max_pixels",
                        "a frame's bounds are empty: min %llu > max %llu pixels", ULL(lo), ULL(hi));
    return 0;
}
