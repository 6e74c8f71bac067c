/* script.c - the #SBATCH lines of a batch script, read as sbatch 22.05 reads
 * them (_opt_batch_script, get_argument in src/sbatch/opt.c): lines starting
 * with "#SBATCH" (or the deprecated "#SLURM") up to the first line that is a
 * command (first non-blank character not '#'); each line split into arguments
 * at blanks, with '...' and "..." grouping, a backslash taking the next
 * character literally, and an unquoted '#' starting a comment.  The arguments
 * of all lines form one command line, applied before the environment and the
 * real command line.  Lines of #PBS/#BSUB directives (which sbatch translates)
 * are noted, not read. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "request.h"

/* The arguments of all directive lines, in order, with their line numbers:
 * sbatch hands them to getopt as one command line. */
struct args {
    char **argv;
    unsigned *lines;
    int argc, cap;
};

static int push(struct args *a, const char *s, unsigned line)
{
    if (a->argc + 1 >= a->cap) {
        int cap = a->cap ? a->cap * 2 : 16;
        char **v = realloc(a->argv, (size_t)cap * sizeof(*v));
        unsigned *l;
        if (!v)
            return -1;
        a->argv = v;
        l = realloc(a->lines, (size_t)cap * sizeof(*l));
        if (!l)
            return -1;
        a->lines = l;
        a->cap = cap;
    }
    if (!(a->argv[a->argc] = strdup(s)))
        return -1;
    a->lines[a->argc++] = line;
    a->argv[a->argc] = NULL;
    return 0;
}

static void args_free(struct args *a)
{
    for (int i = 0; i < a->argc; i++)
        free(a->argv[i]);
    free(a->argv);
    free(a->lines);
}

/* Next argument of `p` (sbatch's get_argument) into out (room for strlen(p)
 * + 1); returns the position after it, NULL when the line has no more
 * arguments; *bad on an unmatched quote. */
static const char *next_arg(const char *p, char *out, int *bad)
{
    size_t n = 0;
    char q = '\0';
    int quoted = 0, esc = 0, any = 0;

    while (*p && isspace((unsigned char)*p))
        p++;
    while (*p && *p != '\n' && (quoted || !isspace((unsigned char)*p))) {
        if (esc) {
            esc = 0;
        } else if (*p == '\\') {
            esc = 1;
            p++;
            continue;
        } else if (quoted && *p == q) {
            quoted = 0;
            p++;
            continue;
        } else if (!quoted && (*p == '"' || *p == '\'')) {
            quoted = 1;
            q = *p++;
            continue;
        } else if (!quoted && *p == '#') {
            break;
        }
        out[n++] = *p++;
        any = 1;
    }
    out[n] = '\0';
    if (quoted)
        *bad = 1;
    return any ? p : NULL;
}

/* The arguments of one directive line (after the magic word). */
static int split_line(struct mmg_reqin *r, struct args *a, const char *p, unsigned lineno)
{
    char *buf = malloc(strlen(p) + 1);
    int bad = 0, rc = 0, first = 1;
    const char *next;

    if (!buf)
        return -1;
    while (rc == 0 && (next = next_arg(p, buf, &bad)) != NULL) {
        /* "#SBATCH hetjob" separates heterogeneous job components */
        if (first && (!strcasecmp(buf, "hetjob") || !strcasecmp(buf, "packjob")))
            r->het = 1;
        else
            rc = push(a, buf, lineno);
        first = 0;
        p = next;
    }
    free(buf);
    if (bad) {
        snprintf(r->error, sizeof(r->error), "%s line %u: unmatched quote in an #SBATCH line",
                 r->script_name, lineno);
        return -1;
    }
    return rc;
}

/* 1 when the line is a command (sbatch stops reading directives there). */
static int is_command(const char *line, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (isspace((unsigned char)line[i]))
            continue;
        return line[i] != '#';
    }
    return 0;
}

static int starts(const char *line, size_t n, const char *word)
{
    size_t k = strlen(word);
    return n >= k && !memcmp(line, word, k);
}

int mmg_script_apply(struct mmg_reqin *r, const char *text, size_t len)
{
    struct args a = { NULL, NULL, 0, 0 };
    unsigned lineno = 0;
    size_t pos = 0;
    int rc = push(&a, "sbatch", 0);

    if (len > MMG_REQ_MAX_SCRIPT)
        len = MMG_REQ_MAX_SCRIPT;
    while (rc == 0 && pos < len) {
        const char *line = text + pos, *nl = memchr(line, '\n', len - pos);
        size_t n = nl ? (size_t)(nl - line) : len - pos, skip = 0;
        char *copy;
        pos += n + (nl != NULL);
        lineno++;
        if (starts(line, n, "#SBATCH"))
            skip = 7;
        else if (starts(line, n, "#SLURM"))
            skip = 6;
        else if (is_command(line, n))
            break;
        else if (!r->pbs_line && (starts(line, n, "#PBS") || starts(line, n, "#BSUB")))
            r->pbs_line = (int)lineno;
        if (!skip)
            continue;
        if (!(copy = strndup(line + skip, n - skip)))
            rc = -1;
        else
            rc = split_line(r, &a, copy, lineno);
        free(copy);
    }
    if (rc == 0)
        (void)mmg_args_apply(r, a.argc, a.argv, MMG_FROM_SCRIPT, a.lines);
    else if (!r->error[0])
        snprintf(r->error, sizeof(r->error), "out of memory reading #SBATCH lines");
    args_free(&a);
    return rc == 0 ? 0 : -1;
}
