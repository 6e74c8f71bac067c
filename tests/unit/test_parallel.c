/* test_parallel.c - the distributed strategies on the timeline (parallel*.c),
 * against numbers derived by hand from the libraries' code (each test says
 * which lines): DDP buckets, FSDP1/FSDP2 units, DeepSpeed ZeRO. */
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"
#include "predict.h"
#include "step.h"

/* a Llama with small activations: P = 2*V*H + L*(4*H*H + 3*H*I + 2*H) + H */
#define H 64ull
#define I 128ull
#define V 8000ull
#define L 2ull
#define LAYER (4 * H * H + 3 * H * I + 2 * H)
#define ROOT (2 * V * H + H)
#define P (ROOT + L * LAYER)

static mm_spec *tiny(const char *training, const char *extra)
{
    char buf[2048];
    snprintf(buf, sizeof buf,
             "name: par\nmodules:\n"
             "  - {name: llm, type: llama, hidden_size: %llu, num_hidden_layers: %llu,"
             " num_attention_heads: 2, intermediate_size: %llu, vocab_size: %llu}\n"
             "training: {micro_batch_size: 1, seq_len: 8, attention: sdpa%s}\n%s",
             H, L, I, V, training, extra);
    mm_error e;
    mm_spec *s = mm_spec_load_buffer(buf, strlen(buf), "par.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    return s;
}

/* a frozen tiny Llama with LoRA on every linear, on 2 ranks, with `fsdp` (a
 * line of the spec's fsdp section) */
static mm_spec *lora_dp2(const char *fsdp)
{
    char buf[1024];
    snprintf(buf, sizeof buf,
             "name: par\nmodules:\n"
             "  - {name: llm, type: llama, hidden_size: %llu, num_hidden_layers: %llu,"
             " num_attention_heads: 2, intermediate_size: %llu, vocab_size: %llu,"
             " trainable: false, lora: {r: 8, target_modules: all-linear}}\n"
             "training: {micro_batch_size: 1, seq_len: 8, attention: sdpa, data_parallel: 2}\n%s",
             H, L, I, V, fsdp);
    mm_error e;
    mm_spec *sp = mm_spec_load_buffer(buf, strlen(buf), "par.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(sp != NULL, "%s", e.msg);
    return sp;
}

/* one step with the allocation log */
static void run(const mm_spec *sp, sim *s, uint64_t dp)
{
    step_cfg cfg = {.dp = dp, .nofold = 1, .log = 1};
    mm_error e;
    ck_assert_msg(step_run_spec(sp, NULL, s, &cfg, &e) == 0, "%s", e.msg);
}

/* the allocations (not frees) of one breakdown row, in order */
static size_t allocs_of(const sim *s, const char *row, uint64_t *out, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nev; i++) {
        const sim_ev *e = &s->ev[i];
        if (!e->is_free && e->row < s->nrows && !strcmp(s->rows[e->row].name, row) && n < cap)
            out[n++] = e->bytes;
    }
    return n;
}

/* DDP: reducer.cpp initialize_buckets allocates one flat bucket per bucket for
 * every parameter that requires grad; compute_bucket_assignment_by_size
 * closes a bucket once it holds bucket_cap_mb (distributed.py: a default cap
 * makes the first bucket 1 MiB).  Here the 2*V*H-parameter embedding and
 * lm_head are 1 MB each in bf16, so a 1 MiB cap gives more than one bucket. */
START_TEST(ddp_buckets_hold_every_trainable_gradient)
{
    mm_spec *sp = tiny(", data_parallel: 2", "ddp: {bucket_cap_mb: 1}\n");
    sim s;
    run(sp, &s, 2);
    uint64_t b[64];
    size_t n = allocs_of(&s, "runtime.reduce_buckets", b, 64);
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += b[i];
    ck_assert_uint_eq(sum, 2 * P);
    ck_assert_uint_ge(n, 2);
    for (size_t i = 0; i + 1 < n; i++) /* every bucket but the last reached the cap */
        ck_assert_uint_ge(b[i], 1u << 20);
    sim_free(&s);
    mm_spec_free(sp);
}
END_TEST

/* gradient_as_bucket_view: the .grad become views of the buckets
 * (reducer.cpp mark_variable_ready_dense), so the optimizer step holds one
 * copy of the gradients instead of two: exactly 2P bytes less.  A single
 * process is not wrapped: N = 1 is the same either way. */
START_TEST(ddp_bucket_view_saves_one_gradient_copy)
{
    mm_spec *a = tiny(", data_parallel: 2", "ddp: {gradient_as_bucket_view: false}\n");
    mm_spec *b = tiny(", data_parallel: 2", "ddp: {gradient_as_bucket_view: true}\n");
    mm_prediction pa = unit_predict(a), pb = unit_predict(b);
    ck_assert_uint_eq(pa.phase_peak[MM_PHASE_OPTIMIZER] - pb.phase_peak[MM_PHASE_OPTIMIZER], 2 * P);
    ck_assert_uint_eq(pa.allocated_dp1, pb.allocated_dp1);
    mm_prediction_free(&pa);
    mm_prediction_free(&pb);
    mm_spec_free(a);
    mm_spec_free(b);
}
END_TEST

/* FSDP2 (_fsdp_collectives.py foreach_all_gather / _copy_out): each unit
 * gathers into a flat output, then copies out into per-parameter tensors:
 * the root (embeddings, final norm, lm_head) twice, then each layer twice;
 * FSDP1 (_flat_param.py unshard) gathers straight into the flat parameter. */
START_TEST(fsdp_units_are_gathered_as_the_library_does)
{
    mm_spec *f2 = tiny(", data_parallel: 2", "fsdp: {version: 2}\n");
    mm_spec *f1 = tiny(", data_parallel: 2", "fsdp: {version: 1}\n");
    sim s;
    uint64_t g[64];
    run(f2, &s, 2);
    size_t n = allocs_of(&s, "runtime.gathered_params", g, 64);
    ck_assert_uint_ge(n, 4);
    ck_assert_uint_eq(g[0], 2 * ROOT);
    ck_assert_uint_eq(g[1], 2 * ROOT);
    ck_assert_uint_eq(g[2], 2 * LAYER);
    ck_assert_uint_eq(g[3], 2 * LAYER);
    sim_free(&s);
    run(f1, &s, 2);
    n = allocs_of(&s, "runtime.gathered_params", g, 64);
    ck_assert_uint_ge(n, 3);
    ck_assert_uint_eq(g[0], 2 * ROOT);
    ck_assert_uint_eq(g[1], 2 * LAYER);
    ck_assert_uint_eq(g[2], 2 * LAYER);
    sim_free(&s);
    mm_spec_free(f1);
    mm_spec_free(f2);
}
END_TEST

/* live bytes when the step proper begins (after the model states) */
static uint64_t start_bytes(const sim *s)
{
    uint64_t b = 0;
    for (size_t i = 0; i < s->step_ev && i < s->nev; i++)
        b = s->ev[i].is_free ? b - s->ev[i].bytes : b + s->ev[i].bytes;
    return b;
}

/* FSDP shards the model in its own dtype: a bf16 model (precision bf16, no
 * master weights) starts the step with P/N bf16 parameters and 2 x P/N bf16
 * AdamW states (3P bytes at N = 2); an fp32 model with MixedPrecision(bf16)
 * with fp32 ones (6P), and gathers bf16 units: the shards are cast into one
 * bf16 flat input first (_get_param_all_gather_inputs). */
START_TEST(fsdp_shards_the_model_dtype)
{
    mm_spec *bf = tiny(", data_parallel: 2", "fsdp: {version: 2}\n");
    mm_spec *mp = tiny(", precision: fp32, data_parallel: 2",
                       "fsdp: {version: 2, param_dtype: bf16}\n");
    sim s;
    uint64_t g[8];
    run(bf, &s, 2);
    ck_assert_uint_eq(start_bytes(&s), 3 * P);
    sim_free(&s);
    run(mp, &s, 2);
    ck_assert_uint_eq(start_bytes(&s), 6 * P);
    size_t n = allocs_of(&s, "runtime.gathered_params", g, 8);
    ck_assert_uint_ge(n, 3);
    ck_assert_uint_eq(g[0], ROOT);     /* this rank's half of the root, in bf16 */
    ck_assert_uint_eq(g[1], 2 * ROOT); /* the bf16 flat output */
    ck_assert_uint_eq(g[2], 2 * ROOT); /* the per-parameter copies */
    sim_free(&s);
    mm_spec_free(bf);
    mm_spec_free(mp);
}
END_TEST

/* DeepSpeed ZeRO-2 at N = 2 (stage_1_and_2.py), the optimizer phase of the
 * tiny Llama, by hand.  Groups: decay = every weight, no-decay = the norms
 * (5 x 64).  The decay group (2*512000 + 2*40960 = 1105920 elements) is cut
 * in two partitions of 552960: rank 0 holds the embedding and layer 0, rank 1
 * layer 1 and lm_head, both exactly; the norms' 320 split at 160 cut layer
 * 1's input norm: 192 whole elements each.  Live: bf16 parameters 2P, fp32
 * master and Adam 12P/2, the IPG bucket (hidden^2 elements, bf16), the
 * gradient partition (552960 + 192 elements, bf16), the batch (8 x 24 B);
 * then the step: the partition flattened (bf16) and cast to fp32, the flat
 * freed, AdamW's _foreach_sqrt of it: 8 x 552960 bytes on top. */
START_TEST(zero2_optimizer_phase_by_hand)
{
    mm_spec *sp = tiny(", zero_stage: 2, data_parallel: 2", "");
    mm_prediction p = unit_predict(sp);
    uint64_t gip = 552960 + 192;
    uint64_t want = 2 * P + 6 * P + 2 * H * H + 2 * gip + 8 * 24 + 8 * 552960ull;
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], want);
    mm_prediction_free(&p);
    mm_spec_free(sp);
}
END_TEST

/* ZeRO-3 at N = 2 (stage3.py): bf16 partitions P/2 x 2, the norms (64
 * elements, under the persistence threshold 10 x hidden) also whole, fp32
 * master and Adam 12P/2, the gradient partitions in bf16 (P/2 x 2), the IPG
 * bucket; the step flattens each sub-group's partitions (all tensors, 1e9
 * sub_group_size) like stage 2: 8 x 552960 bytes on top. */
START_TEST(zero3_optimizer_phase_by_hand)
{
    mm_spec *sp = tiny(", zero_stage: 3, data_parallel: 2", "");
    mm_prediction p = unit_predict(sp);
    uint64_t want = P + 2 * (5 * H) + 6 * P + P + 2 * H * H + 8 * 24 + 8 * 552960ull;
    ck_assert_uint_eq(p.phase_peak[MM_PHASE_OPTIMIZER], want);
    mm_prediction_free(&p);
    mm_spec_free(sp);
}
END_TEST

/* the most bytes of one row alive at once within a phase */
static uint64_t max_alive(const sim *s, const char *row, int phase)
{
    uint64_t live = 0, top = 0;
    for (size_t i = 0; i < s->nev; i++) {
        const sim_ev *e = &s->ev[i];
        if (e->row >= s->nrows || strcmp(s->rows[e->row].name, row))
            continue;
        if (e->phase == phase && live > top)
            top = live; /* what the phase starts with counts too */
        live = e->is_free ? live - e->bytes : live + e->bytes;
        if (e->phase == phase && live > top)
            top = live;
    }
    return top;
}

/* live bytes when a phase begins */
static uint64_t live_at(const sim *s, int phase)
{
    uint64_t live = 0;
    for (size_t i = 0; i < s->nev && s->ev[i].phase != phase; i++)
        live = s->ev[i].is_free ? live - s->ev[i].bytes : live + s->ev[i].bytes;
    return live;
}

/* stage 3 keeps a layer gathered from its forward into its backward while
 * the elements fetched in between (later layers, forward and backward) stay
 * within stage3_max_reuse_distance (partitioned_param_coordinator.py
 * __params_to_release); at 0 every layer is released after its forward.  At
 * the end of the forward that is both layers less their norms (persistent,
 * 2H each), in bf16. */
START_TEST(zero3_reuse_distance_keeps_layers)
{
    mm_spec *keep = tiny(", zero_stage: 3, data_parallel: 2", "");
    mm_spec *drop = tiny(", zero_stage: 3, data_parallel: 2",
                         "deepspeed: {stage3_max_reuse_distance: 0}\n");
    sim a, b;
    run(keep, &a, 2);
    run(drop, &b, 2);
    ck_assert_uint_eq(live_at(&a, MM_PHASE_BACKWARD) - live_at(&b, MM_PHASE_BACKWARD),
                      2 * L * (LAYER - 2 * H));
    sim_free(&a);
    sim_free(&b);
    mm_spec_free(keep);
    mm_spec_free(drop);
}
END_TEST

/* round_robin_gradients reorders the flat groups (stage_1_and_2.py
 * _round_robin_reorder): at N = 3 the busiest rank's whole tensors are
 * 1105920 elements in model order (it is cut inside both 512000-element
 * tables), 1048576 round-robin: 57344 bf16 elements less in the optimizer
 * phase. */
START_TEST(zero2_round_robin_changes_the_partition)
{
    mm_spec *a = tiny(", zero_stage: 2, data_parallel: 3", "");
    mm_spec *b = tiny(", zero_stage: 2, data_parallel: 3",
                      "deepspeed: {round_robin_gradients: true}\n");
    mm_prediction pa = unit_predict(a), pb = unit_predict(b);
    ck_assert_uint_eq(pa.phase_peak[MM_PHASE_OPTIMIZER] - pb.phase_peak[MM_PHASE_OPTIMIZER],
                      2 * (1105920 - 1048576));
    mm_prediction_free(&pa);
    mm_prediction_free(&pb);
    mm_spec_free(a);
    mm_spec_free(b);
}
END_TEST

/* find_unused_parameters: _DDPSink clones the outputs at the end of the
 * forward, the logits (1 x 8 x V, bf16) included */
START_TEST(ddp_find_unused_clones_the_outputs)
{
    mm_spec *a = tiny(", data_parallel: 2", "ddp: {find_unused_parameters: true}\n");
    mm_spec *b = tiny(", data_parallel: 2", "ddp: {find_unused_parameters: false}\n");
    sim sa, sb;
    run(a, &sa, 2);
    run(b, &sb, 2);
    ck_assert_uint_eq(max_alive(&sa, "lm_head", MM_PHASE_FORWARD) -
                          max_alive(&sb, "lm_head", MM_PHASE_FORWARD), 2 * 8 * V);
    sim_free(&sa);
    sim_free(&sb);
    mm_spec_free(a);
    mm_spec_free(b);
}
END_TEST

/* what FSDP keeps gathered at most: FSDP1 forward one layer beside the root,
 * two with forward_prefetch; backward two with BACKWARD_PRE (the default),
 * one with NO_PREFETCH; FSDP2 without reshard_after_forward both layers. */
START_TEST(fsdp_prefetch_and_reshard_change_the_gathered_units)
{
    const char *cfg[] = {"fsdp: {version: 1}\n", "fsdp: {version: 1, forward_prefetch: true}\n",
                         "fsdp: {version: 1, backward_prefetch: NO_PREFETCH}\n",
                         "fsdp: {version: 2, reshard_after_forward: false}\n"};
    uint64_t want[][2] = {{ROOT + LAYER, ROOT + 2 * LAYER}, {ROOT + 2 * LAYER, ROOT + 2 * LAYER},
                          {ROOT + LAYER, ROOT + LAYER}, {ROOT + 2 * LAYER, ROOT + 2 * LAYER}};
    for (int i = 0; i < 4; i++) {
        mm_spec *sp = tiny(", data_parallel: 2", cfg[i]);
        sim s;
        run(sp, &s, 2);
        uint64_t f = max_alive(&s, "runtime.gathered_params", MM_PHASE_FORWARD);
        uint64_t b = max_alive(&s, "runtime.gathered_params", MM_PHASE_BACKWARD);
        if (i == 3) { /* FSDP2's per-parameter copies; the flat outputs come and go */
            ck_assert_uint_ge(f, 2 * want[i][0]);
            ck_assert_uint_ge(b, 2 * want[i][1]);
        } else {
            ck_assert_uint_eq(f, 2 * want[i][0]);
            ck_assert_uint_eq(b, 2 * want[i][1]);
        }
        sim_free(&s);
        mm_spec_free(sp);
    }
}
END_TEST

/* stage 3 prefetches the next layer's parameters at a layer's fetch: at most
 * stage3_prefetch_bucket_size elements and what stage3_max_live_parameters
 * leaves (fetch_sub_module).  With nothing kept (reuse distance 0) the most
 * gathered in forward is the root, layer 0 and the prefetch of layer 1 (its
 * LAYER - 2H fetched elements, bf16). */
START_TEST(zero3_prefetch_is_bounded)
{
    const char *cfg[] = {
        "deepspeed: {stage3_max_reuse_distance: 0, stage3_prefetch_bucket_size: 1000000}\n",
        "deepspeed: {stage3_max_reuse_distance: 0, stage3_prefetch_bucket_size: 1}\n",
        "deepspeed: {stage3_max_reuse_distance: 0, stage3_prefetch_bucket_size: 1000000, "
        "stage3_max_live_parameters: 1}\n"};
    uint64_t g[3];
    for (int i = 0; i < 3; i++) {
        mm_spec *sp = tiny(", zero_stage: 3, data_parallel: 2", cfg[i]);
        sim s;
        run(sp, &s, 2);
        g[i] = max_alive(&s, "runtime.gathered_params", MM_PHASE_FORWARD);
        sim_free(&s);
        mm_spec_free(sp);
    }
    ck_assert_uint_eq(g[0] - g[1], 2 * (LAYER - 2 * H - 1));
    ck_assert_uint_eq(g[0] - g[2], 2 * (LAYER - 2 * H));
}
END_TEST

/* bytes of F_GRAD tensors of `row` alive right after the last allocation on
 * `at` (-1: none) */
static int64_t grads_alive_at_last(const sim *s, const char *row, const char *at)
{
    size_t last = s->nev;
    for (size_t i = 0; i < s->nev; i++)
        if (!s->ev[i].is_free && s->ev[i].row < s->nrows && !strcmp(s->rows[s->ev[i].row].name, at))
            last = i;
    if (last == s->nev)
        return -1;
    int64_t b = 0;
    for (size_t i = 0; i <= last; i++)
        if (s->ev[i].cls == F_GRAD && s->ev[i].row < s->nrows && !strcmp(s->rows[s->ev[i].row].name, row))
            b += s->ev[i].is_free ? -(int64_t)s->ev[i].bytes : (int64_t)s->ev[i].bytes;
    return b;
}

/* FSDP2's foreach_reduce (_fsdp_collectives.py:580-590) leaves its loop
 * variable on the unit's last gradient while the list is cleared (:606): the
 * root's last parameter, lm_head (bf16, V*H), is still alive when the
 * reduce-scatter output, the last allocation of the step's reductions, is
 * made.  One process never runs that loop (world_size 1). */
START_TEST(fsdp2_root_reduce_keeps_the_last_gradient)
{
    mm_spec *sp = tiny(", data_parallel: 2", "fsdp: {version: 2}\n");
    sim s;
    run(sp, &s, 2);
    ck_assert_int_eq(grads_alive_at_last(&s, "lm_head", "runtime.reduced_grads"), (int64_t)(2 * V * H));
    sim_free(&s);
    run(sp, &s, 1);
    ck_assert_int_eq(grads_alive_at_last(&s, "lm_head", "runtime.reduced_grads"), 0);
    sim_free(&s);
    mm_spec_free(sp);
}
END_TEST

/* FSDP2 with no MixedPrecision policy gathers every parameter in its own
 * dtype (_fsdp_collectives.py:799-800: mixed dtypes go as bytes): PEFT's fp32
 * adapters on this bf16 model are 4 bytes each in a layer's per-parameter
 * copies; with param_dtype bf16 everything is cast to 2.  The adapters of one
 * layer, r = 8 on all seven linears: 4 x 8 x (H + H) + 3 x 8 x (H + I). */
START_TEST(fsdp2_gathers_fp32_adapters_in_their_dtype)
{
    const char *fs[] = {"fsdp: {version: 2}\n", "fsdp: {version: 2, param_dtype: bf16}\n"};
    uint64_t g[2][8], A = 4 * 8 * (H + H) + 3 * 8 * (H + I);
    for (int i = 0; i < 2; i++) {
        mm_spec *sp = lora_dp2(fs[i]);
        sim s;
        run(sp, &s, 2);
        ck_assert_uint_ge(allocs_of(&s, "runtime.gathered_params", g[i], 8), 4);
        sim_free(&s);
        mm_spec_free(sp);
    }
    ck_assert_uint_eq(g[0][0], g[1][0]);         /* the root: no adapters */
    ck_assert_uint_eq(g[0][3] - g[1][3], 2 * A); /* a layer's copies */
}
END_TEST

/* FSDP1 with use_orig_params: each layer's flat parameter (here LoRA on every
 * linear: frozen bases, trainable adapters) is cut into N equal chunks and
 * the optimizer keeps AdamW states only for the trainable views in this
 * rank's chunk.  A layer, in registration order: q, k, v, o (base H*H,
 * adapters 2*8*H each), gate, up, down (base H*I, adapters 8*(H+I)), two
 * norms: 49 792 elements, the chunk boundary at 24 896 falls in gate's base,
 * so rank 0 holds the four attention adapters (4 096), rank 1 the rest
 * (4 608); over two layers rank 1 holds 512 more than half of 17 408.  The
 * bf16 model's states are bf16 (2 x 2 bytes).  Without use_orig_params the
 * optimizer holds the even flat shards. */
START_TEST(fsdp1_uneven_chunks_hold_uneven_states)
{
    const char *fs[] = {"fsdp: {version: 1, use_orig_params: true}\n",
                        "fsdp: {version: 1, use_orig_params: false}\n"};
    uint64_t b[2];
    for (int i = 0; i < 2; i++) {
        mm_spec *sp = lora_dp2(fs[i]);
        sim s;
        run(sp, &s, 2);
        b[i] = start_bytes(&s);
        sim_free(&s);
        mm_spec_free(sp);
    }
    ck_assert_uint_eq(b[0] - b[1], 512 * 4);
}
END_TEST

/* FSDP1 flattens a unit into one FlatParameter that requires grad when any
 * of its parameters does (_flat_param.py _validate_tensors_to_flatten :832;
 * mixed requires_grad only with use_orig_params :817-825), and the forward's
 * views of it require grad like it (_use_unsharded_views as_params=False):
 * with LoRA on every linear the frozen q_proj base gets a weight gradient
 * (H x H in bf16 per layer), alive until the unit's post-backward; the spec without
 * use_orig_params (which FSDP1 itself would refuse for mixed requires_grad)
 * keeps the predictor's frozen base without one. */
START_TEST(fsdp1_frozen_weights_in_a_training_unit_get_gradients)
{
    const char *fs[] = {"fsdp: {version: 1, use_orig_params: true}\n",
                        "fsdp: {version: 1, use_orig_params: false}\n"};
    uint64_t b[2];
    for (int i = 0; i < 2; i++) {
        mm_spec *sp = lora_dp2(fs[i]);
        sim s;
        run(sp, &s, 2);
        b[i] = 0; /* the weight gradients allocated for the q_proj rows */
        for (size_t k = 0; k < s.nev; k++)
            if (!s.ev[k].is_free && s.ev[k].cls == F_GRAD && s.ev[k].row < s.nrows &&
                !strcmp(s.rows[s.ev[k].row].name, "layers.self_attn.q_proj"))
                b[i] += s.ev[k].bytes;
        sim_free(&s);
        mm_spec_free(sp);
    }
    ck_assert_uint_eq(b[1], 0);
    ck_assert_uint_eq(b[0], L * H * H * 2);
}
END_TEST

/* fsdp.wrap_policy peft_lora: PEFT's fsdp_auto_wrap_policy (peft/utils/other.py
 * :1294-1307) makes every lora_A / lora_B its own FlatParameter, so the layer's
 * flat parameter is frozen: the frozen q_proj base gets no weight gradient even
 * with use_orig_params, and the largest unsharded flat gradient is no longer a
 * whole layer's (L x (4H^2 + 3HI) frozen + adapters) but the adapters' only.
 * FSDP2 and a fully trainable decoder are refused with the key. */
START_TEST(fsdp1_peft_wrap_policy_drops_the_frozen_gradients)
{
    const char *fs[] = {"fsdp: {version: 1, use_orig_params: true}\n",
                        "fsdp: {version: 1, use_orig_params: true, wrap_policy: peft_lora}\n"};
    uint64_t q[2], flat[2];
    char buf[1024];
    for (int i = 0; i < 2; i++) {
        mm_spec *sp = lora_dp2(fs[i]);
        sim s;
        run(sp, &s, 2);
        q[i] = flat[i] = 0;
        for (size_t k = 0; k < s.nev; k++) {
            const sim_ev *ev = &s.ev[k];
            if (ev->is_free || ev->cls != F_GRAD || ev->row >= s.nrows)
                continue;
            if (!strcmp(s.rows[ev->row].name, "layers.self_attn.q_proj"))
                q[i] += ev->bytes;
            if (!strcmp(s.rows[ev->row].name, "runtime.reduced_grads") && ev->bytes > flat[i])
                flat[i] = ev->bytes;
        }
        sim_free(&s);
        mm_spec_free(sp);
    }
    ck_assert_uint_eq(q[0], L * H * H * 2);
    ck_assert_uint_eq(q[1], 0);
    ck_assert_uint_ge(flat[0], (4 * H * H + 3 * H * I) * 2);
    ck_assert_uint_lt(flat[1], (4 * H * H + 3 * H * I) * 2);
    ck_assert_uint_gt(flat[1], 0);
    const char *bad[] = {"fsdp: {version: 2, wrap_policy: peft_lora}\n",
                         "fsdp: {version: 1, wrap_policy: peft_lora}\n"};
    for (int i = 0; i < 2; i++) {
        snprintf(buf, sizeof buf,
                 "name: par\nmodules:\n"
                 "  - {name: llm, type: llama, hidden_size: %llu, num_hidden_layers: %llu,"
                 " num_attention_heads: 2, intermediate_size: %llu, vocab_size: %llu%s}\n"
                 "training: {micro_batch_size: 1, seq_len: 8, attention: sdpa, data_parallel: 2}\n%s",
                 H, L, I, V, i ? "" : ", trainable: false, lora: {r: 8, target_modules: all-linear}", bad[i]);
        mm_error e;
        mm_spec *sp = mm_spec_load_buffer(buf, strlen(buf), "par.yaml", MM_FMT_YAML, &e);
        ck_assert_ptr_null(sp);
        ck_assert_msg(strstr(e.msg, "fsdp.wrap_policy") != NULL, "%s", e.msg);
    }
}
END_TEST

/* the lora_A weight gradients made in backward before the backward's second
 * all-gather on runtime.gathered_params (the first gathers the top layer at its
 * pre-backward, the second prefetches the layer below) */
static uint64_t lora_grads_before_prefetch(const sim *s)
{
    uint64_t n = 0, gathers = 0;
    for (size_t k = 0; k < s->nev; k++) {
        const sim_ev *ev = &s->ev[k];
        if (ev->is_free || ev->phase != MM_PHASE_BACKWARD || ev->row >= s->nrows)
            continue;
        const char *nm = s->rows[ev->row].name;
        size_t len = strlen(nm);
        if (!strcmp(nm, "runtime.gathered_params") && ++gathers == 2)
            return n;
        if (ev->cls == F_GRAD && len > 7 && !strcmp(nm + len - 7, ".lora_A"))
            n++;
    }
    return UINT64_MAX;
}

/* peft_lora: FSDP1 prefetches by post-forward order (_exec_order_utils.py
 * get_handle_to_backward_prefetch), so the layer below is gathered only at
 * the pre-backward of the top layer's first adapter: after the top layer's 7
 * lora_A gradients (all-linear on llama), not at the top layer's pre-backward */
START_TEST(fsdp1_peft_wrap_policy_defers_the_prefetch)
{
    const char *fs[] = {"fsdp: {version: 1}\n", "fsdp: {version: 1, wrap_policy: peft_lora}\n"};
    uint64_t n[2];
    for (int i = 0; i < 2; i++) {
        mm_spec *sp = lora_dp2(fs[i]);
        sim s;
        run(sp, &s, 2);
        n[i] = lora_grads_before_prefetch(&s);
        sim_free(&s);
        mm_spec_free(sp);
    }
    ck_assert_uint_eq(n[0], 0);
    ck_assert_uint_eq(n[1], 7);
}
END_TEST

Suite *parallel_suite(void)
{
    Suite *s = suite_create("parallel");
    TCase *tc = tcase_create("strategies");
    tcase_add_test(tc, ddp_buckets_hold_every_trainable_gradient);
    tcase_add_test(tc, fsdp1_frozen_weights_in_a_training_unit_get_gradients);
    tcase_add_test(tc, ddp_bucket_view_saves_one_gradient_copy);
    tcase_add_test(tc, fsdp_units_are_gathered_as_the_library_does);
    tcase_add_test(tc, fsdp_shards_the_model_dtype);
    tcase_add_test(tc, zero2_optimizer_phase_by_hand);
    tcase_add_test(tc, zero3_optimizer_phase_by_hand);
    tcase_add_test(tc, zero3_reuse_distance_keeps_layers);
    tcase_add_test(tc, zero3_prefetch_is_bounded);
    tcase_add_test(tc, zero2_round_robin_changes_the_partition);
    tcase_add_test(tc, ddp_find_unused_clones_the_outputs);
    tcase_add_test(tc, fsdp_prefetch_and_reshard_change_the_gathered_units);
    tcase_add_test(tc, fsdp2_root_reduce_keeps_the_last_gradient);
    tcase_add_test(tc, fsdp2_gathers_fp32_adapters_in_their_dtype);
    tcase_add_test(tc, fsdp1_uneven_chunks_hold_uneven_states);
    tcase_add_test(tc, fsdp1_peft_wrap_policy_drops_the_frozen_gradients);
    tcase_add_test(tc, fsdp1_peft_wrap_policy_defers_the_prefetch);
    suite_add_tcase(s, tc);
    return s;
}
