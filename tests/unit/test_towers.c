/* test_towers.c - issue 23: modules[].gradient_checkpointing on a vision tower
 * (ms-swift vit_gradient_checkpointing) switches the tower's checkpointing apart
 * from training.gradient_checkpointing, both ways; refused where the family's
 * tower layers cannot be checkpointed. */
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <string.h>

/* a trained Qwen2.5-VL tower: the key takes the tower's layers out of (or into)
 * checkpointing whatever training.gradient_checkpointing says, and only them */
START_TEST(tower_checkpointing_follows_its_own_key)
{
    mm_spec *s = unit_preset("qwen2.5-vl-7b-full");
    uint64_t both = unit_set_forward_peak(s, "vision_tower.trainable=true");
    uint64_t same = unit_set_forward_peak(s, "vision_tower.gradient_checkpointing=true");
    uint64_t llm_only = unit_set_forward_peak(s, "vision_tower.gradient_checkpointing=false");
    uint64_t none = unit_set_forward_peak(s, "training.gradient_checkpointing={enabled: false, use_reentrant: true}");
    uint64_t tower_only = unit_set_forward_peak(s, "vision_tower.gradient_checkpointing=true");
    ck_assert_uint_eq(same, both);      /* true under a model-wide enable: nothing to change */
    ck_assert_uint_gt(llm_only, both);  /* the tower's activations stay for backward */
    ck_assert_uint_lt(tower_only, none);
    /* what the tower saves is the same either way: the LLM's share does not depend on it */
    ck_assert_uint_eq(llm_only - both, none - tower_only);
    mm_spec_free(s);
}
END_TEST

/* Mllama's encoder layers are plain nn.Modules: nothing to switch on */
START_TEST(tower_checkpointing_refused_where_it_cannot_apply)
{
    mm_spec *s = unit_preset("llama-3.2-11b-vision-full");
    mm_error e;
    ck_assert(mm_spec_set(s, "vision_tower.gradient_checkpointing=true", &e) != 0);
    ck_assert_msg(strstr(e.msg, "gradient_checkpointing") && strstr(e.msg, "GradientCheckpointingLayer"),
                  "%s", e.msg);
    ck_assert_msg(mm_spec_set(s, "vision_tower.gradient_checkpointing=false", &e) == 0, "%s", e.msg);
    ck_assert(mm_spec_set(s, "projector.gradient_checkpointing=false", &e) != 0);
    mm_spec_free(s);
}
END_TEST

/* training.video_frames (Qwen2VLVideoProcessor): frames padded to a multiple of
 * temporal_patch_size 2 by repeating the last, each pair one temporal patch: 3 and 4
 * frames cost the same, 5 frames more (truth rows: tests/truth/feat_towers.py) */
START_TEST(video_frames_merge_in_pairs)
{
    mm_spec *s = unit_preset("qwen2.5-vl-7b-full");
    uint64_t f3 = unit_set_forward_peak(s, "training.video_frames=3");
    uint64_t f4 = unit_set_forward_peak(s, "training.video_frames=4");
    uint64_t f5 = unit_set_forward_peak(s, "training.video_frames=5");
    ck_assert_uint_eq(f3, f4);
    ck_assert_uint_gt(f5, f4);
    mm_spec_free(s);
}
END_TEST

/* training.video_min_pixels / video_max_pixels: a frame's own smart_resize bounds
 * (qwen_vl_utils' VIDEO_MIN/MAX_PIXELS): a lower cap shrinks every frame, a higher floor
 * grows it, and the image processor's bounds stay the images' (truth rows: feat_towers.py
 * VIDEO_PX_ROWS) */
START_TEST(video_pixels_bound_the_frames)
{
    mm_spec *s = unit_preset("qwen2.5-vl-7b-full");
    uint64_t img = unit_set_forward_peak(s, "training.video_frames=4");
    uint64_t small = unit_set_forward_peak(s, "training.video_max_pixels=12544");
    uint64_t big = unit_set_forward_peak(s, "training.video_max_pixels=200704");
    ck_assert_msg(mm_spec_set(s, "training.video_max_pixels=1003520", &(mm_error){0}) == 0, "max");
    uint64_t grown = unit_set_forward_peak(s, "training.video_min_pixels=802816");
    ck_assert_uint_lt(small, img);
    ck_assert_uint_gt(big, small);
    ck_assert_uint_gt(grown, big);
    mm_spec_free(s);
}
END_TEST

/* the keys that would change nothing are refused with the reason */
START_TEST(video_keys_refused_where_they_cannot_apply)
{
    mm_error e;
    mm_spec *s = unit_preset("qwen2.5-vl-7b-full");
    ck_assert(mm_spec_set(s, "training.video_max_pixels=12544", &e) != 0);
    ck_assert_msg(strstr(e.msg, "training.video_max_pixels") && strstr(e.msg, "no video"), "%s", e.msg);
    ck_assert(mm_spec_set(s, "training.video_min_pixels=12544", &e) != 0);
    ck_assert_msg(mm_spec_set(s, "training.video_frames=4", &e) == 0, "%s", e.msg);
    ck_assert(mm_spec_set(s, "training.video_min_pixels=2000000000", &e) != 0);
    ck_assert_msg(strstr(e.msg, "bounds are empty"), "%s", e.msg);
    mm_spec_free(s);
    s = unit_preset("llava-1.5-7b-finetune");
    ck_assert(mm_spec_set(s, "training.video_frames=8", &e) != 0);
    ck_assert_msg(strstr(e.msg, "training.video_frames") && strstr(e.msg, "Qwen-VL"), "%s", e.msg);
    mm_spec_free(s);
}
END_TEST

Suite *towers_suite(void)
{
    Suite *s = suite_create("towers");
    TCase *tc = tcase_create("towers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, tower_checkpointing_follows_its_own_key);
    tcase_add_test(tc, tower_checkpointing_refused_where_it_cannot_apply);
    tcase_add_test(tc, video_frames_merge_in_pairs);
    tcase_add_test(tc, video_pixels_bound_the_frames);
    tcase_add_test(tc, video_keys_refused_where_they_cannot_apply);
    suite_add_tcase(s, tc);
    return s;
}
