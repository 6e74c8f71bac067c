/* dp_exact.c - `make check-dp`: the published peak model against direct
 * predictions at every data-parallel degree N = 1..4096.
 *
 *   dp_exact SPEC [KEY=VALUE]...
 *
 * Predicts the spec at its own N, has the allocator replayed at every N
 * (mm_dp_cover: one simulated step serves all of them), then predicts the
 * spec again at each N and requires mm_peak_for_dp(N) and the allocated peak
 * of the terms to equal that prediction's, byte for byte.  Exit 0 when all
 * 4096 agree, 1 otherwise (the first differences listed), 2 on bad input.
 * ZeRO and FSDP specs simulate each degree on its own (dp.h dp_per_degree):
 * there N = 1..512, as each N costs two full sims. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "dp.h"
#include "predict.h"

#define MAX_N 4096u

int main(int argc, char **argv)
{
    mm_error e;
    mm_prediction p;
    uint32_t ns[MAX_N];
    if (argc < 2) {
        fprintf(stderr, "usage: dp_exact SPEC [KEY=VALUE]...\n");
        return 2;
    }
    mm_spec *s = mm_spec_load_file(argv[1], &e);
    for (int i = 2; s && i < argc; i++)
        if (mm_spec_set(s, argv[i], &e) != 0) {
            mm_spec_free(s);
            s = NULL;
        }
    for (uint32_t i = 0; i < MAX_N; i++)
        ns[i] = i + 1;
    uint32_t max_n = s && dp_per_degree(s) ? 512 : MAX_N;
    if (!s || mm_predict(s, &p, &e) != 0 || mm_dp_cover(s, &p, ns, max_n, &e) != 0) {
        fprintf(stderr, "dp_exact: %s: %s\n", argv[1], e.msg);
        return 2;
    }
    unsigned bad = 0, distinct = 0;
    uint64_t last = 0;
    for (uint32_t n = 1; n <= max_n; n++) {
        mm_spec *c = mm_spec_copy_decoded(s);
        mm_prediction q;
        if (!c)
            return 2;
        c->training.data_parallel = n;
        if (mm_predict(c, &q, &e) != 0) {
            fprintf(stderr, "dp_exact: N=%" PRIu32 ": %s\n", n, e.msg);
            return 2;
        }
        uint64_t model = mm_peak_for_dp(&p, n), alloc = dp_allocated(&p, n);
        if (model != q.peak_bytes || alloc != q.allocated_peak_bytes) {
            if (++bad <= 10)
                printf("  N=%" PRIu32 ": model peak %" PRIu64 " allocated %" PRIu64
                       ", prediction %" PRIu64 " / %" PRIu64 "\n",
                       n, model, alloc, q.peak_bytes, q.allocated_peak_bytes);
        }
        distinct += n > 1 && q.reserved_peak_bytes != last;
        last = q.reserved_peak_bytes;
        mm_prediction_free(&q);
        mm_spec_free(c);
    }
    printf("%s", argv[1]);
    for (int i = 2; i < argc; i++)
        printf(" %s", argv[i]);
    int exact = p.terms_exact;
    printf(": N=1..%u, %u differ; %zu replayed ranges, reserved changes %u times, terms %s\n",
           max_n, bad, p.n_dp_points, distinct, exact ? "exact" : "MERGED");
    mm_prediction_free(&p);
    mm_spec_free(s);
    return bad || !exact ? 1 : 0;
}
