/* unit.h - the Check suites of mmguard, one per file, run by test_main.c. */
#ifndef MM_UNIT_H
#define MM_UNIT_H

#include <check.h>

#include "mmguard.h"

#ifndef SRCDIR
#define SRCDIR "."
#endif

Suite *spec_suite(void);
Suite *predict_suite(void);
Suite *util_suite(void);
Suite *report_suite(void);
Suite *config_suite(void);
Suite *hardening_suite(void);
Suite *alloc_suite(void);
Suite *reserve_suite(void);
Suite *import_suite(void);
Suite *parallel_suite(void);
Suite *fit_suite(void);
Suite *engine_suite(void);
Suite *features_suite(void);
Suite *outcome_suite(void);
Suite *compile_suite(void);
Suite *tp_suite(void);
Suite *keys_suite(void);
Suite *towers_suite(void);
Suite *pixtral_suite(void);
Suite *liger_suite(void);
Suite *lorahead_suite(void);
Suite *wrap_suite(void);
Suite *resolve_suite(void);

/* unit_spec.c: shared specs (each asserts what it needs) */
mm_spec *unit_preset(const char *name);              /* contrib/models/NAME.yaml */
mm_spec *unit_tiny(const char *extra, mm_error *e);  /* tiny Llama + lines under training: */
mm_prediction unit_tiny_predict(const char *extra);
/* the prediction of s (the test fails if mm_predict does); after `--set kv` */
mm_prediction unit_predict(const mm_spec *s);
mm_prediction unit_set_predict(mm_spec *s, const char *kv);
uint64_t unit_set_forward_peak(mm_spec *s, const char *kv); /* its forward phase's peak */
void unit_tiny_refused(const char *extra, const char *key, const char *why);
/* fn(path, ctx) for each .yaml of SRCDIR/dir (asserts there is one); how many */
size_t unit_each_yaml(const char *dir, void (*fn)(const char *path, void *ctx), void *ctx);

#endif
