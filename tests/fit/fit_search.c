/* fit_search.c - `make check-fit-search`: the largest micro-batch as the
 * plugin publishes it (mm_max_micro_batch: MMGUARD_MAX_MICRO_BATCH, the
 * record's mmb=), for each spec given, on cards from "nothing runs" to H200
 * size and at 0.9x / 1.3x the spec's own uncapped peak, under flush=warn (a
 * flush runs) and flush=reject (only FITS counts), by `mmguard check`'s
 * verdict (mm_verdict_for): the answer fits and one more does not; it is the
 * same with and without the spec's own verdict passed in (the plugin passes
 * it); the early-stopped test the flush=reject search uses
 * (verdict_fits_clean) says what the full verdict says at the answer and one
 * above.  Beside it a plain bisection over 1..65536 by the same verdict:
 * where the verdict is monotone in the micro-batch both find the one
 * boundary; two different answers that both pass are two boundaries, which
 * exist only where it is not (fragmentation), and are listed as such.
 *
 *   fit_search SPEC...      (exit 1 when a check fails) */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"
#include "verdict.h"

#define CAP 65536u

static int fails, two;

/* the verdict at micro-batch m: 1 acceptable, 0 not (a size the model refuses
 * never fits), *k its kind */
static int ok_at(const mm_spec *s, uint32_t m, uint64_t gpu, int no_flush, mm_verdict_kind *k)
{
    char kv[64];
    mm_error e;
    mm_verdict v;
    mm_spec *c = mm_spec_clone(s);
    snprintf(kv, sizeof kv, "training.micro_batch_size=%" PRIu32, m);
    int rc = !c || mm_spec_set(c, kv, &e) || mm_verdict_for(c, gpu, gpu, 0, &v, &e);
    mm_spec_free(c);
    *k = rc ? MM_VERDICT_OOM : v.kind;
    return *k == MM_VERDICT_FITS || (*k == MM_VERDICT_FLUSHES && !no_flush);
}

static uint32_t plain(const mm_spec *s, uint64_t gpu, int no_flush)
{
    uint32_t lo = 0, hi = CAP + 1;
    mm_verdict_kind k;
    while (hi > lo + 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ok_at(s, mid, gpu, no_flush, &k))
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* verdict_fits_clean against the full verdict at m */
static void clean_agrees(const char *name, const mm_spec *s, uint32_t m, uint64_t gpu)
{
    char kv[64];
    mm_error e;
    mm_verdict_kind k;
    if (!m || m > CAP)
        return;
    int want = ok_at(s, m, gpu, 1, &k);
    mm_spec *c = mm_spec_clone(s);
    snprintf(kv, sizeof kv, "training.micro_batch_size=%" PRIu32, m);
    int got = c && !mm_spec_set(c, kv, &e) ? verdict_fits_clean(c, gpu, gpu, &e) : -1;
    mm_spec_free(c);
    if ((got == 1) != want) {
        printf("FAIL %s at %" PRIu64 " B, m=%" PRIu32 ": verdict %s, verdict_fits_clean %d\n",
               name, gpu, m, mm_verdict_name(k), got);
        fails++;
    }
}

static void one_card(const char *name, const mm_spec *s, uint64_t gpu)
{
    mm_verdict own;
    mm_error e;
    if (mm_verdict_for(s, gpu, gpu, 0, &own, &e)) {
        printf("FAIL %s: %s\n", name, e.msg);
        fails++;
        return;
    }
    for (int nf = 0; nf <= 1; nf++) {
        uint32_t got = mm_max_micro_batch(s, gpu, gpu, nf, NULL);
        uint32_t with = mm_max_micro_batch(s, gpu, gpu, nf, &own);
        uint32_t want = plain(s, gpu, nf);
        mm_verdict_kind k1, k2;
        int ok1 = got == 0 || ok_at(s, got, gpu, nf, &k1);
        int ok2 = got == CAP || !ok_at(s, got + 1, gpu, nf, &k2);
        if (got != want && ok1 && ok2 && with == got) {
            printf("  not monotone: %s at %" PRIu64 " B, flush=%s: %" PRIu32 " and the plain "
                   "bisection's %" PRIu32 " both fit with one more out\n", name, gpu,
                   nf ? "reject" : "warn", got, want);
            two++;
        } else if (got != want || with != got || !ok1 || !ok2) {
            printf("FAIL %s at %" PRIu64 " B, flush=%s: search %" PRIu32 " (given the spec's "
                   "verdict %" PRIu32 "), plain bisection %" PRIu32 "%s%s\n", name, gpu,
                   nf ? "reject" : "warn", got, with, want, ok1 ? "" : "; the answer does not fit",
                   ok2 ? "" : "; one more fits");
            fails++;
        }
        if (nf) {
            clean_agrees(name, s, got, gpu);
            clean_agrees(name, s, got + 1, gpu);
        }
        printf("  %-40s %7.1f GiB flush=%-6s %5" PRIu32 "\n", name, (double)gpu / (1 << 30),
               nf ? "reject" : "warn", got);
    }
}

int main(int argc, char **argv)
{
    const uint64_t GiB = 1ull << 30;
    int cases = 0;
    for (int i = 1; i < argc; i++) {
        mm_error e;
        mm_spec *s = mm_spec_load_file(argv[i], &e);
        mm_prediction p;
        if (!s || mm_predict(s, &p, &e)) {
            printf("FAIL %s: %s\n", argv[i], e.msg);
            mm_spec_free(s);
            fails++;
            continue;
        }
        const char *name = strrchr(argv[i], '/') ? strrchr(argv[i], '/') + 1 : argv[i];
        uint64_t own = p.peak_bytes, cards[] = {8 * GiB, 80 * GiB, own / 10 * 9, own / 10 * 13,
                                                141 * GiB};
        mm_prediction_free(&p);
        for (size_t c = 0; c < sizeof cards / sizeof *cards; c++, cases++)
            one_card(name, s, cards[c]);
        mm_spec_free(s);
    }
    printf("fit search: %d cards x 2 flush policies: %d failed, %d other boundar%s than a plain "
           "bisection's where the verdict is not monotone\n", cases, fails, two,
           two == 1 ? "y" : "ies");
    return fails ? 1 : 0;
}
