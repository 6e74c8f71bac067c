/* report.h - summary of mmguard decision logs (library part of `mmguard report`).
 *
 * Why this file exists: admins want to know what the admission check did over a
 * period: how many jobs were accepted, warned, rejected or resized, by whom, for
 * which models, how close the predictions were to the GPU's usable memory, and how
 * many GPU-hours the rejected (would-be OoM) jobs would have burnt.  The input is
 * the JSON-lines decision logs written by the SPANK plugin (log=) and by
 * contrib/job_submit.lua (ctld_log=); docs/report.md has the field list.
 *
 * The summarising logic lives here (no CLI, no exit()) so that the unit tests can
 * drive it line by line; predictor/cli_report.c is the thin command around it.
 */
#ifndef MM_REPORT_H
#define MM_REPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mmguard.h"

/* Decisions the logs contain, in report order. */
typedef enum {
    MM_DEC_ACCEPT = 0,
    MM_DEC_WARN,
    MM_DEC_REJECT,
    MM_DEC_RESIZE,
    MM_DEC_ERROR,
    MM_DEC_COUNT
} mm_decision;
const char *mm_decision_name(mm_decision d);

/* Limits for hostile or huge logs. */
#define MM_REPORT_MAX_LINE       (1u << 20) /* longer lines are malformed */
#define MM_REPORT_KEEP_MALFORMED 100        /* file:line kept for the first N */

typedef struct mm_report mm_report;

mm_report *mm_report_new(void);
void mm_report_free(mm_report *r);

/* Account one log line (without or with its trailing newline).  `file` and
 * `lineno` name it in the malformed-line list.  Returns 0 when counted as a
 * record, 1 for a blank line (ignored), -1 when malformed (counted, recorded,
 * never fatal), -2 out of memory. */
int mm_report_add_line(mm_report *r, const char *file, unsigned long lineno,
                       const char *line, size_t len);

/* Account every line of an open stream; `name` is used in messages.
 * 0 ok, -1 read error or out of memory (err filled; lines so far are kept). */
int mm_report_add_stream(mm_report *r, FILE *f, const char *name, mm_error *err);

/* Open and account a file ("-" = standard input).  Refuses directories.
 * 0 ok, -1 error (err filled). */
int mm_report_add_file(mm_report *r, const char *path, mm_error *err);

/* Counters for callers and tests. */
size_t mm_report_records(const mm_report *r);
size_t mm_report_malformed(const mm_report *r);
size_t mm_report_decision_count(const mm_report *r, mm_decision d);

/* The summary.  `top` bounds the per-user/per-model/spec lists (0 = 10).
 * JSON: malloc'd text (schema in docs/report.md); text: the human tables.
 * NULL when out of memory. */
char *mm_report_json(const mm_report *r, size_t top, int pretty);
char *mm_report_text(const mm_report *r, size_t top);

/* The outcome part (loop.h), for the pictures. */
struct mm_loop;
struct mm_loop *mm_report_loop(mm_report *r);

#endif
