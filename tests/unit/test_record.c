/* test_record.c - the MMGUARD variable (spank_plugin/record.c): what the
 * plugin publishes and slurmstepd (as root) reads back.  A round trip keeps
 * every value; hostile text is refused naming the field; the published peak
 * model gives mm_peak_for_dp() of the real prediction for every N. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"
#include "plugin_tests.h"
#include "record.h"
#include "unit.h"

static struct mmg_record r, back;
static char text[MMG_RECORD_MAX + 1], err[256];

static void sample(struct mmg_record *x)
{
    memset(x, 0, sizeof(*x));
    snprintf(x->decision, sizeof(x->decision), "accept");
    snprintf(x->spec, sizeof(x->spec), "/home/a b/%%llava\xc3\xa9.yaml");
    snprintf(x->sha256, sizeof(x->sha256), "%064d", 7);
    snprintf(x->model, sizeof(x->model), "llava=1 x");
    snprintf(x->gpu, sizeof(x->gpu), "h100");
    snprintf(x->request, sizeof(x->request), "h100:2x1-1/node");
    x->gpu_mem = 85520809984ull;
    x->usable = 76968728985ull;
    x->dp = 2;
    x->peak = 70000000000ull;
    x->alloc = 60000000000ull;
    x->has_mmb = 1;
    x->mmb = 0;
    x->host = 18664214016ull;
    x->has_model = 1;
    x->ctx = 808452096;
    x->nccl = 1ull << 30;
    x->afix = 0;
    x->afrac = 0.05;
    x->slack = 11244778492ull;
    x->dp1 = 145597763588ull;
    x->n_terms = 2;
    x->terms[0].fixed = 23321632772ull;
    x->terms[0].sharded = 122276130816ull;
    x->terms[1].fixed = 1;
    x->terms[1].sharded = 0;
}

START_TEST(round_trip)
{
    sample(&r);
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    /* strings are percent-encoded: no blank, no '%' of their own */
    ck_assert_ptr_nonnull(strstr(text, " spec=/home/a%20b/%25llava%C3%A9.yaml "));
    ck_assert_ptr_nonnull(strstr(text, " model=llava=1%20x "));
    ck_assert_ptr_nonnull(strstr(text, " mmb=0 host=18664214016 "));
    ck_assert_msg(mmg_record_parse(text, &back, err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(back.spec, r.spec);
    ck_assert_str_eq(back.model, r.model);
    ck_assert_uint_eq(back.peak, r.peak);
    ck_assert_uint_eq(back.dp, 2);
    ck_assert_uint_eq(back.host, 18664214016ull);
    ck_assert(back.has_mmb && back.mmb == 0);
    ck_assert(back.has_model && back.afrac == 0.05);
    ck_assert_uint_eq(back.n_terms, 2);
    ck_assert_uint_eq(back.terms[0].sharded, r.terms[0].sharded);
    /* an error decision without a prediction: only what is known */
    memset(&r, 0, sizeof(r));
    snprintf(r.decision, sizeof(r.decision), "error");
    snprintf(r.error, sizeof(r.error), "spec.yaml:3:1: modules: missing");
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_str_eq(text, "v=2 decision=error error=spec.yaml:3:1:%20modules:%20missing");
    ck_assert_int_eq(mmg_record_parse(text, &back, err, sizeof(err)), 0);
    ck_assert(!back.has_model && !back.has_mmb);
}
END_TEST

START_TEST(hostile)
{
    static const struct { const char *text, *msg; } bad[] = {
        { "v=1 decision=accept", "unsupported version" },
        { "decision=accept", "unsupported version" },
        { "v=2 decision=accept decision=warn", "duplicate field 'decision'" },
        { "v=2 color=red", "unknown field 'color'" },
        { "v=2 noequals", "unknown field 'noequals'" },
        { "v=2  decision=accept", "empty field" },
        { "v=2 decision=accept ", "empty field" },
        { "v=2 peak=12a", "bad value of 'peak'" },
        { "v=2 peak=18446744073709551616", "bad value of 'peak'" },
        { "v=2 dp=4294967296", "bad value of 'dp'" },
        { "v=2 peak=", "bad value of 'peak'" },
        { "v=2 spec=%0Aetc", "bad value of 'spec'" },
        { "v=2 spec=%00", "bad value of 'spec'" },
        { "v=2 spec=%G1", "bad value of 'spec'" },
        { "v=2 spec=ab%4", "bad value of 'spec'" },
        { "v=2 decision=acceptable", "bad value of 'decision'" },
        { "v=2 afrac=nan ctx=1 nccl=1 afix=1 slack=1 dp1=1 terms=1:1", "bad value of 'afrac'" },
        { "v=2 afrac=11 ctx=1 nccl=1 afix=1 slack=1 dp1=1 terms=1:1", "bad value of 'afrac'" },
        { "v=2 afrac=0 ctx=1 nccl=1 afix=1 slack=1 dp1=1 terms=1:1,", "bad value of 'terms'" },
        { "v=2 afrac=0 ctx=1 nccl=1 afix=1 slack=1 dp1=1 terms=", "bad value of 'terms'" },
        { "v=2 afrac=0 ctx=1 nccl=1 afix=1 slack=1 dp1=1 terms=1:1,2:2,3:3,4:4,5:5,6:6,7:7,8:8,9:9",
          "bad value of 'terms'" },
        { "v=2 ctx=1 nccl=1", "incomplete peak model" },
    };
    char *big = malloc(MMG_RECORD_MAX + 20);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(mmg_record_parse(bad[i].text, &back, err, sizeof(err)) == -1, "accepted '%s'",
                      bad[i].text);
        ck_assert_msg(strstr(err, bad[i].msg) != NULL, "'%s': '%s', want '%s'", bad[i].text, err,
                      bad[i].msg);
    }
    ck_assert_ptr_nonnull(big);
    memcpy(big, "v=2 spec=", 9);
    memset(big + 9, 'a', MMG_RECORD_MAX + 5);
    big[MMG_RECORD_MAX + 14] = '\0';
    ck_assert_int_eq(mmg_record_parse(big, &back, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "longer than"));
    free(big);
}
END_TEST

/* The published model evaluates to mm_peak_for_dp() of the prediction it was
 * taken from, for every N up to 4096. */
START_TEST(peak_model)
{
    mm_error e;
    mm_prediction p;
    mm_spec *spec = mm_spec_load_file(SRCDIR "/tests/jobsubmit/specs/resize-h100.yaml", &e);
    ck_assert_msg(spec != NULL, "%s", e.msg);
    ck_assert_int_eq(mm_predict(spec, &p, &e), 0);
    memset(&r, 0, sizeof(r));
    snprintf(r.decision, sizeof(r.decision), "accept");
    mmg_record_set_model(&r, &p);
    ck_assert_uint_gt(r.slack, 0);
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_int_eq(mmg_record_parse(text, &back, err, sizeof(err)), 0);
    for (uint32_t n = 1; n <= 4096; n++)
        ck_assert_uint_eq(mmg_record_peak_for_dp(&back, n), mm_peak_for_dp(&p, n));
    ck_assert_uint_eq(mmg_record_peak_for_dp(&back, p.data_parallel), p.peak_bytes);
    mm_prediction_free(&p);
    mm_spec_free(spec);
}
END_TEST

TCase *record_tcase(void)
{
    TCase *tc = tcase_create("record");
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, hostile);
    tcase_add_test(tc, peak_model);
    tcase_set_timeout(tc, 30);
    return tc;
}
