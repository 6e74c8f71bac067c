/* pyapi.c - one prediction in plain C types (pyapi.h). */
#include <stdio.h>
#include <stdlib.h>

#include "mmguard.h"
#include "pyapi.h"

char *mm_predict_file_json(const char *path, const char *const *sets, size_t nsets,
                           char *err, size_t errlen)
{
    mm_error e = { { 0 } };
    mm_prediction p;
    char *out = NULL;
    mm_spec *s = path ? mm_spec_load_file(path, &e) : NULL;
    if (!path)
        snprintf(e.msg, sizeof e.msg, "no spec path");
    for (size_t i = 0; s && i < nsets; i++) {
        if (!sets || !sets[i] || mm_spec_set(s, sets[i], &e) != 0) {
            if (!sets || !sets[i])
                snprintf(e.msg, sizeof e.msg, "override %zu is NULL", i);
            mm_spec_free(s);
            s = NULL;
        }
    }
    if (s && mm_predict(s, &p, &e) == 0) {
        out = mm_prediction_json(&p, 0);
        if (!out)
            snprintf(e.msg, sizeof e.msg, "out of memory");
        mm_prediction_free(&p);
    }
    mm_spec_free(s);
    if (!out && err && errlen)
        snprintf(err, errlen, "%s", e.msg);
    return out;
}

void mm_text_free(char *text)
{
    free(text);
}
