/* walk.c - a Slurm command line (or the #SBATCH lines of a script) walked as sbatch, salloc
 * and srun walk it: getopt_long with a leading '+' (options end at the first
 * non-option, the script or command; "--" ends them too), --name=value or
 * --name value, abbreviations, clustered short options (-vN2).  Only the
 * options that shape the GPU request are recorded; the last one wins, as in
 * Slurm, which overwrites the option's value each time it is given. */
#include <stdio.h>
#include <string.h>

#include "request.h"

const char *mmg_tool_name(mmg_tool t)
{
    return t == MMG_TOOL_SALLOC ? "salloc" : t == MMG_TOOL_SRUN ? "srun" : "sbatch";
}

void mmg_reqin_init(struct mmg_reqin *r, mmg_tool tool)
{
    memset(r, 0, sizeof(*r));
    r->tool = tool;
    r->first_nonopt = -1;
}

/* Record one option occurrence.  A value too long to keep is an error, never
 * a silently shortened value. */
static void record(struct mmg_reqin *r, mmg_opt_id id, const char *value, mmg_from from,
                   unsigned line, const char *spelled, size_t spelled_len)
{
    struct mmg_optval *o;
    if (id == MMG_O_HET) {
        r->het = 1;
        return;
    }
    if (id < 0 || id >= MMG_O_COUNT)
        return;
    o = &r->o[id];
    if (!value)
        value = "";
    if (strlen(value) >= sizeof(o->value)) {
        if (!r->error[0])
            snprintf(r->error, sizeof(r->error), "%.*s: value longer than %zu bytes",
                     (int)spelled_len, spelled, sizeof(o->value) - 1);
        return;
    }
    o->set = 1;
    o->from = from;
    o->line = line;
    snprintf(o->spelled, sizeof(o->spelled), "%.*s", (int)spelled_len, spelled);
    memcpy(o->value, value, strlen(value) + 1);
}

/* "--name[=value]" at argv[*i]; consumes the next element for a required
 * argument given separately. */
static void long_opt(struct mmg_reqin *r, int argc, char *const argv[], int *i, mmg_from from,
                     const unsigned *lines)
{
    const char *a = argv[*i] + 2;
    const char *eq = strchr(a, '=');
    size_t len = eq ? (size_t)(eq - a) : strlen(a);
    const struct mmg_slurm_opt *o = mmg_opt_long(r->tool, a, len);
    const char *value = eq ? eq + 1 : NULL;
    unsigned line = lines ? lines[*i] : 0;
    char spelled[40];

    if (!o)
        return; /* another plugin's option: no argument unless --name=value */
    if (o->has_arg == MMG_ARG_REQ && !eq && *i + 1 < argc)
        value = argv[++*i];
    /* spelled as Slurm names it (an abbreviation stands for the option) */
    snprintf(spelled, sizeof(spelled), "--%s", o->name);
    record(r, o->id, value, from, line, spelled, strlen(spelled));
}

/* "-abc", "-N2", "-N 2": clustered short options. */
static void short_opts(struct mmg_reqin *r, int argc, char *const argv[], int *i,
                       mmg_from from, const unsigned *lines)
{
    const char *a = argv[*i];
    unsigned line = lines ? lines[*i] : 0;
    for (size_t k = 1; a[k]; k++) {
        const struct mmg_slurm_opt *o = mmg_opt_short(r->tool, a[k]);
        char spelled[40];
        size_t sl;
        if (!o)
            return; /* Slurm refused it already; nothing more to learn */
        if (o->has_arg == MMG_ARG_NONE)
            continue;
        /* written in messages by its long name: -G 2 is --gpus=2 */
        sl = (size_t)snprintf(spelled, sizeof(spelled), "--%s", o->name);
        if (a[k + 1])
            record(r, o->id, a + k + 1, from, line, spelled, sl);
        else if (o->has_arg == MMG_ARG_REQ && *i + 1 < argc)
            record(r, o->id, argv[++*i], from, line, spelled, sl);
        else
            record(r, o->id, NULL, from, line, spelled, sl);
        return;
    }
}

int mmg_args_apply(struct mmg_reqin *r, int argc, char *const argv[], mmg_from from,
                   const unsigned *lines)
{
    int i;
    for (i = 1; i < argc && argv[i]; i++) {
        const char *a = argv[i];
        if (!strcmp(a, ":")) { /* hetjob component separator */
            r->het = 1;
            continue;
        }
        if (!strcmp(a, "--"))
            return i + 1;
        if (a[0] != '-' || a[1] == '\0')
            return i;
        if (a[1] == '-')
            long_opt(r, argc, argv, &i, from, lines);
        else
            short_opts(r, argc, argv, &i, from, lines);
    }
    return i < argc ? i : argc;
}
