/* pyapi.h - the predictor for other languages (issue 25): one call in plain C
 * types, so that Python's ctypes (python/mmguard/predict.py) reaches the
 * same code as `mmguard predict --json` through build/libmmguard.so, with no
 * second implementation and no struct layout to mirror. */
#ifndef MM_PYAPI_H
#define MM_PYAPI_H

#include <stddef.h>

/* Load the spec file at path, apply the nsets "dotted.key=value" overrides in
 * order, predict, and return the prediction's JSON (as `mmguard predict
 * --json`; malloc'd, free with mm_text_free).  NULL with err filled on bad
 * input or out of memory. */
char *mm_predict_file_json(const char *path, const char *const *sets, size_t nsets,
                           char *err, size_t errlen);
void mm_text_free(char *text);

#endif
