/* import_swift_video.c (layer import) - ms-swift's video variables for the
 * Qwen2-VL / Qwen2.5-VL templates -> training.video_frames and a frame's
 * bounds (training.video_min_pixels / video_max_pixels).
 *
 * ms-swift reads a video with qwen_vl_utils' fetch_video and hands the frames
 * to the processor with do_resize=False (swift/template/templates/qwen.py,
 * Qwen2VLTemplate.replace_tag and _encode), after setting the library's
 * constants from the environment (swift/model/models/qwen.py
 * patch_qwen_vl_utils; for qwen_vl_utils >= 0.0.14 compat_qwen_vl_utils turns
 * VIDEO_MAX_PIXELS into VIDEO_MAX_TOKEN_NUM = pixels // 28^2).  In fetch_video
 * (QwenLM qwen-vl-utils vision_process.py, both lines):
 *   frames     smart_nframes: the video's length x FPS, clamped to
 *              [FPS_MIN_FRAMES, FPS_MAX_FRAMES] and floored to FRAME_FACTOR 2;
 *              at worst (a long video) FPS_MAX_FRAMES floored to even;
 *   frame max  max(min(VIDEO_MAX_PIXELS, total / frames x 2), int(VIDEO_MIN_PIXELS x 1.05)),
 *              total = VIDEO_TOTAL_PIXELS: ms-swift sets 128000 x 28^2 x 0.9 when
 *              VIDEO_MAX_PIXELS is given (qwen.py patch_qwen_vl_utils), >= 0.0.14 uses
 *              MODEL_SEQ_LEN 128000 x 28^2 x 0.9, < 0.0.12 defaults to 24576 x 28^2:
 *              the larger (the frames then carry more pixels) is taken unless set;
 *   frame min  VIDEO_MIN_PIXELS (128 x 28^2).
 * A video sample is stated as images_per_sample videos of video_frames frames. */
#include "import_rd.h"
#include "import_swift.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define ULL(x) ((unsigned long long)(x))
#define F2 (28ull * 28ull)                    /* IMAGE_FACTOR^2 of Qwen2/2.5-VL */

static const char *const vars[] = {"VIDEO_MAX_PIXELS", "VIDEO_MIN_PIXELS", "VIDEO_TOTAL_PIXELS",
                                   "FPS_MAX_FRAMES", "FPS_MIN_FRAMES", "FPS", NULL};

/* the first video variable the environment sets, NULL none */
static const char *first_video_var(hfc *env)
{
    for (size_t i = 0; vars[i]; i++)
        if (mm_node_get(env->map, vars[i]))
            return vars[i];
    return NULL;
}

/* the frame count and a frame's bounds, as fetch_video computes them at worst */
static int frame_bounds(hfc *env, imp_spec *s, uint64_t *frames, uint64_t *lo, uint64_t *hi)
{
    uint64_t vmax, vmin, total, most, least;
    double fps;
    if (imp_u64(env, "VIDEO_MAX_PIXELS", 768 * F2, 1, 1ull << 40, &vmax) ||
        imp_u64(env, "VIDEO_MIN_PIXELS", 128 * F2, 1, 1ull << 40, &vmin) ||
        imp_u64(env, "VIDEO_TOTAL_PIXELS", 115200 * F2, 1, 1ull << 50, &total) ||
        imp_u64(env, "FPS_MAX_FRAMES", 768, 2, 4096, &most) ||
        imp_u64(env, "FPS_MIN_FRAMES", 4, 1, 4096, &least) || imp_num(env, "FPS", 2.0, &fps))
        return -1;
    if (fps <= 0)
        return hf_fail(env, "FPS", "expected a positive frame rate");
    *frames = most / 2 * 2;
    if (least > *frames)
        return hf_fail(env, "FPS_MIN_FRAMES", "%llu is above FPS_MAX_FRAMES (%llu frames)",
                       ULL(least), ULL(*frames));
    double cap = fmin((double)vmax, (double)total / (double)*frames * 2.0);
    double floor_px = (double)(uint64_t)((double)vmin * 1.05);
    *hi = (uint64_t)(cap > floor_px ? cap : floor_px);
    *lo = vmin;
    imp_note(s, "assumed every sample is one video long enough for FPS_MAX_FRAMES (%llu frames "
                "at FPS %g, floored to even): qwen_vl_utils smart_nframes at worst", ULL(most), fps);
    if (!mm_node_get(env->map, "VIDEO_TOTAL_PIXELS"))
        imp_note(s, "assumed VIDEO_TOTAL_PIXELS 128000 x 28 x 28 x 0.9 (ms-swift's with "
                    "VIDEO_MAX_PIXELS, qwen_vl_utils >= 0.0.14's default; < 0.0.12 allows fewer)");
    return 0;
}

int imp_swift_video(imp_job *j, hfc *env)
{
    const char *first = first_video_var(env);
    if (!first)
        return 0;
    imp_section *v = imp_find_module(j->s, "vision");
    const char *fam = v ? imp_get(v, "family") : NULL;
    if (!fam || (strcmp(fam, "qwen2_vl") && strcmp(fam, "qwen2_5_vl")))
        return hf_fail(env, first, "video samples are mapped for the Qwen2-VL and Qwen2.5-VL "
                                   "templates (qwen_vl_utils' pixel bounds); not for %s",
                       fam ? fam : "a model without a vision tower");
    uint64_t frames = 0, lo = 0, hi = 0;
    char w[160];
    if (frame_bounds(env, j->s, &frames, &lo, &hi))
        return -1;
    imp_set(&j->s->training, "video_frames", mm_node_get(env->map, "FPS_MAX_FRAMES")
            ? hf_where(env, "FPS_MAX_FRAMES", w, sizeof w) : "qwen_vl_utils' FPS_MAX_FRAMES 768",
            "%llu", ULL(frames));
    imp_set(&j->s->training, "video_min_pixels", mm_node_get(env->map, "VIDEO_MIN_PIXELS")
            ? hf_where(env, "VIDEO_MIN_PIXELS", w, sizeof w)
            : "qwen_vl_utils' VIDEO_MIN_PIXELS 128 x 28 x 28", "%llu", ULL(lo));
    imp_set(&j->s->training, "video_max_pixels", "qwen_vl_utils fetch_video: max(min("
            "VIDEO_MAX_PIXELS, VIDEO_TOTAL_PIXELS / frames x 2), VIDEO_MIN_PIXELS x 1.05)",
            "%llu", ULL(hi));
    return 0;
}
