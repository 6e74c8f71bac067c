/* test_record.c - the MMGUARD variable (spank_plugin/record.c): what the
 * plugin publishes and slurmstepd (as root) reads back.  A round trip keeps
 * every value; hostile text is refused naming the field; the published peak
 * model gives mm_peak_for_dp() of the real prediction for every N, unknown
 * where the record has no replay. */
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
    x->dp1 = 145597763588ull;
    x->n_points = 2;
    x->points[0] = (mm_dp_point){.n_from = 1, .n_to = 1, .reserved = 156842542080ull};
    x->points[1] = (mm_dp_point){.n_from = 4, .n_to = UINT32_MAX, .reserved = 1, .paged = 7};
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
    ck_assert_ptr_nonnull(strstr(text, " res=1-1:156842542080:0,4-4294967295:1:7"));
    ck_assert_uint_eq(back.n_points, 2);
    ck_assert_uint_eq(back.points[1].n_to, UINT32_MAX);
    ck_assert_uint_eq(back.points[1].paged, 7);
    ck_assert_uint_eq(back.points[0].reserved, r.points[0].reserved);
    /* a per-degree point carries its own allocated peak, used in place of the terms */
    r.points[0].allocated = 150000000000ull;
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_ptr_nonnull(strstr(text, " res=1-1:156842542080:0:150000000000,4-"));
    ck_assert_msg(mmg_record_parse(text, &back, err, sizeof(err)) == 0, "%s", err);
    ck_assert_uint_eq(back.points[0].allocated, 150000000000ull);
    ck_assert_uint_eq(back.points[1].allocated, 0);
    /* ceil(1.05 a) (0.05 in binary: one byte either way) + slack + ctx */
    uint64_t want = 157500000000ull + 6842542080ull + 808452096ull;
    ck_assert_uint_ge(mmg_record_peak_for_dp(&back, 1), want);
    ck_assert_uint_le(mmg_record_peak_for_dp(&back, 1), want + 1);
    r.points[0].allocated = 0;
    /* an error decision without a prediction: only what is known */
    memset(&r, 0, sizeof(r));
    snprintf(r.decision, sizeof(r.decision), "error");
    snprintf(r.error, sizeof(r.error), "spec.yaml:3:1: modules: missing");
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_str_eq(text, "v=4 decision=error error=spec.yaml:3:1:%20modules:%20missing");
    ck_assert_int_eq(mmg_record_parse(text, &back, err, sizeof(err)), 0);
    ck_assert(!back.has_model && !back.has_mmb);
}
END_TEST

START_TEST(hostile)
{
    static const struct { const char *text, *msg; } bad[] = {
        { "v=1 decision=accept", "unsupported version" },
        { "decision=accept", "unsupported version" },
        { "v=4 decision=accept decision=warn", "duplicate field 'decision'" },
        { "v=4 color=red", "unknown field 'color'" },
        { "v=4 noequals", "unknown field 'noequals'" },
        { "v=4  decision=accept", "empty field" },
        { "v=4 decision=accept ", "empty field" },
        { "v=4 peak=12a", "bad value of 'peak'" },
        { "v=4 peak=18446744073709551616", "bad value of 'peak'" },
        { "v=4 dp=4294967296", "bad value of 'dp'" },
        { "v=4 peak=", "bad value of 'peak'" },
        { "v=4 spec=%0Aetc", "bad value of 'spec'" },
        { "v=4 spec=%00", "bad value of 'spec'" },
        { "v=4 spec=%G1", "bad value of 'spec'" },
        { "v=4 spec=ab%4", "bad value of 'spec'" },
        { "v=4 decision=acceptable", "bad value of 'decision'" },
        { "v=4 afrac=nan ctx=1 nccl=1 afix=1 dp1=1 terms=1:1 res=1-1:0:0", "bad value of 'afrac'" },
        { "v=4 afrac=11 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1 res=1-1:0:0", "bad value of 'afrac'" },
        { "v=4 afrac=0 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1, res=1-1:0:0", "bad value of 'terms'" },
        { "v=4 afrac=0 ctx=1 nccl=1 afix=1 dp1=1 terms= res=1-1:0:0", "bad value of 'terms'" },
        { "v=4 afrac=0 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1,2:2,3:3,4:4,5:5,6:6,7:7,8:8,9:9",
          "bad value of 'terms'" },
        { "v=4 ctx=1 nccl=1", "incomplete peak model" },
        { "v=4 afrac=0 ctx=1 nccl=1 afix=1 dp1=1 terms=1:1", "incomplete peak model" },
        { "v=2 decision=accept", "unsupported version" },
        { "v=4 slack=1", "unknown field 'slack'" },
        { "v=4 res=", "bad value of 'res'" },
        { "v=4 res=1-1:0:0,", "bad value of 'res'" },
        { "v=4 res=0-1:0:0", "bad value of 'res'" },
        { "v=4 res=2-1:0:0", "bad value of 'res'" },
        { "v=4 res=1-2:0", "bad value of 'res'" },
        { "v=4 res=1-2:0:0:0", "bad value of 'res'" },
        { "v=4 res=1-2:0:0:x", "bad value of 'res'" },
        { "v=4 res=1-2:0:0:1:2", "bad value of 'res'" },
        { "v=4 res=1-2:0:0,2-3:0:0", "bad value of 'res'" },
        { "v=4 res=3-4:0:0,1-2:0:0", "bad value of 'res'" },
        { "v=4 res=1-4294967295:0:0,4294967295-4294967295:0:0", "bad value of 'res'" },
        { "v=4 res=1-4294967296:0:0", "bad value of 'res'" },
        { "v=4 res=1-1:18446744073709551616:0", "bad value of 'res'" },
        { "v=4 res=1--1:0:0", "bad value of 'res'" },
        { "v=3 decision=accept", "unsupported version" },
        { "v=4 cards=", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4:fits:0:10,", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4:fits:0:101", "bad value of 'cards'" },
        { "v=4 cards=h100:100:0:fits:0:10", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4:maybe:0:10", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4:fits:0", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4:fits:0:10:7", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4:fits:0:10,H100:100:4:oom:0:10", "bad value of 'cards'" },
        { "v=4 cards=h1%00:100:4:fits:0:10", "bad value of 'cards'" },
        { "v=4 cards=h100:100:4294967296:fits:0:10", "bad value of 'cards'" },
        { "v=4 cards=h100:1e3:4:fits:0:10", "bad value of 'cards'" },
        { "v=4 cards=:100:4:fits:0:10", "bad value of 'cards'" },
        { "v=4 cards=abcdefghijabcdefghijabcdefghijab:100:4:fits:0:10", "bad value of 'cards'" },
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
    memcpy(big, "v=4 spec=", 9);
    memset(big + 9, 'a', MMG_RECORD_MAX + 5);
    big[MMG_RECORD_MAX + 14] = '\0';
    ck_assert_int_eq(mmg_record_parse(big, &back, err, sizeof(err)), -1);
    ck_assert_ptr_nonnull(strstr(err, "longer than"));
    /* at most MMG_RECORD_CARDS cards */
    size_t used = (size_t)snprintf(big, MMG_RECORD_MAX, "v=4 cards=");
    for (int i = 1; i <= MMG_RECORD_CARDS + 1; i++)
        used += (size_t)snprintf(big + used, MMG_RECORD_MAX - used, "%sa:9:%d:fits:0:1",
                                 i > 1 ? "," : "", i);
    ck_assert_int_eq(mmg_record_parse(big, &back, err, sizeof(err)), -1);
    big[strrchr(big, ',') - big] = '\0';
    ck_assert_msg(mmg_record_parse(big, &back, err, sizeof(err)) == 0, "%s", err);
    ck_assert_uint_eq(back.n_cards, MMG_RECORD_CARDS);
    free(big);
}
END_TEST

/* The published model evaluates to mm_peak_for_dp() of the prediction it was
 * taken from, for every N up to 4096: the same peak where the allocator was
 * replayed, unknown elsewhere; the plugin's cap on the points it publishes. */
START_TEST(peak_model)
{
    mm_error e;
    mm_prediction p;
    const uint32_t ns[] = {1, 3, 8, 100};
    mm_spec *spec = mm_spec_load_file(SRCDIR "/tests/jobsubmit/specs/resize-h100.yaml", &e);
    ck_assert_msg(spec != NULL, "%s", e.msg);
    ck_assert_int_eq(mm_spec_set(spec, "training.zero_stage=3", &e), 0);
    ck_assert_int_eq(mm_predict(spec, &p, &e), 0);
    ck_assert_int_eq(mm_dp_cover(spec, &p, ns, 4, &e), 0);
    memset(&r, 0, sizeof(r));
    snprintf(r.decision, sizeof(r.decision), "accept");
    mmg_record_set_model(&r, &p);
    ck_assert_uint_ge(r.n_points, 4);
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_int_eq(mmg_record_parse(text, &back, err, sizeof(err)), 0);
    int unknown = 0;
    for (uint32_t n = 1; n <= 4096; n++) {
        ck_assert_uint_eq(mmg_record_peak_for_dp(&back, n), mm_peak_for_dp(&p, n));
        unknown += mm_peak_for_dp(&p, n) == MM_PEAK_UNKNOWN;
    }
    ck_assert_int_gt(unknown, 4000); /* ZeRO-3 shards: only the replayed degrees are known */
    ck_assert_uint_eq(mmg_record_peak_for_dp(&back, p.data_parallel), p.peak_bytes);
    ck_assert_uint_ne(mmg_record_peak_for_dp(&back, 100), MM_PEAK_UNKNOWN);
    /* more points than a record holds: the first MMG_RECORD_POINTS */
    mm_dp_point many[MMG_RECORD_POINTS + 5];
    for (uint32_t i = 0; i < MMG_RECORD_POINTS + 5; i++)
        many[i] = (mm_dp_point){.n_from = 2 * i + 1, .n_to = 2 * i + 1, .reserved = i};
    free(p.dp_points);
    p.dp_points = many;
    p.n_dp_points = MMG_RECORD_POINTS + 5;
    mmg_record_set_model(&r, &p);
    ck_assert_uint_eq(r.n_points, MMG_RECORD_POINTS);
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_int_eq(mmg_record_parse(text, &back, err, sizeof(err)), 0);
    ck_assert_uint_eq(back.n_points, MMG_RECORD_POINTS);
    ck_assert_uint_eq(mmg_record_peak_for_dp(&back, 2 * MMG_RECORD_POINTS + 1), MM_PEAK_UNKNOWN);
    p.dp_points = NULL;
    p.n_dp_points = 0;
    mm_prediction_free(&p);
    mm_spec_free(spec);
}
END_TEST

/* cards=: the verdicts published for job_submit.lua are those of a direct
 * mm_verdict_for at each (card, count), and survive the round trip. */
START_TEST(cards)
{
    mm_error e;
    const char *names[] = { "c40", "c50", "c60" };
    const uint64_t mem[] = { 40ull << 30, 50ull << 30, 60ull << 30 };
    const uint32_t counts[] = { 8, 4 };
    int kinds[3] = { 0, 0, 0 };
    mm_spec *spec = mm_spec_load_file(SRCDIR "/contrib/models/llava-1.5-7b-finetune.yaml", &e);
    ck_assert_msg(spec != NULL, "%s", e.msg);
    memset(&r, 0, sizeof(r));
    ck_assert_msg(mmg_cards_add(r.cards, &r.n_cards, spec, 3, names, mem, mem, 2, counts, &e) == 0,
                  "%s", e.msg);
    ck_assert_uint_eq(r.n_cards, 6);
    /* again: pairs already there are not replayed again */
    ck_assert_int_eq(mmg_cards_add(r.cards, &r.n_cards, spec, 3, names, mem, mem, 1, counts, &e), 0);
    ck_assert_uint_eq(r.n_cards, 6);
    ck_assert_int_eq(mmg_record_format(&r, text, sizeof(text)), 0);
    ck_assert_msg(mmg_record_parse(text, &back, err, sizeof(err)) == 0, "%s: %s", err, text);
    ck_assert_uint_eq(back.n_cards, 6);
    for (size_t i = 0; i < 6; i++) {
        const struct mmg_card *c = mmg_record_card(&back, names[i % 3], counts[i / 3]);
        mm_verdict v;
        mm_spec *at = mm_spec_clone(spec);
        char assign[64];
        snprintf(assign, sizeof(assign), "training.data_parallel=%u", counts[i / 3]);
        ck_assert_int_eq(mm_spec_set(at, assign, &e), 0);
        ck_assert_int_eq(mm_verdict_for(at, mem[i % 3], mem[i % 3], 0, &v, &e), 0);
        ck_assert_ptr_nonnull(c);
        ck_assert_int_eq(c->kind, v.kind);
        ck_assert_uint_eq(c->retries, v.retries_step);
        ck_assert_uint_eq(c->peak, v.reserved_peak + v.context_bytes);
        ck_assert_uint_le(c->peak, mem[i % 3]);
        if (counts[i / 3] == 8)
            kinds[c->kind]++;
        mm_spec_free(at);
    }
    /* docs/allocator.md: out of memory at 40 GiB, flushes at 50, fits at 60 on 8 GPUs */
    ck_assert_int_eq(mmg_record_card(&back, "c40", 8)->kind, MM_VERDICT_OOM);
    ck_assert_int_eq(mmg_record_card(&back, "C50", 8)->kind, MM_VERDICT_FLUSHES);
    ck_assert_int_eq(mmg_record_card(&back, "c60", 8)->kind, MM_VERDICT_FITS);
    ck_assert_ptr_null(mmg_record_card(&back, "c60", 2));
    /* a count the spec refuses is left out, the next still judged */
    const uint32_t some[] = { 0, 2 };
    ck_assert_int_eq(mmg_cards_add(r.cards, &r.n_cards, spec, 1, names, mem, mem, 2, some, &e), -1);
    ck_assert_ptr_null(mmg_cards_find(r.cards, r.n_cards, "c40", 0));
    ck_assert_ptr_nonnull(mmg_cards_find(r.cards, r.n_cards, "c40", 2));
    ck_assert_uint_eq(r.n_cards, 7);
    mm_spec_free(spec);
}
END_TEST

TCase *record_tcase(void)
{
    TCase *tc = tcase_create("record");
    tcase_add_test(tc, round_trip);
    tcase_add_test(tc, hostile);
    tcase_add_test(tc, peak_model);
    tcase_add_test(tc, cards);
    tcase_set_timeout(tc, 30);
    return tc;
}
