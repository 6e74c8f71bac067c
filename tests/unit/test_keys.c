/* test_keys.c - issue 23: no accepted key is unread.  Each of the keys that
 * used to be accepted and ignored either changes what it claims or is refused
 * with the reason (spec_train.c, parallel_opt.c, parallel.c). */
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* max_grad_norm: clip_grad_norm_'s per-gradient 0-dim norms (512-byte blocks), their
 * stack and total_norm sit on top of the gradients before the step.  SGD makes no
 * temporaries of its own, so the optimizer phase's peak is the clipping's.  The tiny
 * Llama has 39 trainable tensors (4 x 9 in the layers, embed, final norm, lm_head). */
START_TEST(max_grad_norm_adds_the_norm_temporaries)
{
    const char *old = "  optimizer: sgd\nframework: {transformers_version: \"4.46\"}\n";
    const char *clip = "  optimizer: sgd\n  max_grad_norm: 1.0\n"
                       "framework: {transformers_version: \"4.46\"}\n";
    mm_prediction a = unit_tiny_predict(old), b = unit_tiny_predict(clip);
    uint64_t d = b.phase_peak[MM_PHASE_OPTIMIZER] - a.phase_peak[MM_PHASE_OPTIMIZER];
    ck_assert_msg(b.phase_peak[MM_PHASE_OPTIMIZER] > a.phase_peak[MM_PHASE_OPTIMIZER] &&
                      d >= 39 * 512 + 512 && d <= 39 * 512 + 2 * 512 + 4 * 512,
                  "optimizer peak %llu -> %llu", (unsigned long long)a.phase_peak[MM_PHASE_OPTIMIZER],
                  (unsigned long long)b.phase_peak[MM_PHASE_OPTIMIZER]);
    /* transformers 5's Trainer computes the norm (max_norm = inf) even at 0 */
    mm_prediction c = unit_tiny_predict("  optimizer: sgd\n"), f = unit_tiny_predict("  optimizer: sgd\n  max_grad_norm: 1\n");
    ck_assert_uint_eq(c.phase_peak[MM_PHASE_OPTIMIZER], f.phase_peak[MM_PHASE_OPTIMIZER]);
    ck_assert_uint_eq(c.phase_peak[MM_PHASE_OPTIMIZER], b.phase_peak[MM_PHASE_OPTIMIZER]);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
    mm_prediction_free(&f);
}
END_TEST

/* versions: accepted where the model follows them, refused elsewhere naming the range */
START_TEST(versions_accepted_only_where_modelled)
{
    mm_prediction a = unit_tiny_predict(""), b = unit_tiny_predict("framework: {torch_version: \"2.13\"}\n"),
                  c = unit_tiny_predict("  zero_stage: 2\nframework: {deepspeed_version: \"0.19.3\"}\n");
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    unit_tiny_refused("framework: {torch_version: \"2.6\"}\n", "framework.torch_version", "2.11-2.13");
    unit_tiny_refused("framework: {torch_version: \"3.1\"}\n", "framework.torch_version", "2.11-2.13");
    unit_tiny_refused("  zero_stage: 2\nframework: {deepspeed_version: \"0.12.6\"}\n",
            "framework.deepspeed_version", "0.19.x");
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
}
END_TEST

/* allgather_bucket_size: DeepSpeed asserts it is even; it allocates nothing */
START_TEST(allgather_bucket_size_checked_and_allocates_nothing)
{
    mm_prediction a = unit_tiny_predict("  zero_stage: 2\n"),
                  b = unit_tiny_predict("  zero_stage: 2\ndeepspeed: {allgather_bucket_size: 1000}\n");
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    unit_tiny_refused("  zero_stage: 2\ndeepspeed: {allgather_bucket_size: 1001}\n",
            "deepspeed.allgather_bucket_size", "multiple of 2");
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* pin_memory: the pinned fp32 master and gradient partitions are rounded up to a
 * power of two on the host; the GPU is not affected */
START_TEST(pin_memory_rounds_the_pinned_host_buffers)
{
    const char *off = "  zero_stage: 2\ndeepspeed: {offload_optimizer: cpu, pin_memory: false}\n";
    const char *pin = "  zero_stage: 2\ndeepspeed: {offload_optimizer: cpu, pin_memory: true}\n";
    mm_prediction a = unit_tiny_predict(off), b = unit_tiny_predict(pin);
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    ck_assert_msg(b.host_peak_bytes > a.host_peak_bytes, "host %llu -> %llu",
                  (unsigned long long)a.host_peak_bytes, (unsigned long long)b.host_peak_bytes);
    /* each of the two buffers grows by less than its own size, and they are at most
     * the whole host prediction */
    ck_assert(b.host_peak_bytes - a.host_peak_bytes < a.host_peak_bytes);
    mm_prediction c = unit_tiny_predict("  zero_stage: 2\ndeepspeed: {pin_memory: true}\n"),
                  d = unit_tiny_predict("  zero_stage: 2\n");
    ck_assert_uint_eq(c.host_peak_bytes, d.host_peak_bytes);
    mm_prediction_free(&a);
    mm_prediction_free(&b);
    mm_prediction_free(&c);
    mm_prediction_free(&d);
}
END_TEST

/* FSDP1's limit_all_gathers: true (the modelled rate limiter) only; buffer_dtype refused */
START_TEST(fsdp_limit_all_gathers_and_buffer_dtype)
{
    mm_prediction a = unit_tiny_predict("fsdp: {version: 1}\n"),
                  b = unit_tiny_predict("fsdp: {version: 1, limit_all_gathers: true}\n");
    ck_assert_uint_eq(a.allocated_peak_bytes, b.allocated_peak_bytes);
    unit_tiny_refused("fsdp: {version: 1, limit_all_gathers: false}\n", "fsdp.limit_all_gathers",
            "no bound");
    unit_tiny_refused("fsdp: {version: 2, limit_all_gathers: true}\n", "fsdp.limit_all_gathers",
            "FSDP2");
    unit_tiny_refused("fsdp: {version: 1, buffer_dtype: fp32}\n", "fsdp.buffer_dtype",
            "does not count buffers");
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

/* loss_upcast false: cross_entropy on the bf16 logits: no fp32 copy of the logits
 * (T x V x 4) and a 16-bit log_softmax output instead of an fp32 one; refused under
 * autocast (not measurable on the CPU) and for the chunked / fused losses (they
 * upcast inside) */
START_TEST(loss_upcast_false_drops_the_fp32_logits)
{
    const uint64_t TV = 2ull * 512 * 32000;
    mm_prediction a = unit_tiny_predict(""), b = unit_tiny_predict("  loss_upcast: false\n");
    ck_assert_msg(a.allocated_peak_bytes >= b.allocated_peak_bytes + TV * 4 &&
                      a.allocated_peak_bytes <= b.allocated_peak_bytes + TV * 8,
                  "peak %llu -> %llu", (unsigned long long)a.allocated_peak_bytes,
                  (unsigned long long)b.allocated_peak_bytes);
    unit_tiny_refused("  master_weights: fp32\n  loss_upcast: false\n", "training.loss_upcast",
            "under autocast");
    unit_tiny_refused("  loss: chunked\n  loss_upcast: false\n", "training.loss_upcast", "loss: standard");
    unit_tiny_refused("  loss_upcast: false\nframework: {transformers_version: \"4.40\"}\n",
            "training.loss_upcast", "4.46");
    mm_prediction_free(&a);
    mm_prediction_free(&b);
}
END_TEST

Suite *keys_suite(void)
{
    Suite *s = suite_create("keys");
    TCase *tc = tcase_create("keys");
    tcase_add_test(tc, max_grad_norm_adds_the_norm_temporaries);
    tcase_add_test(tc, versions_accepted_only_where_modelled);
    tcase_add_test(tc, allgather_bucket_size_checked_and_allocates_nothing);
    tcase_add_test(tc, pin_memory_rounds_the_pinned_host_buffers);
    tcase_add_test(tc, fsdp_limit_all_gathers_and_buffer_dtype);
    tcase_add_test(tc, loss_upcast_false_drops_the_fp32_logits);
    suite_add_tcase(s, tc);
    return s;
}
