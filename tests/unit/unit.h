/* unit.h - the Check suites of mmguard, one per file, run by test_main.c. */
#ifndef MM_UNIT_H
#define MM_UNIT_H

#include <check.h>

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
Suite *liger_suite(void);
Suite *lorahead_suite(void);

#endif
