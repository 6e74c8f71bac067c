/* test_predict.c - the predictor against numbers computed independently:
 * published parameter counts, a hand
 * computed optimizer phase, and behaviour every user expects (checkpointing,
 * flash attention, ZeRO and more GPUs never make things worse). */
#include "predict.h"
#include "unit.h"
#include "mmguard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void set(mm_spec *s, const char *kv)
{
    mm_error e;
    ck_assert_msg(mm_spec_set(s, kv, &e) == 0, "%s", e.msg);
}

START_TEST(llava7b_parameter_counts)
{
    mm_spec *s = unit_preset("llava-1.5-7b-finetune");
    mm_prediction p = unit_predict(s);
    ck_assert_uint_eq(p.n_modules, 3);
    /* Vicuna-7B v1.5 (published): 6,738,415,616 */
    ck_assert_uint_eq(p.modules[2].parameters_count, 6738415616ull);
    /* mlp2x_gelu 1024 -> 4096 -> 4096 with biases: 20,979,712 */
    ck_assert_uint_eq(p.modules[1].parameters_count, 20979712ull);
    /* CLIP ViT-L/14-336 vision model: patch 1024*3*14*14 + class 1024 + pos 577*1024
     * + pre-LN 2048 + 24 * (4*(1024^2+1024) + 2*2048 + (4096*1024+4096) + (1024*4096+1024))
     * + post-LN 2048 = 303,507,456 (the 224 px model has 303,179,776 = 256 fewer positions) */
    uint64_t layer = 4 * (1024ull * 1024 + 1024) + 2 * 2048 + (4096ull * 1024 + 4096) +
                     (1024ull * 4096 + 1024);
    uint64_t clip = 1024ull * 3 * 14 * 14 + 1024 + 577ull * 1024 + 2048 + 24 * layer + 2048;
    ck_assert_uint_eq(clip, 303507456ull);
    ck_assert_uint_eq(p.modules[0].parameters_count, clip);
    /* finetune: projector + LLM trainable, tower frozen */
    ck_assert_uint_eq(p.modules[0].trainable_count, 0);
    ck_assert_uint_eq(p.trainable_count, 6738415616ull + 20979712ull);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

START_TEST(llava13b_parameter_counts)
{
    mm_spec *s = unit_preset("llava-1.5-13b-pretrain");
    mm_prediction p = unit_predict(s);
    /* Vicuna-13B v1.5: 13,015,864,320 */
    ck_assert_uint_eq(p.modules[2].parameters_count, 13015864320ull);
    ck_assert_uint_eq(p.modules[1].parameters_count, 1024ull * 5120 + 5120 + 5120ull * 5120 + 5120);
    /* pretrain: only the projector is trainable */
    ck_assert_uint_eq(p.trainable_count, p.modules[1].parameters_count);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

START_TEST(lora_parameter_counts)
{
    mm_spec *s = unit_preset("llava-1.5-7b-lora");
    mm_prediction p = unit_predict(s);
    /* r=128 on q,k,v,o (4096x4096) and gate,up (4096->11008), down (11008->4096):
     * per layer r*(in+out) summed, 32 layers */
    uint64_t per = 128ull * (4 * (4096 + 4096) + 2 * (4096 + 11008) + (11008 + 4096));
    ck_assert_uint_eq(p.modules[2].trainable_count, 32 * per);
    ck_assert_uint_eq(p.modules[2].parameters_count, 6738415616ull + 32 * per);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

/* A text-only llama with negligible activations, to read model states. */
static mm_spec *tiny_llm(const char *extra_training)
{
    char buf[2048];
    snprintf(buf, sizeof buf,
             "name: states\nmodules:\n"
             "  - {name: llm, type: llama, hidden_size: 256, num_hidden_layers: 4,"
             " num_attention_heads: 4, intermediate_size: 512, vocab_size: 1000}\n"
             "training: {micro_batch_size: 1, seq_len: 8, precision: bf16, attention: sdpa%s}\n",
             extra_training);
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(buf, strlen(buf), "states.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    return s;
}

/* the Trainer's gradient norm (transformers 5 computes it whatever max_grad_norm,
 * parallel_opt.c clip_temporaries): total_norm, one 512-byte block, is kept through
 * the step; while it is computed, one 0-dim norm per gradient (39 in tiny_llm: 4 x 9
 * in the layers, embed_tokens, the final norm, lm_head) and their stack (39 x 4 bytes)
 * sit beside it */
#define NORM_KEPT 512u
#define NORM_PEAK (39u * 512 + 39u * 4 + 512)

START_TEST(pure_bf16_adamw_optimizer_phase)
{
    /* torch 2.x foreach AdamW on a bf16 model: params 2P + grads 2P + exp_avg and
     * exp_avg_sq 4P + the _foreach_sqrt(exp_avg_sq) temporary 2P = 10P */
    mm_spec *s = tiny_llm("");
    mm_prediction p = unit_predict(s);
    uint64_t P = p.parameters_count;
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], 10 * P + 8 * 24 + NORM_KEPT);
    mm_prediction_free(&p);
    /* fused AdamW has no temporary: 8P, the norm's computation is the peak */
    set(s, "training.optimizer_impl=fused");
    p = unit_predict(s);
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], 8 * P + 8 * 24 + NORM_PEAK);
    mm_prediction_free(&p);
    /* fp32 master weights (autocast): params 4P + grads 4P + states 8P + sqrt 4P */
    set(s, "training.optimizer_impl=foreach");
    set(s, "training.master_weights=fp32");
    p = unit_predict(s);
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], 20 * P + 8 * 24 + NORM_KEPT);
    mm_prediction_free(&p);
    /* SGD without momentum: params + grads; the norm's computation is the peak */
    set(s, "training.master_weights=none");
    set(s, "training.optimizer=sgd");
    p = unit_predict(s);
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], 4 * P + 8 * 24 + NORM_PEAK);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

/* Gradient accumulation: .grad exists from the previous micro-step and every
 * new gradient is added into it, also those of layers recomputed by
 * checkpointing in backward; the step is params + grads + states + sqrt, and
 * the Trainer holds all 4 micro-batches on the device (get_batch_samples). */
START_TEST(accumulation_adds_into_grad)
{
    for (int ck = 0; ck <= 1; ck++) {
        mm_spec *s = tiny_llm(ck ? ", gradient_checkpointing: true" : "");
        set(s, "training.gradient_accumulation_steps=4");
        mm_prediction p = unit_predict(s);
        ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER],
                          10 * p.parameters_count + 4 * 8 * 24 + NORM_KEPT);
        mm_prediction_free(&p);
        mm_spec_free(s);
    }
}
END_TEST

/* Tied embeddings: one weight, one .grad (the embedding's gradient is added
 * into lm_head's), one set of Adam states: the step is still 10P. */
START_TEST(tied_embeddings_one_gradient)
{
    mm_spec *s = tiny_llm("");
    set(s, "llm.tie_word_embeddings=true");
    mm_prediction p = unit_predict(s);
    uint64_t P = p.parameters_count;
    ck_assert_uint_eq(P, 1000ull * 256 + 4 * (4ull * 256 * 256 + 3ull * 256 * 512 + 2 * 256) + 256);
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], 10 * P + 8 * 24 + NORM_KEPT);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

START_TEST(loss_dominates_small_models)
{
    /* Big vocab, long sequence, tiny model: the peak is the loss backward:
     * fp32 log_softmax output + its gradient + the gradient of the fp32 logits */
    mm_spec *s = tiny_llm("");
    set(s, "llm.vocab_size=32000");
    set(s, "training.seq_len=1024");
    set(s, "training.micro_batch_size=4");
    mm_prediction p = unit_predict(s);
    ck_assert_int_eq(p.peak_phase, MM_PHASE_BACKWARD);
    ck_assert_msg(strstr(p.peak_event, "loss") != NULL, "%s", p.peak_event);
    uint64_t TV = 4ull * 1024 * 32000;
    ck_assert_uint_ge(p.allocated_peak_bytes, 12 * TV);
    /* the rest: params + Adam states (8P), the lm_head gradient (2Vh) and the
     * saved activations of 4 small layers (< 40 bytes per token and hidden unit) */
    uint64_t rest = 8 * p.parameters_count + 2ull * 32000 * 256 + 40ull * 4096 * 256 * 4;
    ck_assert_uint_le(p.allocated_peak_bytes, 12 * TV + rest);
    mm_prediction_free(&p);
    /* transformers < 4.46 also copies the shifted fp32 logits in forward:
     * 2 (bf16) + 4 (fp32) + 4 (shifted) + 4 (log_softmax) = 14 TV > 12 TV */
    set(s, "framework.transformers_version=4.37.2");
    p = unit_predict(s);
    ck_assert_int_eq(p.peak_phase, MM_PHASE_FORWARD);
    ck_assert_uint_ge(p.allocated_peak_bytes, 14 * TV - 4ull * 32000 * 4 * 2);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

START_TEST(monotone_behaviour)
{
    mm_spec *s = unit_preset("llava-1.5-7b-finetune");
    set(s, "training.gradient_checkpointing=false");
    set(s, "training.micro_batch_size=4");
    mm_prediction base = unit_predict(s);
    /* checkpointing lowers the peak */
    set(s, "training.gradient_checkpointing=true");
    mm_prediction ck = unit_predict(s);
    ck_assert_uint_lt(ck.allocated_peak_bytes, base.allocated_peak_bytes);
    /* eager attention keeps s^2 tensors: higher than flash */
    set(s, "training.gradient_checkpointing=false");
    set(s, "training.attention=eager");
    mm_prediction eager = unit_predict(s);
    ck_assert_uint_gt(eager.allocated_peak_bytes, base.allocated_peak_bytes);
    /* the eager excess at the peak is at least the saved fp32 + bf16 probs of 32
     * layers (32 * b * a * s^2 * 6 bytes) minus what flash keeps instead: an fp32
     * logsumexp per layer (32 * b * a * s * 4) */
    uint64_t s2 = 32ull * 4 * 32 * 2048 * 2048 * 6 - 32ull * 4 * 32 * 2048 * 4;
    ck_assert_uint_ge(eager.allocated_peak_bytes - base.allocated_peak_bytes, s2);
    /* more GPUs with ZeRO-3 never raise the per-GPU allocated peak; the dp
     * model, replayed at each N, agrees with a direct prediction there */
    set(s, "training.attention=flash");
    uint64_t prev = 0;
    for (uint32_t n = 1; n <= 64; n *= 2) {
        char kv[64];
        mm_error e;
        snprintf(kv, sizeof kv, "training.data_parallel=%u", n);
        set(s, kv);
        mm_prediction q = unit_predict(s);
        ck_assert_int_eq(mm_dp_cover(s, &base, &n, 1, &e), 0);
        ck_assert_uint_eq(mm_peak_for_dp(&base, n), q.peak_bytes);
        if (n > 2)
            ck_assert_uint_le(q.allocated_peak_bytes, prev);
        prev = q.allocated_peak_bytes;
        mm_prediction_free(&q);
    }
    mm_prediction_free(&base);
    mm_prediction_free(&ck);
    mm_prediction_free(&eager);
    mm_spec_free(s);
}
END_TEST

/* issue 21 item 6b: LLaVA-1.5-7B stage 1 with eager attention and checkpointing
 * (the H100 row llava7b-pretrain-eager-b4-s2048-ck1).  In the re-run last
 * layer's backward four (B, H, S, S) fp32 blocks are alive at once - the
 * fp32 gradient from ToCopyBackward, the kept softmax output, grad_input and
 * the CUDA kernel's grad * output (SoftMax.cu softmax_backward_cuda_out) -
 * beside the bf16 weights and every layer's checkpointed input but the
 * running one's (the H200 allocator trace shows exactly these). */
START_TEST(eager_checkpointed_softmax_backward_floor)
{
    mm_spec *s = unit_preset("llava-1.5-7b-pretrain");
    const char *kv[] = {"training.micro_batch_size=4", "training.seq_len=2048",
                        "training.data_parallel=1", "training.zero_stage=0",
                        "training.attention=eager", "framework.transformers_version=5.17"};
    for (size_t i = 0; i < sizeof kv / sizeof *kv; i++)
        set(s, kv[i]);
    mm_prediction p = unit_predict(s);
    uint64_t B = 4, H = 32, S = 2048, h = 4096, L = 32;
    uint64_t floor = p.parameters_count * 2 + 4 * (B * H * S * S * 4) + (L - 1) * (B * S * h * 2);
    ck_assert_uint_ge(p.allocated_peak_bytes, floor);
    ck_assert_int_eq(p.peak_phase, MM_PHASE_BACKWARD);
    mm_prediction_free(&p);
    mm_spec_free(s);
}
END_TEST

/* device.cublas_workspace: the two workspaces (forward thread, autograd) are
 * held in the caching allocator for the whole job: 32 MiB blocks of their own
 * segments add exactly 2 x 32 MiB to the reserved peak and nothing to the
 * step's allocated peak; 0 takes them out. */
START_TEST(cublas_workspaces_are_reserved)
{
    mm_spec *s = unit_preset("llava-1.5-7b-finetune");
    mm_prediction d = unit_predict(s);
    set(s, "device.cublas_workspace=0");
    mm_prediction z = unit_predict(s);
    set(s, "device.cublas_workspace=32MiB");
    mm_prediction t = unit_predict(s);
    ck_assert_uint_eq(d.reserved_peak_bytes - z.reserved_peak_bytes, 64ull << 20);
    ck_assert_uint_eq(t.reserved_peak_bytes, d.reserved_peak_bytes);
    ck_assert_uint_eq(d.allocated_peak_bytes, z.allocated_peak_bytes);
    ck_assert_uint_eq(d.peak_bytes - z.peak_bytes, 64ull << 20);
    mm_prediction_free(&d);
    mm_prediction_free(&z);
    mm_prediction_free(&t);
    mm_spec_free(s);
}
END_TEST

START_TEST(factors_sum_to_allocated)
{
    const char *names[] = {"llava-1.5-7b-pretrain", "llava-1.5-7b-finetune", "llava-1.5-7b-lora",
                           "llava-1.5-13b-finetune"};
    for (size_t i = 0; i < 4; i++) {
        mm_spec *s = unit_preset(names[i]);
        mm_prediction p = unit_predict(s);
        const mm_factors *f = &p.factors;
        ck_assert_uint_eq(f->parameters + f->gradients + f->optimizer_states + f->activations +
                              f->temporaries,
                          p.allocated_peak_bytes);
        ck_assert_uint_eq(p.allocated_peak_bytes + f->overhead, p.peak_bytes);
        uint64_t sum = 0;
        for (size_t m = 0; m < p.n_modules; m++)
            sum += p.modules[m].factors.parameters + p.modules[m].factors.gradients +
                   p.modules[m].factors.optimizer_states + p.modules[m].factors.activations +
                   p.modules[m].factors.temporaries;
        ck_assert_uint_eq(sum, p.allocated_peak_bytes);
        ck_assert_uint_ge(p.allocated_peak_bytes, p.phase_peak[p.peak_phase]);
        char *j = mm_prediction_json(&p, 0);
        ck_assert_ptr_nonnull(j);
        ck_assert_ptr_nonnull(strstr(j, "\"peak_phase\""));
        free(j);
        mm_prediction_free(&p);
        mm_spec_free(s);
    }
}
END_TEST

START_TEST(overflow_is_an_error)
{
    mm_spec *s = tiny_llm("");
    set(s, "llm.hidden_size=131072");
    set(s, "llm.num_attention_heads=4096");
    set(s, "llm.intermediate_size=1048576");
    set(s, "llm.vocab_size=16777216");
    set(s, "training.seq_len=4194304");
    set(s, "training.micro_batch_size=65536");
    mm_prediction p;
    mm_error e;
    ck_assert_int_ne(mm_predict(s, &p, &e), 0);
    ck_assert_msg(strstr(e.msg, "overflow"), "%s", e.msg);
    mm_spec_free(s);
}
END_TEST

/* Public measured points (docs: shared/memory-reference.md, haotian-liu/LLaVA
 * #569 and #655, the LLaVA-1.5 README): a 7B full fine-tune with ZeRO-2 at
 * batch 1 runs out of memory on 4 x A100-40G and works on 8; the 13B pretrain
 * and fine-tune scripts run on 8 x A100-80G. */
START_TEST(public_measured_points)
{
    uint64_t a100_40 = 40960ull << 20, a100_80 = 81920ull << 20;
    mm_spec *s = unit_preset("llava-1.5-7b-finetune");
    set(s, "training.zero_stage=2");
    set(s, "training.micro_batch_size=1");
    mm_prediction p = unit_predict(s);
    const uint32_t ns[] = {4, 8};
    mm_error e;
    ck_assert_int_eq(mm_dp_cover(s, &p, ns, 2, &e), 0);
    ck_assert_uint_gt(mm_peak_for_dp(&p, 4), a100_40);
    ck_assert_uint_le(mm_peak_for_dp(&p, 8), a100_40);
    mm_prediction_free(&p);
    mm_spec_free(s);
    const char *fit80[] = {"llava-1.5-13b-pretrain", "llava-1.5-13b-finetune", "llava-1.5-13b-lora",
                           "llava-1.5-7b-pretrain", "llava-1.5-7b-finetune", "llava-1.5-7b-lora"};
    for (size_t i = 0; i < 6; i++) {
        s = unit_preset(fit80[i]);
        p = unit_predict(s);
        ck_assert_msg(p.peak_bytes <= a100_80, "%s: %llu", fit80[i],
                      (unsigned long long)p.peak_bytes);
        mm_prediction_free(&p);
        mm_spec_free(s);
    }
}
END_TEST

/* Folding identical layers (layers.c) must not change any number: compare with
 * a full simulation of every layer across modes, attention kinds, ZeRO stages,
 * checkpointing, accumulation and precisions. */
START_TEST(folding_is_exact)
{
    const char *names[] = {"llava-1.5-7b-pretrain", "llava-1.5-7b-finetune", "llava-1.5-7b-lora"};
    const char *variants[][3] = {
        {NULL, NULL, NULL},
        {"training.gradient_checkpointing=false", "training.micro_batch_size=2", NULL},
        {"training.attention=eager", "training.micro_batch_size=1", "training.seq_len=700"},
        {"training.zero_stage=0", "training.data_parallel=1", NULL},
        {"training.zero_stage=1", "vision_tower.trainable=true", NULL},
        {"training.gradient_accumulation_steps=4", "training.zero_stage=2", NULL},
        {"training.precision=fp32", "training.attention=sdpa", "training.gradient_checkpointing=false"},
        {"vision_tower.trainable=true", "vision_tower.select_layer=10", "training.zero_stage=1"},
        {"training.images_per_sample=0", NULL, NULL},
        {"training.activation_offloading=true", "training.gradient_checkpointing=false", NULL},
        {"training.activation_offloading=true", "training.zero_stage=2", NULL},
        {"training.gradient_checkpointing={enabled: true, offload: true}", NULL, NULL},
        {"training.zero_stage=0", "fsdp.version=2", "training.data_parallel=2"},
        {"training.zero_stage=0", "fsdp.version=1", "training.data_parallel=2"},
    };
    for (size_t i = 0; i < 3; i++) {
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            mm_spec *s = unit_preset(names[i]);
            for (size_t k = 0; k < 3 && variants[v][k]; k++)
                set(s, variants[v][k]);
            mm_prediction a = unit_predict(s), b;
            mm_error e;
            ck_assert_msg(mm_predict_ex(s, &b, &e, MM_PREDICT_NOFOLD) == 0, "%s", e.msg);
            ck_assert_msg(a.allocated_peak_bytes == b.allocated_peak_bytes,
                          "%s variant %zu: allocated %llu folded, %llu simulated", names[i], v,
                          (unsigned long long)a.allocated_peak_bytes,
                          (unsigned long long)b.allocated_peak_bytes);
            ck_assert_uint_eq(a.peak_bytes, b.peak_bytes);
            ck_assert_int_eq(a.peak_phase, b.peak_phase);
            for (int ph = 0; ph < MM_PHASE_COUNT; ph++)
                ck_assert_msg(a.phase_peak[ph] == b.phase_peak[ph], "%s variant %zu phase %d: "
                              "%llu folded, %llu simulated", names[i], v, ph,
                              (unsigned long long)a.phase_peak[ph],
                              (unsigned long long)b.phase_peak[ph]);
            ck_assert_uint_eq(a.allocated_dp1, b.allocated_dp1);
            ck_assert_msg(a.host_peak_bytes == b.host_peak_bytes, "%s variant %zu: host %llu "
                          "folded, %llu simulated", names[i], v,
                          (unsigned long long)a.host_peak_bytes,
                          (unsigned long long)b.host_peak_bytes);
            ck_assert_uint_eq(a.n_terms, b.n_terms);
            for (size_t t = 0; t < a.n_terms; t++) {
                ck_assert_uint_eq(a.terms[t].fixed, b.terms[t].fixed);
                ck_assert_uint_eq(a.terms[t].sharded, b.terms[t].sharded);
            }
            for (size_t m = 0; m < a.n_modules; m++) {
                ck_assert_uint_eq(a.modules[m].parameters_count, b.modules[m].parameters_count);
                ck_assert_uint_eq(a.modules[m].trainable_count, b.modules[m].trainable_count);
                const mm_factors *fa = &a.modules[m].factors, *fb = &b.modules[m].factors;
                ck_assert_uint_eq(fa->parameters + fa->gradients + fa->optimizer_states +
                                      fa->activations + fa->temporaries,
                                  fb->parameters + fb->gradients + fb->optimizer_states +
                                      fb->activations + fb->temporaries);
            }
            mm_prediction_free(&a);
            mm_prediction_free(&b);
            mm_spec_free(s);
        }
    }
}
END_TEST

Suite *predict_suite(void)
{
    Suite *s = suite_create("predict");
    TCase *tc = tcase_create("predict");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, llava7b_parameter_counts);
    tcase_add_test(tc, eager_checkpointed_softmax_backward_floor);
    tcase_add_test(tc, llava13b_parameter_counts);
    tcase_add_test(tc, lora_parameter_counts);
    tcase_add_test(tc, pure_bf16_adamw_optimizer_phase);
    tcase_add_test(tc, tied_embeddings_one_gradient);
    tcase_add_test(tc, accumulation_adds_into_grad);
    tcase_add_test(tc, loss_dominates_small_models);
    tcase_add_test(tc, monotone_behaviour);
    tcase_add_test(tc, factors_sum_to_allocated);
    tcase_add_test(tc, overflow_is_an_error);
    tcase_add_test(tc, folding_is_exact);
    tcase_add_test(tc, cublas_workspaces_are_reserved);
    tcase_add_test(tc, public_measured_points);
    suite_add_tcase(s, tc);
    return s;
}
