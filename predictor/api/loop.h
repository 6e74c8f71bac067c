/* loop.h - closing the loop (issue 25): what jobs really used against what
 * mmguard predicted, from the "outcome" lines of the decision log (written by
 * the plugin's outcome.c when a step ends) joined to the decision lines.
 *
 * Why this file exists: a margin chosen by guessing, rejections nobody can
 * check, predictions whose error on this cluster is unknown.  report.c hands
 * every parsed line here (decisions and outcomes); the summary says per
 * model, user and GPU type how far the predictions were from the measured
 * peaks (under-predictions first), which OOMs were let through, which
 * rejections the measured peaks contradict, how long the sequences really
 * were, and for candidate margins how many recorded jobs each would have
 * accepted and how many of those would have run out of memory.  Never
 * predicts.  docs/report.md ("Outcomes") has the rules.
 */
#ifndef MM_LOOP_H
#define MM_LOOP_H

#include <stddef.h>
#include <stdio.h>

#include <json-c/json.h>

typedef struct mm_loop mm_loop;

mm_loop *mm_loop_new(void);
void mm_loop_free(mm_loop *l);

/* A decision line (already validated by report.c; decision is its name).
 * 0 ok, -2 out of memory. */
int mm_loop_add_decision(mm_loop *l, json_object *o, const char *decision,
                         const char *file, unsigned long lineno);
/* An outcome line ("event":"outcome"); fields of the wrong type count as
 * absent.  0 ok, -1 no job_id (malformed), -2 out of memory. */
int mm_loop_add_outcome(mm_loop *l, json_object *o, const char *file, unsigned long lineno);

size_t mm_loop_outcome_lines(const mm_loop *l);

/* The "outcomes" object of `report --json` (joins once; l is then final). */
json_object *mm_loop_json(mm_loop *l, size_t top);
/* The text section. */
void mm_loop_text(mm_loop *l, FILE *f, size_t top);

/* The margin candidates, percent of the card, in the advice's order. */
#define MM_LOOP_N_MARGINS 10
extern const double mm_loop_margins[MM_LOOP_N_MARGINS];

/* For the pictures (cli): the joined jobs' predicted and measured device
 * peaks (bytes, both known), n returned; and the advice rows. */
size_t mm_loop_points(mm_loop *l, double *pred, double *meas, size_t cap);
void mm_loop_advice(mm_loop *l, size_t accepted[MM_LOOP_N_MARGINS],
                    size_t would_oom[MM_LOOP_N_MARGINS]);

/* The decision lines read, in order: decision name and time ("" unknown). */
size_t mm_loop_n_decisions(const mm_loop *l);
const char *mm_loop_decision_at(const mm_loop *l, size_t i, const char **time);

#endif
