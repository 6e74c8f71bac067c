/* decision.c - the words of a decision: its name and the lines the user reads.
 * Its own file so that the files producing them (check.c, explain.c) and the
 * ones handing them on (publish.c, log.c) depend on it and not on each other:
 * no file of the plugin calls back into one that calls it. */
#include <stdarg.h>
#include <stdio.h>

#include "plugin.h"

const char *mmg_decision_name(mmg_decision d)
{
    switch (d) {
    case MMG_ACCEPT: return "accept";
    case MMG_WARN: return "warn";
    case MMG_REJECT: return "reject";
    default: return "error";
    }
}

void mmg_check_line(struct mmg_check *chk, const char *fmt, ...)
{
    va_list ap;
    if (chk->n_lines >= MMG_MAX_LINES)
        return;
    va_start(ap, fmt);
    vsnprintf(chk->lines[chk->n_lines++], MMG_LINE_MAX, fmt, ap);
    va_end(ap);
}
