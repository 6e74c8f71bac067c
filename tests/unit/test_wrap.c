/* test_wrap.c - FSDP1's size-based auto-wrap (fsdp.wrap_policy size,
 * fsdp.min_num_params; train/parallel_wrap.c): the units torch's _recursive_wrap
 * forms (torch/distributed/fsdp/wrap.py:488-563 with size_based_auto_wrap_policy
 * :341-397), seen as the all-gathers of the forward, and the refusals. */
#include "unit.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"
#include "predict.h"
#include "step.h"

/* a Llama: q, k, v, o H x H each (attention 4H^2 = 16384), the MLP 3HI = 24576 (each
 * Linear 8192), a layer 4H^2 + 3HI + 2H = 41088, embed_tokens and lm_head V*H = 512000 */
#define H 64ull
#define I 128ull
#define V 8000ull
#define L 2ull
#define ATTN (4 * H * H)
#define MLP (3 * H * I)
#define LAYER (ATTN + MLP + 2 * H)

static mm_spec *llama(const char *lora, const char *fsdp, mm_error *e)
{
    char buf[1024];
    snprintf(buf, sizeof buf,
             "name: wrap\nmodules:\n"
             "  - {name: llm, type: llama, hidden_size: %llu, num_hidden_layers: %llu,"
             " num_attention_heads: 2, intermediate_size: %llu, vocab_size: %llu%s}\n"
             "training: {micro_batch_size: 1, seq_len: 8, attention: sdpa, precision: bf16,"
             " data_parallel: 2}\nfsdp: %s\n",
             H, L, I, V, lora, fsdp);
    return mm_spec_load_buffer(buf, strlen(buf), "wrap.yaml", MM_FMT_YAML, e);
}

/* the step's event log of the tiny Llama with `fsdp`, on 2 ranks, unfolded */
static void logged_step(const char *fsdp, sim *s)
{
    mm_error e;
    mm_spec *sp = llama("", fsdp, &e);
    ck_assert_msg(sp != NULL, "%s", e.msg);
    step_cfg cfg = {.dp = 2, .nofold = 1, .log = 1};
    ck_assert_msg(step_run_spec(sp, NULL, s, &cfg, &e) == 0, "%s", e.msg);
    mm_spec_free(sp);
}

/* the forward's all-gathers (runtime.gathered_params allocations), in bytes */
static size_t forward_gathers(const char *fsdp, uint64_t *out, size_t cap)
{
    sim s;
    logged_step(fsdp, &s);
    size_t n = 0;
    for (size_t i = 0; i < s.nev; i++) {
        const sim_ev *ev = &s.ev[i];
        if (!ev->is_free && ev->phase == MM_PHASE_FORWARD && ev->row < s.nrows &&
            !strcmp(s.rows[ev->row].name, "runtime.gathered_params") && n < cap)
            out[n++] = ev->bytes;
    }
    sim_free(&s);
    return n;
}

/* bf16: 2 bytes a parameter.  The default policy: the root (embeddings, lm_head,
 * norm) then each layer.  min 30000: each layer a unit (its MLP, 24576, is below
 * min, not recursed into), embed_tokens and lm_head units of their own, the root
 * the final norm.  min 20000: each MLP a unit; a layer's attention and norms
 * (16512) are not, and what the layers leave in the base model (2 x 16512 + H)
 * reaches min: the LlamaModel unit, gathered first; the root holds nothing.  min
 * above the model: one root unit. */
START_TEST(size_wrap_forms_the_units_of_recursive_wrap)
{
    uint64_t g[16];
    size_t n = forward_gathers("{version: 1}", g, 16);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(g[0], (2 * V * H + H) * 2);
    ck_assert_uint_eq(g[1], LAYER * 2);
    n = forward_gathers("{version: 1, wrap_policy: size, min_num_params: 30000}", g, 16);
    ck_assert_uint_eq(n, 5);
    uint64_t want[] = {H * 2, V * H * 2, LAYER * 2, LAYER * 2, V * H * 2};
    for (size_t i = 0; i < 5; i++)
        ck_assert_uint_eq(g[i], want[i]);
    n = forward_gathers("{version: 1, wrap_policy: size, min_num_params: 20000}", g, 16);
    ck_assert_uint_eq(n, 5);
    uint64_t want2[] = {(2 * (ATTN + 2 * H) + H) * 2, V * H * 2, MLP * 2, MLP * 2, V * H * 2};
    for (size_t i = 0; i < 5; i++)
        ck_assert_uint_eq(g[i], want2[i]);
    n = forward_gathers("{version: 1, wrap_policy: size, min_num_params: 100000000}", g, 16);
    ck_assert_uint_eq(n, 1);
    ck_assert_uint_eq(g[0], (2 * V * H + H + L * LAYER) * 2);
}
END_TEST

/* the position in the event log of the first free of a q_proj weight gradient,
 * and of the last mlp weight gradient made (backward) */
static void q_free_mlp_last(const char *fsdp, size_t *qfree, size_t *mlp_last)
{
    sim s;
    logged_step(fsdp, &s);
    *qfree = SIZE_MAX;
    *mlp_last = 0;
    for (size_t i = 0; i < s.nev; i++) {
        const sim_ev *ev = &s.ev[i];
        if (ev->cls != F_GRAD || ev->row >= s.nrows || ev->phase != MM_PHASE_BACKWARD)
            continue;
        const char *nm = s.rows[ev->row].name;
        if (ev->is_free && !strcmp(nm, "layers.self_attn.q_proj") && *qfree == SIZE_MAX)
            *qfree = i;
        if (!ev->is_free && !strncmp(nm, "layers.mlp.", 11))
            *mlp_last = i;
    }
    sim_free(&s);
}

/* A layer's parameters that no unit of the layer holds are views of their
 * parent's flat parameter: their gradients wait for its post-backward.  min
 * 30000: the layer's unit holds q_proj, whose gradient goes at the top layer's
 * reduce, before the bottom layer's MLP gradients are made.  min 20000: q_proj
 * is the LlamaModel unit's, its gradients stay until that unit reduces, after
 * every MLP gradient. */
START_TEST(size_wrap_leftover_gradients_wait_for_their_unit)
{
    size_t q, m;
    q_free_mlp_last("{version: 1, wrap_policy: size, min_num_params: 30000}", &q, &m);
    ck_assert_uint_lt(q, m);
    q_free_mlp_last("{version: 1, wrap_policy: size, min_num_params: 20000}", &q, &m);
    ck_assert_uint_gt(q, m);
    ck_assert_uint_ne(q, SIZE_MAX);
}
END_TEST

/* each key without the other, FSDP2, LoRA without use_orig_params, tied embeddings:
 * refused, naming the key */
START_TEST(size_wrap_refusals_name_the_key)
{
    struct {
        const char *lora, *fsdp, *key;
    } bad[] = {
        {"", "{version: 1, min_num_params: 1000}", "fsdp.min_num_params"},
        {"", "{version: 1, wrap_policy: size}", "fsdp.wrap_policy"},
        {"", "{version: 2, wrap_policy: size, min_num_params: 1000}", "fsdp.wrap_policy"},
        {", trainable: false, lora: {r: 8, target_modules: all-linear}",
         "{version: 1, use_orig_params: false, wrap_policy: size, min_num_params: 1000}",
         "fsdp.wrap_policy"},
        {", tie_word_embeddings: true", "{version: 1, wrap_policy: size, min_num_params: 1000}",
         "fsdp.wrap_policy"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        mm_error e;
        mm_spec *sp = llama(bad[i].lora, bad[i].fsdp, &e);
        ck_assert_msg(sp == NULL, "accepted %s", bad[i].fsdp);
        ck_assert_msg(strstr(e.msg, bad[i].key) != NULL, "%s", e.msg);
    }
    mm_error e;
    mm_spec *sp = llama(", trainable: false, lora: {r: 8, target_modules: all-linear}",
                        "{version: 1, wrap_policy: size, min_num_params: 1000}", &e);
    ck_assert_msg(sp != NULL, "%s", e.msg);
    mm_spec_free(sp);
}
END_TEST

Suite *wrap_suite(void)
{
    Suite *s = suite_create("wrap");
    TCase *tc = tcase_create("size");
    tcase_add_test(tc, size_wrap_forms_the_units_of_recursive_wrap);
    tcase_add_test(tc, size_wrap_leftover_gradients_wait_for_their_unit);
    tcase_add_test(tc, size_wrap_refusals_name_the_key);
    suite_add_tcase(s, tc);
    return s;
}
