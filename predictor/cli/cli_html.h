/* cli_html.h - the HTML pictures of `mmguard predict --html` and
 * `mmguard report --html` (cli_html.c). */
#ifndef MM_CLI_HTML_H
#define MM_CLI_HTML_H

#include <stdint.h>
#include <stdio.h>

#include "mmguard.h"
#include "timeline.h"

struct mm_loop;
/* 0 ok, -1 write error.  card: the GPU's memory (0 = no capacity line). */
int mm_html_predict(FILE *f, const mm_spec *sp, const mm_prediction *p, const mm_timeline *tl,
                    uint64_t card);
int mm_html_report(FILE *f, struct mm_loop *l);
/* The commands: write the page to path; the exit status to return. */
int mm_cli_predict_html(const mm_spec *s, const mm_prediction *p, const char *path,
                        const char *gpu_mem);
int mm_cli_report_html(struct mm_loop *l, const char *path);

#endif
