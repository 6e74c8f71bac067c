/* test_resolve.c - the resolved model (spec/resolve.c): what the step program
 * and the parallel layouts read instead of the spec says what the spec says,
 * for every shipped preset; the tensor-parallel copy holds one rank's decoder;
 * a new micro-batch reaches it without resolving again. */
#include "unit.h"
#include "resolve.h"

#include <stdio.h>
#include <string.h>

/* each module's role, layers, dimensions, trainability and per-layer kinds as
 * its spec gives them */
static void modules_match(const mm_spec *s, const resolved_model *m, const char *path)
{
    uint64_t stride = 1, total = 0;
    ck_assert_uint_eq(m->n_modules, s->n_modules);
    for (size_t i = 0; i < s->n_modules; i++) {
        const module_spec *ms = &s->modules[i];
        const resolved_module *r = &m->modules[i];
        uint64_t layers = ms->num_hidden_layers + ms->num_global_layers;
        ck_assert_msg(r->role == ms->kind && r->spec == ms, "%s module %zu", path, i);
        ck_assert_uint_eq(r->layers, layers);
        ck_assert_uint_eq(r->hidden_size, ms->hidden_size);
        ck_assert_uint_eq(r->num_key_value_heads, ms->num_key_value_heads);
        ck_assert_uint_eq(r->head_dim, ms->head_dim);
        ck_assert_int_eq(r->full_grads, ms->trainable && !ms->lora.enabled);
        ck_assert_int_eq(r->feature_cls, ms->class_token && ms->keep_cls && !ms->packed);
        for (uint64_t l = 0; l < layers && l < MM_MAX_LAYERS; l++) {
            unsigned k = resolved_layer_kind(m, (uint32_t)i, l);
            ck_assert_msg(!(k & LK_CROSS) == !lset_has(&ms->cross, l) &&
                              !(k & LK_DENSE) == !lset_has(&ms->dense, l) &&
                              !(k & LK_SLIDING) == !lset_has(&ms->sliding, l) &&
                              !(k & LK_FULL_ATT) == !lset_has(&ms->full_attention, l) &&
                              !(k & LK_DEEPSTACK) == !lset_has(&ms->deepstack, l) &&
                              !(k & LK_TAP) == !lset_has(&ms->taps, l),
                          "%s module %zu layer %llu: kinds %#x", path, i, (unsigned long long)l, k);
        }
        ck_assert_uint_eq(resolved_layer_kind(m, (uint32_t)i, layers), 0);
        stride = layers > stride ? (layers < MM_MAX_LAYERS ? layers : MM_MAX_LAYERS) : stride;
        total += layers;
    }
    ck_assert_uint_eq(m->layer_stride, stride);
    ck_assert_uint_eq(m->total_layers, total);
}

static void preset_matches(const char *path, void *ctx)
{
    (void)ctx;
    mm_error e;
    resolved_model m;
    mm_spec *s = mm_spec_load_file(path, &e);
    ck_assert_msg(s != NULL, "%s: %s", path, e.msg);
    ck_assert_msg(resolve_model(s, &m, &e) == 0, "%s: %s", path, e.msg);
    ck_assert_ptr_eq(m.spec, s); /* no copy without tensor parallel */
    for (mod_kind k = MOD_VISION; k < MOD_NKIND; k++)
        ck_assert_ptr_eq(resolved_spec_of(&m, k), mm_spec_module(s, k));
    ck_assert_int_eq(m.parallel, spec_parallel(s));
    ck_assert_uint_eq(m.training.data_parallel, 0); /* N is the step's (step_cfg.dp) */
    ck_assert_uint_eq(m.training.micro_batch_size, s->training.micro_batch_size);
    modules_match(s, &m, path);
    resolved_free(&m);
    mm_spec_free(s);
}

START_TEST(every_preset_resolves_as_its_spec)
{
    ck_assert_uint_gt(unit_each_yaml("contrib/models", preset_matches, NULL), 10);
}
END_TEST

static const char TP_SPEC[] =
    "name: tiny\n"
    "modules:\n"
    "  - {name: language_model, type: decoder, family: llama, hidden_size: 512,\n"
    "     num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4, head_dim: 64,\n"
    "     intermediate_size: 1376, vocab_size: 32000, trainable: true}\n"
    "training:\n"
    "  micro_batch_size: 2\n"
    "  seq_len: 512\n"
    "  precision: bf16\n"
    "  tensor_parallel: 2\n";

/* torchtitan's ColwiseParallel / RowwiseParallel: a rank's decoder has half
 * the heads, kv heads and MLP width; head_dim, hidden and vocabulary stay */
START_TEST(tensor_parallel_resolves_one_rank)
{
    mm_error e;
    resolved_model m;
    mm_spec *s = mm_spec_load_buffer(TP_SPEC, strlen(TP_SPEC), "tiny.yaml", MM_FMT_YAML, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    ck_assert_int_eq(resolve_model(s, &m, &e), 0);
    ck_assert_ptr_nonnull(m.tp_copy);
    ck_assert_ptr_eq(m.spec, m.tp_copy);
    const resolved_module *d = &m.modules[m.decoder];
    ck_assert_uint_eq(d->num_attention_heads, 4);
    ck_assert_uint_eq(d->num_key_value_heads, 2);
    ck_assert_uint_eq(d->intermediate_size, 688);
    ck_assert_uint_eq(d->head_dim, 64);
    ck_assert_uint_eq(d->vocab_size, 32000);
    ck_assert_uint_eq(s->modules[0].num_attention_heads, 8); /* the spec is untouched */
    /* a new micro-batch reaches the model and the rank's copy */
    resolved_set_micro_batch(&m, 7);
    ck_assert_uint_eq(m.training.micro_batch_size, 7);
    ck_assert_uint_eq(m.tp_copy->training.micro_batch_size, 7);
    resolved_free(&m);
    mm_spec_free(s);
}
END_TEST

Suite *resolve_suite(void)
{
    Suite *s = suite_create("resolve");
    TCase *tc = tcase_create("resolve");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, every_preset_resolves_as_its_spec);
    tcase_add_test(tc, tensor_parallel_resolves_one_rank);
    suite_add_tcase(s, tc);
    return s;
}
