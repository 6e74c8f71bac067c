/* test_main.c - runs every Check suite; exit status is the number of failures. */
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>

/* suites of components still being written are linked when present */
Suite *config_suite(void) __attribute__((weak));
Suite *hardening_suite(void) __attribute__((weak));

int main(void)
{
    SRunner *sr = srunner_create(util_suite());
    srunner_add_suite(sr, spec_suite());
    srunner_add_suite(sr, predict_suite());
    srunner_add_suite(sr, report_suite());
    if (config_suite)
        srunner_add_suite(sr, config_suite());
    else
        fprintf(stderr, "unit: config suite not built\n");
    if (hardening_suite)
        srunner_add_suite(sr, hardening_suite());
    else
        fprintf(stderr, "unit: hardening suite not built\n");
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
