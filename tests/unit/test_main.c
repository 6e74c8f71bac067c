/* test_main.c - runs every Check suite; exit status is the number of failures. */
#include "unit.h"

#include <stdlib.h>

int main(void)
{
    SRunner *sr = srunner_create(util_suite());
    srunner_add_suite(sr, spec_suite());
    srunner_add_suite(sr, predict_suite());
    srunner_add_suite(sr, report_suite());
    srunner_add_suite(sr, config_suite());
    srunner_add_suite(sr, hardening_suite());
    srunner_add_suite(sr, alloc_suite());
    srunner_add_suite(sr, reserve_suite());
    srunner_add_suite(sr, import_suite());
    srunner_add_suite(sr, parallel_suite());
    srunner_add_suite(sr, fit_suite());
    srunner_add_suite(sr, engine_suite());
    srunner_add_suite(sr, features_suite());
    srunner_add_suite(sr, outcome_suite());
    srunner_add_suite(sr, compile_suite());
    srunner_add_suite(sr, tp_suite());
    srunner_add_suite(sr, keys_suite());
    srunner_add_suite(sr, towers_suite());
    srunner_add_suite(sr, pixtral_suite());
    srunner_add_suite(sr, liger_suite());
    srunner_add_suite(sr, lorahead_suite());
    srunner_add_suite(sr, wrap_suite());
    srunner_add_suite(sr, resolve_suite());
    srunner_run_all(sr, CK_ENV); /* CK_VERBOSITY=verbose lists every test */
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
