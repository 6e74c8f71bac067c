/* request.c - from the options a tool ended with to the job_desc fields
 * slurmctld receives, and from those fields to a GPU type and count (see
 * request.h).  The second half is the C twin of job_submit.lua's request
 * evaluation; tests/unit/request_cases.txt holds the cases both must agree on. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "parse_u32.h"
#include "request.h"

/* ---- input environment variables ----------------------------------------- */

struct envopt {
    const char *name;
    unsigned tools;
    mmg_opt_id id;
};

/* The GPU-, node-, task-, CPU- and memory-shaping entries of env_vars[] in
 * Slurm 22.05's src/sbatch/opt.c, src/salloc/opt.c and src/srun/libsrun/opt.c,
 * in their order (a later entry for the same option wins).  sbatch and salloc
 * read no node, task or CPU-per-task count from the environment. */
static const struct envopt env_opts[] = {
    { "SBATCH_IGNORE_PBS", MMG_TOOL_SBATCH, MMG_O_IGNORE_PBS },
    { "SBATCH_CPUS_PER_GPU", MMG_TOOL_SBATCH, MMG_O_CPUS_PER_GPU },
    { "SBATCH_GRES", MMG_TOOL_SBATCH, MMG_O_GRES },
    { "SBATCH_GPUS", MMG_TOOL_SBATCH, MMG_O_GPUS },
    { "SBATCH_GPUS_PER_NODE", MMG_TOOL_SBATCH, MMG_O_GPUS_PER_NODE },
    { "SBATCH_GPUS_PER_SOCKET", MMG_TOOL_SBATCH, MMG_O_GPUS_PER_SOCKET },
    { "SBATCH_GPUS_PER_TASK", MMG_TOOL_SBATCH, MMG_O_GPUS_PER_TASK },
    { "SBATCH_MEM_PER_CPU", MMG_TOOL_SBATCH, MMG_O_MEM_PER_CPU },
    { "SBATCH_MEM_PER_GPU", MMG_TOOL_SBATCH, MMG_O_MEM_PER_GPU },
    { "SBATCH_MEM_PER_NODE", MMG_TOOL_SBATCH, MMG_O_MEM },
    { "SALLOC_CPUS_PER_GPU", MMG_TOOL_SALLOC, MMG_O_CPUS_PER_GPU },
    { "SALLOC_GPUS", MMG_TOOL_SALLOC, MMG_O_GPUS },
    { "SALLOC_GPUS_PER_NODE", MMG_TOOL_SALLOC, MMG_O_GPUS_PER_NODE },
    { "SALLOC_GPUS_PER_SOCKET", MMG_TOOL_SALLOC, MMG_O_GPUS_PER_SOCKET },
    { "SALLOC_GPUS_PER_TASK", MMG_TOOL_SALLOC, MMG_O_GPUS_PER_TASK },
    { "SALLOC_GRES", MMG_TOOL_SALLOC, MMG_O_GRES },
    { "SALLOC_MEM_PER_CPU", MMG_TOOL_SALLOC, MMG_O_MEM_PER_CPU },
    { "SALLOC_MEM_PER_GPU", MMG_TOOL_SALLOC, MMG_O_MEM_PER_GPU },
    { "SALLOC_MEM_PER_NODE", MMG_TOOL_SALLOC, MMG_O_MEM },
    { "SRUN_CPUS_PER_TASK", MMG_TOOL_SRUN, MMG_O_CPUS_PER_TASK },
    { "SLURM_CPUS_PER_GPU", MMG_TOOL_SRUN, MMG_O_CPUS_PER_GPU },
    { "SLURM_GPUS", MMG_TOOL_SRUN, MMG_O_GPUS },
    { "SLURM_GPUS_PER_NODE", MMG_TOOL_SRUN, MMG_O_GPUS_PER_NODE },
    { "SLURM_GPUS_PER_SOCKET", MMG_TOOL_SRUN, MMG_O_GPUS_PER_SOCKET },
    { "SLURM_GPUS_PER_TASK", MMG_TOOL_SRUN, MMG_O_GPUS_PER_TASK },
    { "SLURM_GRES", MMG_TOOL_SRUN, MMG_O_GRES },
    { "SLURM_JOB_ID", MMG_TOOL_SRUN, MMG_O_JOBID },
    { "SLURM_JOB_NUM_NODES", MMG_TOOL_SRUN, MMG_O_NODES },
    { "SLURM_MEM_PER_CPU", MMG_TOOL_SRUN, MMG_O_MEM_PER_CPU },
    { "SLURM_MEM_PER_GPU", MMG_TOOL_SRUN, MMG_O_MEM_PER_GPU },
    { "SLURM_MEM_PER_NODE", MMG_TOOL_SRUN, MMG_O_MEM },
    { "SLURM_NPROCS", MMG_TOOL_SRUN, MMG_O_NTASKS },
    { "SLURM_NTASKS", MMG_TOOL_SRUN, MMG_O_NTASKS },
    { "SLURM_NTASKS_PER_NODE", MMG_TOOL_SRUN, MMG_O_NTASKS_PER_NODE },
};

static const char *env_lookup(char *const envp[], const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; envp && envp[i]; i++)
        if (!strncmp(envp[i], name, n) && envp[i][n] == '=')
            return envp[i] + n + 1;
    return NULL;
}

void mmg_env_apply(struct mmg_reqin *r, char *const envp[])
{
    for (size_t i = 0; i < sizeof(env_opts) / sizeof(env_opts[0]); i++) {
        const struct envopt *e = &env_opts[i];
        const char *v;
        struct mmg_optval *o;
        if (!(e->tools & (unsigned)r->tool) || !(v = env_lookup(envp, e->name)))
            continue;
        o = &r->o[e->id];
        if (strlen(v) >= sizeof(o->value)) {
            if (!r->error[0])
                snprintf(r->error, sizeof(r->error), "%s: value longer than %zu bytes", e->name,
                         sizeof(o->value) - 1);
            continue;
        }
        o->set = 1;
        o->from = MMG_FROM_ENV;
        o->line = 0;
        snprintf(o->spelled, sizeof(o->spelled), "%s", e->name);
        memcpy(o->value, v, strlen(v) + 1);
    }
}

/* ---- option values -------------------------------------------------------- */

/* A node count as verify_node_count reads it: digits with an optional k/m
 * multiplier (1024, 1048576). */
static int node_count(const char *s, size_t n, uint32_t *out)
{
    char buf[32];
    uint64_t mult = 1, v;
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, s, n);
    buf[n] = '\0';
    if (buf[n - 1] == 'k' || buf[n - 1] == 'K')
        mult = 1024;
    else if (buf[n - 1] == 'm' || buf[n - 1] == 'M')
        mult = 1024 * 1024;
    if (mult > 1)
        buf[--n] = '\0';
    if (mmg_parse_u32(buf, 0, UINT32_MAX, out) != 0 || (uint64_t)*out * mult > UINT32_MAX)
        return -1;
    v = (uint64_t)*out * mult;
    *out = (uint32_t)v;
    return 0;
}

/* "N" or "MIN-MAX" (-N / --nodes / SLURM_JOB_NUM_NODES). */
static int nodes_range(const char *s, uint32_t *min, uint32_t *max)
{
    const char *dash = strchr(s, '-');
    if (!dash) {
        if (node_count(s, strlen(s), min) != 0)
            return -1;
        *max = *min;
        return 0;
    }
    if (dash == s)
        *min = 1;
    else if (node_count(s, (size_t)(dash - s), min) != 0)
        return -1;
    if (!dash[1])
        *max = 0; /* "2-": no upper bound given */
    else if (node_count(dash + 1, strlen(dash + 1), max) != 0)
        return -1;
    if (*min == 0)
        *min = 1;
    return *max && *max < *min ? -1 : 0;
}

static int bad_value(struct mmg_reqin *r, const struct mmg_optval *o)
{
    if (!r->error[0])
        snprintf(r->error, sizeof(r->error), "%s=%.200s: cannot read this value", o->spelled,
                 o->value);
    return -1;
}

/* "gres:gpu" + each comma entry of the user's --gpus* value (xfmt_tres).
 * -1 when it does not fit dst. */
static int fmt_tres(char *dst, size_t n, const char *prefix, const char *src)
{
    size_t used = strlen(dst);
    const char *p = src;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len)
            used += (size_t)snprintf(dst + used, used < n ? n - used : 0, "%s%s:%.*s",
                                     used ? "," : "", prefix, (int)len, p);
        p += len + (c != NULL);
    }
    return used < n ? 0 : -1;
}

/* --gres as gres_prepend_tres_type writes it: "gres:" before every entry. */
static int fmt_gres(char *dst, size_t n, const char *src)
{
    size_t used = strlen(dst);
    const char *p = src;
    while (*p) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        int has = len >= 5 && !strncmp(p, "gres:", 5);
        used += (size_t)snprintf(dst + used, used < n ? n - used : 0, "%s%s%.*s",
                                 used ? "," : "", has ? "" : "gres:", (int)len, p);
        p += len + (c != NULL);
    }
    return used < n ? 0 : -1;
}

/* ---- sbatch's verification and the job_desc fields ------------------------- */

static uint32_t u32_mul(uint32_t a, uint32_t b)
{
    uint64_t v = (uint64_t)a * b;
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

struct counts {
    uint32_t min, max, ntasks, ntpn;
    int nodes_set, ntasks_set;
};

static int read_counts(struct mmg_reqin *r, struct counts *c)
{
    const struct mmg_optval *o;
    memset(c, 0, sizeof(*c));
    c->min = 1;
    if ((o = &r->o[MMG_O_NODES])->set) {
        if (nodes_range(o->value, &c->min, &c->max) != 0)
            return bad_value(r, o);
        c->nodes_set = 1;
    }
    if ((o = &r->o[MMG_O_NTASKS])->set) {
        if (mmg_parse_u32(o->value, 0, UINT32_MAX - 1, &c->ntasks) != 0)
            return bad_value(r, o);
        c->ntasks_set = 1;
    }
    if ((o = &r->o[MMG_O_NTASKS_PER_NODE])->set && mmg_parse_u32(o->value, 1, 65533, &c->ntpn) != 0)
        return bad_value(r, o);
    if ((o = &r->o[MMG_O_NODELIST])->set) {
        uint32_t h = mmg_hostlist_count(o->value);
        if (h == 0)
            return bad_value(r, o);
        c->min = c->nodes_set && c->min > h ? c->min : h;
        c->nodes_set = 1;
    }
    if ((o = &r->o[MMG_O_NODEFILE])->set) {
        snprintf(r->error, sizeof(r->error), "%s: mmguard does not read node files "
                 "(give the node count with -N)", o->spelled);
        return -1;
    }
    return 0;
}

/* _opt_verify (src/sbatch/opt.c): tasks from nodes, nodes capped by tasks. */
static void verify_counts(struct counts *c)
{
    if (c->ntpn && !c->ntasks_set && (c->max == 0 || c->min == c->max)) {
        c->ntasks = u32_mul(c->min, c->ntpn);
        c->ntasks_set = 1;
    }
    if (c->nodes_set && (c->min == c->max || c->max == 0) && !c->ntasks_set) {
        c->ntasks = c->min > 1 ? c->min : 1;
        c->ntasks_set = 1;
    } else if (c->nodes_set && c->ntasks_set) {
        if (c->ntasks < c->max)
            c->max = c->ntasks;
        if (c->ntasks < c->min)
            c->min = c->max = c->ntasks;
    }
}

int mmg_reqin_to_job(struct mmg_reqin *r, struct mmg_jobreq *j)
{
    const struct mmg_optval *o = r->o;
    struct counts c;
    int bad = 0;

    memset(j, 0, sizeof(*j));
    if (r->error[0] || read_counts(r, &c) != 0)
        return -1;
    verify_counts(&c);
    j->min_nodes = c.nodes_set ? c.min : 0;
    j->max_nodes = c.nodes_set ? (c.max ? c.max : c.min) : 0;
    j->num_tasks = c.ntasks_set ? c.ntasks : 0;
    j->ntasks_per_node = c.ntpn;
    if (o[MMG_O_GPUS].set)
        bad |= fmt_tres(j->tres_per_job, sizeof(j->tres_per_job), "gres:gpu", o[MMG_O_GPUS].value);
    if (o[MMG_O_GPUS_PER_NODE].set)
        bad |= fmt_tres(j->tres_per_node, sizeof(j->tres_per_node), "gres:gpu",
                        o[MMG_O_GPUS_PER_NODE].value);
    /* --gres=none means no GRES (not sent to slurmctld) */
    if (o[MMG_O_GRES].set && strcasecmp(o[MMG_O_GRES].value, "none") != 0)
        bad |= fmt_gres(j->tres_per_node, sizeof(j->tres_per_node), o[MMG_O_GRES].value);
    if (o[MMG_O_GPUS_PER_SOCKET].set)
        bad |= fmt_tres(j->tres_per_socket, sizeof(j->tres_per_socket), "gres:gpu",
                        o[MMG_O_GPUS_PER_SOCKET].value);
    if (o[MMG_O_GPUS_PER_TASK].set)
        bad |= fmt_tres(j->tres_per_task, sizeof(j->tres_per_task), "gres:gpu",
                        o[MMG_O_GPUS_PER_TASK].value);
    if (bad) {
        snprintf(r->error, sizeof(r->error), "the GPU request is longer than %zu bytes",
                 sizeof(j->tres_per_node) - 1);
        return -1;
    }
    return 0;
}

/* ---- hostlists ------------------------------------------------------------- */

/* Hosts in one bracket body "001-004,7": sum of the ranges, 0 if bad. */
static uint64_t bracket_count(const char *s, size_t n)
{
    uint64_t total = 0;
    size_t i = 0;
    while (i < n) {
        uint64_t a = 0, b;
        size_t start = i;
        while (i < n && isdigit((unsigned char)s[i]) && a < 100000000)
            a = a * 10 + (uint64_t)(s[i++] - '0');
        if (i == start)
            return 0;
        b = a;
        if (i < n && s[i] == '-') {
            size_t s2 = ++i;
            b = 0;
            while (i < n && isdigit((unsigned char)s[i]) && b < 100000000)
                b = b * 10 + (uint64_t)(s[i++] - '0');
            if (i == s2 || b < a)
                return 0;
        }
        total += b - a + 1;
        if (i < n && s[i++] != ',')
            return 0;
    }
    return total;
}

uint32_t mmg_hostlist_count(const char *s)
{
    uint64_t total = 0, item = 1;
    int any = 0;
    for (const char *p = s;; p++) {
        if (*p == '[') {
            const char *e = strchr(p, ']');
            uint64_t k = e ? bracket_count(p + 1, (size_t)(e - p - 1)) : 0;
            if (!k || item > UINT32_MAX / k)
                return 0;
            item *= k;
            p = e;
            any = 1;
        } else if (*p == ',' || *p == '\0') {
            if (!any)
                return 0; /* empty item */
            total += item;
            if (total > UINT32_MAX)
                return 0;
            if (!*p)
                break;
            item = 1;
            any = 0;
        } else if (*p == ']' || isspace((unsigned char)*p)) {
            return 0;
        } else {
            any = 1;
        }
    }
    return (uint32_t)total;
}

/* ---- the evaluation (job_submit.lua's twin) --------------------------------- */

static int valid_type(const char *s, size_t n)
{
    if (n == 0 || n >= MMG_REQ_TYPE_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("-_.", s[i]))
            return 0;
    return 1;
}

static int digits_u32(const char *s, size_t n, uint32_t *out)
{
    char num[16];
    if (n == 0 || n >= sizeof(num) || strspn(s, "0123456789") < n)
        return -1;
    memcpy(num, s, n);
    num[n] = '\0';
    return mmg_parse_u32(num, 0, UINT32_MAX, out);
}

/* One entry "gres:gpu:h100:2" (prefix optional): gpu, gpu:COUNT, gpu:TYPE or
 * gpu:TYPE:COUNT.  1 a GPU entry, 0 another GRES, -1 unreadable. */
static int gpu_entry(const char *e, size_t n, char type[MMG_REQ_TYPE_MAX], uint32_t *count)
{
    const char *colon;
    if (n >= 5 && (!strncmp(e, "gres:", 5) || !strncmp(e, "gres/", 5))) {
        e += 5;
        n -= 5;
    }
    if (n < 3 || strncmp(e, "gpu", 3) != 0 || (n > 3 && e[3] != ':'))
        return 0;
    type[0] = '\0';
    *count = 1;
    if (n == 3)
        return 1;
    e += 4;
    n -= 4;
    colon = memchr(e, ':', n);
    /* a lone field starting with a digit is a count, as for Slurm ("gpu:2k"
     * would be 2048: counts with a unit are not read here) */
    if (!colon && n && isdigit((unsigned char)e[0]))
        return digits_u32(e, n, count) == 0 ? 1 : -1;
    if (colon && digits_u32(colon + 1, n - (size_t)(colon - e) - 1, count) != 0)
        return -1;
    n = colon ? (size_t)(colon - e) : n;
    if (!valid_type(e, n))
        return -1;
    for (size_t i = 0; i < n; i++)
        type[i] = (char)tolower((unsigned char)e[i]);
    type[n] = '\0';
    return 1;
}

int mmg_tres_gpu(const char *tres, char type[MMG_REQ_TYPE_MAX], uint32_t *count, char *err,
                 size_t errlen)
{
    int found = 0;
    const char *p = tres;
    while (p && *p) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        char t[MMG_REQ_TYPE_MAX];
        uint32_t k;
        int rc = gpu_entry(p, n, t, &k);
        if (rc < 0 || (rc > 0 && found)) {
            snprintf(err, errlen, rc < 0 ? "cannot read the GPU request '%s'"
                                         : "more than one GPU entry in '%s'", tres);
            return -1;
        }
        if (rc > 0) {
            found = 1;
            memcpy(type, t, sizeof(t));
            *count = k;
        }
        p = c ? c + 1 : NULL;
    }
    return found;
}

uint32_t mmg_gpureq_total(const struct mmg_gpureq *g, uint32_t nodes)
{
    switch (g->kind) {
    case MMG_PER_JOB: return g->count;
    case MMG_PER_TASK: return u32_mul(g->count, g->tasks);
    default: return u32_mul(g->count, nodes);
    }
}

/* The node counts Slurm may give a per-node request: -N MIN[-MAX]; without
 * it, tasks / tasks per node; without that, 1 up to one node per task (the
 * scheduler spreads tasks over nodes as it needs). */
static void node_range(const struct mmg_jobreq *j, struct mmg_gpureq *g)
{
    if (j->min_nodes) {
        g->nodes_min = j->min_nodes;
        g->nodes_max = j->max_nodes >= j->min_nodes ? j->max_nodes : j->min_nodes;
    } else if (j->num_tasks && j->ntasks_per_node) {
        g->nodes_min = g->nodes_max = (j->num_tasks + j->ntasks_per_node - 1) / j->ntasks_per_node;
    } else {
        g->nodes_min = 1;
        g->nodes_max = j->num_tasks > 1 ? j->num_tasks : 1;
    }
}

/* Which field carries the one GPU entry; -1 (err set) when none can be read
 * or several do. */
static int find_gpu_field(const struct mmg_jobreq *j, struct mmg_gpureq *g, char *err,
                          size_t errlen)
{
    const char *f[4] = { j->tres_per_node, j->tres_per_job, j->tres_per_task, j->tres_per_socket };
    static const char *const what[4] = { "per node", "per job", "per task", "per socket" };
    int which = -1;
    for (int i = 0; i < 4; i++) {
        char t[MMG_REQ_TYPE_MAX];
        uint32_t k;
        int rc = mmg_tres_gpu(f[i], t, &k, err, errlen);
        if (rc < 0)
            return -2;
        if (rc == 0 || k == 0)
            continue;
        if (which >= 0) {
            snprintf(err, errlen, "GPUs asked for both %s and %s", what[which], what[i]);
            return -2;
        }
        which = i;
        memcpy(g->type, t, sizeof(t));
        g->count = k;
    }
    if (which == 3) {
        snprintf(err, errlen, "GPUs per socket (--gpus-per-socket) are not supported: "
                 "the GPU count depends on the sockets Slurm picks");
        return -2;
    }
    return which;
}

mmg_req_status mmg_jobreq_eval(const struct mmg_jobreq *j, struct mmg_gpureq *g, char *err,
                               size_t errlen)
{
    int which;
    memset(g, 0, sizeof(*g));
    err[0] = '\0';
    which = find_gpu_field(j, g, err, errlen);
    if (which == -2)
        return MMG_REQ_UNKNOWN;
    if (which < 0) {
        snprintf(err, errlen, "the job asks for no GPU");
        return MMG_REQ_NONE;
    }
    g->kind = which == 0 ? MMG_PER_NODE : which == 1 ? MMG_PER_JOB : MMG_PER_TASK;
    node_range(j, g);
    if (g->kind == MMG_PER_TASK) {
        g->tasks = j->num_tasks ? j->num_tasks
                 : j->min_nodes ? u32_mul(j->min_nodes, j->ntasks_per_node ? j->ntasks_per_node : 1)
                 : 0;
        if (!g->tasks) {
            snprintf(err, errlen, "GPUs per task without a task count (-n)");
            return MMG_REQ_UNKNOWN;
        }
    }
    g->gpus_min = mmg_gpureq_total(g, g->nodes_min);
    if (g->gpus_min > MMG_REQ_MAX_GPUS) {
        snprintf(err, errlen, "the job asks for more than %u GPUs", MMG_REQ_MAX_GPUS);
        return MMG_REQ_UNKNOWN;
    }
    return MMG_REQ_OK;
}
