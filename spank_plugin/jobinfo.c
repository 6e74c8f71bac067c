/* jobinfo.c - the GPUs of the allocation an srun step runs in.
 *
 * Why this file exists: a step asks for no GPUs of its own gets the
 * allocation's, and inside salloc or a batch job that was given --gres the
 * environment does not say how many (salloc exports nothing, the batch step
 * only SLURM_GPUS_ON_NODE, without the type).  srun (gather.c) asks slurmctld
 * with `scontrol show job --oneliner JOBID`; this file turns that text into
 * the request options, as if the step had asked for the allocation's GPUs. */
#include <stdio.h>
#include <string.h>

#include "request.h"

/* Value of " Key=" in the one-line job record, NUL-terminated into out. */
static int field(const char *text, const char *key, char *out, size_t n)
{
    size_t k = strlen(key);
    for (const char *p = text; (p = strstr(p, key)) != NULL; p += k) {
        size_t len;
        if ((p != text && p[-1] != ' ' && p[-1] != '\n') || p[k] != '=')
            continue;
        p += k + 1;
        len = strcspn(p, " \t\n");
        if (len >= n)
            return -1;
        memcpy(out, p, len);
        out[len] = '\0';
        return 1;
    }
    return 0;
}

static void set(struct mmg_reqin *r, mmg_opt_id id, const char *spelled, const char *value)
{
    struct mmg_optval *o = &r->o[id];
    o->set = 1;
    o->from = MMG_FROM_ALLOC;
    o->line = 0;
    snprintf(o->spelled, sizeof(o->spelled), "%s", spelled);
    snprintf(o->value, sizeof(o->value), "%s", value);
}

/* "gres:gpu:h100:2,gres:shard:1" -> "gpu:h100:2,shard:1" (the --gres form). */
static void strip_gres(const char *tres, char *out, size_t n)
{
    size_t used = 0;
    out[0] = '\0';
    for (const char *p = tres; *p && used < n;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        size_t skip = len >= 5 && (!strncmp(p, "gres:", 5) || !strncmp(p, "gres/", 5)) ? 5 : 0;
        used += (size_t)snprintf(out + used, n - used, "%s%.*s", used ? "," : "",
                                 (int)(len - skip), p + skip);
        p += len + (c != NULL);
    }
}

/* The GPU entry of a tres string as a --gpus* value: "h100:3" or "3". */
static int gpu_value(const char *tres, char *out, size_t n)
{
    char type[MMG_REQ_TYPE_MAX], err[8];
    uint32_t count;
    if (mmg_tres_gpu(tres, type, &count, err, sizeof(err)) != 1)
        return -1;
    snprintf(out, n, "%s%s%u", type, type[0] ? ":" : "", count);
    return 0;
}

int mmg_alloc_apply(struct mmg_reqin *r, const char *text)
{
    static const struct { const char *key; mmg_opt_id id; const char *spelled; } gpus[] = {
        { "TresPerJob", MMG_O_GPUS, "--gpus" },
        { "TresPerTask", MMG_O_GPUS_PER_TASK, "--gpus-per-task" },
        { "TresPerSocket", MMG_O_GPUS_PER_SOCKET, "--gpus-per-socket" },
    };
    char v[MMG_REQ_VAL_MAX], g[MMG_REQ_VAL_MAX];
    int any = 0;

    if (field(text, "JobId", v, sizeof(v)) != 1)
        return -1; /* not a job record */
    if (field(text, "TresPerNode", v, sizeof(v)) == 1) {
        strip_gres(v, g, sizeof(g));
        set(r, MMG_O_GRES, "--gres", g);
        any = 1;
    }
    for (size_t i = 0; i < sizeof(gpus) / sizeof(gpus[0]); i++)
        if (field(text, gpus[i].key, v, sizeof(v)) == 1 && gpu_value(v, g, sizeof(g)) == 0) {
            set(r, gpus[i].id, gpus[i].spelled, g);
            any = 1;
        }
    if (!r->o[MMG_O_NODES].set && field(text, "NumNodes", v, sizeof(v)) == 1)
        set(r, MMG_O_NODES, "--nodes", v);
    if (!r->o[MMG_O_NTASKS].set && field(text, "NumTasks", v, sizeof(v)) == 1)
        set(r, MMG_O_NTASKS, "--ntasks", v);
    return any;
}
