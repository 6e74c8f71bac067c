/* cli_report.c - `mmguard report [--json] [--pretty] [--top N] LOG...` (thin
 * wrapper around report.c; see docs/report.md). */
#include "cli_report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"
#include "report.h"
#include "cli_html.h"

static void usage(FILE *f)
{
    fputs("usage: mmguard report [--json] [--pretty] [--top N] [--html FILE] LOG...\n"
          "  Summarise mmguard decision logs (JSON lines written by the SPANK plugin's\n"
          "  log= and job_submit.lua's ctld_log=): decisions per user, model and source,\n"
          "  the most-rejected specs, predicted peak / usable memory, and the GPU-hours\n"
          "  of rejected jobs.  LOG '-' reads standard input.  Malformed lines are\n"
          "  counted and listed as FILE:LINE, never fatal.\n"
          "  --json      machine-readable summary (docs/report.md)\n"
          "  --pretty    indented JSON (implies --json)\n"
          "  --top N     rows in the per-user/per-model/spec lists (default 10)\n"
          "  --html FILE also write the pictures (self-contained HTML/SVG): decisions over\n"
          "              time, predicted vs measured, error histogram, margin advice\n",
          f);
}

typedef struct report_flags {
    int json, pretty, nfiles;
    size_t top;
    const char *html;
} report_flags;

/* the options and the number of files; -1 to go on, else the exit status */
static int parse_flags(int argc, char **argv, report_flags *fl)
{
    int dashdash = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (dashdash || a[0] != '-' || !strcmp(a, "-")) {
            fl->nfiles++;
            continue;
        }
        if (!strcmp(a, "--")) {
            dashdash = 1;
        } else if (!strcmp(a, "--json")) {
            fl->json = 1;
        } else if (!strcmp(a, "--pretty")) {
            fl->json = fl->pretty = 1;
        } else if (!strcmp(a, "--top") || !strncmp(a, "--top=", 6)) {
            const char *v = a[5] == '=' ? a + 6 : (i + 1 < argc ? argv[++i] : NULL);
            char *end = NULL;
            unsigned long long n;
            errno = 0;
            n = v ? strtoull(v, &end, 10) : 0;
            if (!v || !*v || *end || errno || n < 1 || n > 1000000 || v[0] == '-') {
                fprintf(stderr, "mmguard report: --top needs an integer 1..1000000\n");
                return 2;
            }
            fl->top = (size_t)n;
        } else if (!strcmp(a, "--html") || !strncmp(a, "--html=", 7)) {
            fl->html = a[6] == '=' ? a + 7 : (i + 1 < argc ? argv[++i] : NULL);
            if (!fl->html || !*fl->html) {
                fprintf(stderr, "mmguard report: --html needs a FILE\n");
                return 2;
            }
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "mmguard report: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (fl->nfiles == 0) {
        fprintf(stderr, "mmguard report: no log file given\n");
        usage(stderr);
        return 2;
    }
    return -1;
}

/* every file named (not the options); 1 when one could not be read */
static int read_files(mm_report *r, int argc, char **argv)
{
    int rc = 0, dashdash = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        mm_error err;
        if (!dashdash && !strcmp(a, "--")) {
            dashdash = 1;
            continue;
        }
        if (!dashdash && a[0] == '-' && strcmp(a, "-")) {
            if (!strcmp(a, "--top") || !strcmp(a, "--html"))
                i++;
            continue;
        }
        memset(&err, 0, sizeof(err));
        if (mm_report_add_file(r, a, &err) != 0) {
            fprintf(stderr, "mmguard report: %s\n", err.msg);
            rc = 1;
        }
    }
    return rc;
}

int mm_cli_report(int argc, char **argv)
{
    report_flags fl = {.top = 10};
    int rc = parse_flags(argc, argv, &fl);
    if (rc >= 0)
        return rc;
    mm_report *r = mm_report_new();
    if (!r) {
        fprintf(stderr, "mmguard report: out of memory\n");
        return 1;
    }
    rc = read_files(r, argc, argv);
    if (fl.html && mm_cli_report_html(mm_report_loop(r), fl.html) != 0)
        rc = 1;
    char *out = fl.json ? mm_report_json(r, fl.top, fl.pretty) : mm_report_text(r, fl.top);
    if (!out) {
        fprintf(stderr, "mmguard report: out of memory\n");
        mm_report_free(r);
        return 1;
    }
    fputs(out, stdout);
    if (fl.json)
        fputc('\n', stdout);
    if (fflush(stdout) != 0) {
        fprintf(stderr, "mmguard report: write error: %s\n", strerror(errno));
        rc = 1;
    }
    free(out);
    if (mm_report_malformed(r))
        fprintf(stderr, "mmguard report: %zu malformed line(s) skipped (listed in the report)\n",
                mm_report_malformed(r));
    mm_report_free(r);
    return rc;
}
