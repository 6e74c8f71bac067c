/* bound.c - the jobs mmguard judges by a bound instead of a model, and the
 * sentence that says so in the prediction and the verdict (issue 23: accept
 * what stays approximate when the truth data shows a safe bound).
 *
 * torch.compile: inductor fuses kernels and AOTAutograd's min-cut partitioner
 * (torch/_functorch/partitioners.py min_cut_rematerialization_partition)
 * picks what the backward keeps; the eager step program does not model
 * either.  On every compiled truth row (tests/truth/feat_compile.py) the
 * eager prediction is at or above the measured compiled peak, by the margins
 * below (tests/accuracy/accuracy.py checks the row count and the worst margin
 * against the data: a row that breaks the bound fails `make check-accuracy`). */
#include "mmguard.h"
#include "spec.h"

#include <stddef.h>

/* measured: tests/accuracy/accuracy.py --only compile (the "torch.compile" group) */
#define COMPILE_ROWS "17"
#define COMPILE_WORST_MARGIN "+0.0 %"

const char *mm_spec_bound(const mm_spec *s)
{
    if (s->training.torch_compile)
        return "torch.compile: eager prediction, an upper bound on the measured rows "
               "(" COMPILE_ROWS " rows, worst margin " COMPILE_WORST_MARGIN ")";
    return NULL;
}
