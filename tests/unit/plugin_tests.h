/* plugin_tests.h - what the SPANK plugin's unit tests share: the case-table
 * reader (case_table.c; the tables tests/unit/conf_cases.txt and request_cases.txt are also read by
 * contrib/job_submit.lua's tests) and the test cases of the other plugin
 * files, which config_suite() adds to its suite. */
#ifndef MMG_PLUGIN_TESTS_H
#define MMG_PLUGIN_TESTS_H

#include <check.h>
#include <stddef.h>

#include "request.h"

/* One case of a table: "== NAME", "| line"s (escapes decoded), one
 * expectation line. */
struct table_case {
    char name[160];
    char *text;        /* the "| " lines, each ending in '\n' unless \E */
    size_t len;
    char expect[2048];
};
/* All cases of the file; aborts the test on a malformed table. */
size_t table_load(const char *path, struct table_case **cases);
void table_free(struct table_case *cases, size_t n);

/* r walked over the command line given as a NULL-terminated list (argv[0]
 * is the tool), as mmg_args_apply() walks it (test_request.c). */
int reqin_args(struct mmg_reqin *r, mmg_tool tool, const char *a0, ...);

TCase *request_tcase(void);
TCase *record_tcase(void);
TCase *memreq_tcase(void);

#endif
