/* predict.h - internal entry points of predict.c for the library and its
 * unit tests (not installed, not for the plugin). */
#ifndef MM_PREDICT_H
#define MM_PREDICT_H

#include "mmguard.h"

#define MM_PREDICT_NOFOLD 1u /* simulate every layer (tests check folding is exact) */
int mm_predict_ex(const mm_spec *sp, mm_prediction *out, mm_error *err, unsigned flags);

#endif
