/* memreq.c - the host memory request (see memreq.h): from the options a tool
 * ended with to the job_desc memory fields, and from those fields (with the
 * GPU request and the site's defaults) to what the busiest GPU node gets.
 * The second half is the C twin of job_submit.lua's host_request(). */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memreq.h"
#include "parse_u32.h"

/* job_submit.lua counts bytes in doubles: exact below 2^53.  A request at or
 * above that holds any prediction; both readers saturate there. */
#define MAX_EXACT ((1ull << 53) - 1)

/* ---- str_to_mbytes (src/common/proc_args.c) -------------------------------- */

/* The unit must end the value, optionally followed by 'B' or 'b'. */
static int unit_ends(const char *p)
{
    return p[1] == '\0' || ((p[1] == 'B' || p[1] == 'b') && p[2] == '\0');
}

int mmg_str_to_mbytes(const char *s, uint64_t *mb)
{
    char *end = NULL;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if ((errno && (v == LLONG_MIN || v == LLONG_MAX)) || end == s || v < 0)
        return -1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K':
        if (!unit_ends(end) || v > LLONG_MAX - 1023)
            return -1;
        v = (v + 1023) / 1024; /* rounded up */
        break;
    case 'm': case 'M':
        if (!unit_ends(end))
            return -1;
        break;
    case 'g': case 'G':
        if (!unit_ends(end) || v > LLONG_MAX / 1024)
            return -1;
        v *= 1024;
        break;
    case 't': case 'T':
        if (!unit_ends(end) || v > LLONG_MAX / (1024 * 1024))
            return -1;
        v *= 1024 * 1024;
        break;
    default: return -1;
    }
    *mb = (uint64_t)v;
    return 0;
}

/* ---- _validate_memory_options (src/common/slurm_opt.c) ------------------------ */

static int cli(const struct mmg_optval *o)
{
    return o->set && o->from != MMG_FROM_ENV;
}

static int env(const struct mmg_optval *o)
{
    return o->set && o->from == MMG_FROM_ENV;
}

/* The one memory option that stands (NULL: none), as Slurm decides: one given
 * on the command line (or an #SBATCH line) resets the others; two there, or
 * (none there) two in the environment, are fatal. */
static const struct mmg_optval *standing(const struct mmg_reqin *r, char *err, size_t errlen)
{
    const struct mmg_optval *o[3] = { &r->o[MMG_O_MEM], &r->o[MMG_O_MEM_PER_CPU],
                                      &r->o[MMG_O_MEM_PER_GPU] };
    int ncli = cli(o[0]) + cli(o[1]) + cli(o[2]);
    int nenv = env(o[0]) + env(o[1]) + env(o[2]);
    if (ncli > 1) {
        snprintf(err, errlen, "--mem, --mem-per-cpu, and --mem-per-gpu are mutually exclusive");
        return NULL;
    }
    for (int i = 0; ncli == 1 && i < 3; i++)
        if (cli(o[i]))
            return o[i];
    if (nenv > 1) {
        const char *t = r->tool == MMG_TOOL_SBATCH ? "SBATCH" : r->tool == MMG_TOOL_SALLOC
                      ? "SALLOC" : "SLURM";
        snprintf(err, errlen, "%s_MEM_PER_CPU, %s_MEM_PER_GPU, and %s_MEM_PER_NODE are mutually "
                 "exclusive", t, t, t);
        return NULL;
    }
    for (int i = 0; i < 3; i++)
        if (o[i]->set)
            return o[i];
    return NULL;
}

static int bad(const struct mmg_optval *o, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s=%.200s: cannot read this value", o->spelled, o->value);
    return -1;
}

/* -c, --cpus-per-gpu, --mincpus: a count of CPUs, 0 when not given. */
static int cpu_count(const struct mmg_optval *o, uint32_t *out, char *err, size_t errlen)
{
    *out = 0;
    if (o->set && mmg_parse_u32(o->value, 1, 65535, out) != 0)
        return bad(o, err, errlen);
    return 0;
}

int mmg_reqin_to_mem(const struct mmg_reqin *r, struct mmg_memjob *m, char *err, size_t errlen)
{
    const struct mmg_optval *o;
    uint64_t mb;
    memset(m, 0, sizeof(*m));
    err[0] = '\0';
    if (cpu_count(&r->o[MMG_O_CPUS_PER_TASK], &m->cpus_per_task, err, errlen) ||
        cpu_count(&r->o[MMG_O_CPUS_PER_GPU], &m->cpus_per_gpu, err, errlen) ||
        cpu_count(&r->o[MMG_O_MINCPUS], &m->min_cpus, err, errlen))
        return -1;
    o = standing(r, err, errlen);
    if (!o)
        return err[0] ? -1 : 0;
    if (mmg_str_to_mbytes(o->value, &mb) != 0)
        return bad(o, err, errlen);
    m->src = o;
    if (o == &r->o[MMG_O_MEM]) {
        m->node_set = 1;
        m->mem_per_node_mb = mb;
    } else if (o == &r->o[MMG_O_MEM_PER_CPU]) {
        m->cpu_set = 1;
        m->mem_per_cpu_mb = mb;
    } else {
        m->gpu_set = 1;
        m->mem_per_gpu_mb = mb;
    }
    return 0;
}

/* ---- the evaluation (job_submit.lua's twin) ----------------------------------- */

static uint32_t sat32(uint64_t v)
{
    return v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
}

static uint64_t sat_exact(uint64_t a, uint64_t b) /* min(a * b, 2^53 - 1) */
{
    return a && b > MAX_EXACT / a ? MAX_EXACT : a * b;
}

/* GPUs on the busiest node: exact for GPUs per node (or per task with tasks
 * per node); for --gpus / --gpus-per-task on several nodes Slurm chooses, at
 * worst all but one GPU per other node on one node, at most max_gpus_per_node
 * and at least the even share. */
static uint32_t busiest_ranks(const struct mmg_jobreq *j, const struct mmg_gpureq *g,
                              uint32_t maxgpn)
{
    uint32_t nodes = g->nodes_min ? g->nodes_min : 1, total = g->gpus_min, even, rest;
    if (g->kind == MMG_PER_NODE)
        return g->count;
    if (g->kind == MMG_PER_TASK && j->ntasks_per_node)
        return sat32((uint64_t)g->count * j->ntasks_per_node);
    if (nodes <= 1)
        return total;
    even = total / nodes + (total % nodes != 0);
    rest = total > nodes - 1 ? total - (nodes - 1) : 1;
    if (maxgpn && rest > maxgpn)
        rest = maxgpn;
    return rest > even ? rest : even;
}

/* CPUs the busiest GPU node gets at least: its tasks x CPUs per task, CPUs per
 * GPU x its GPUs, --mincpus (Slurm may give more: whole cores, --exclusive). */
static uint32_t node_cpus(const struct mmg_memjob *m, const struct mmg_jobreq *j,
                          const struct mmg_gpureq *g, uint32_t ranks)
{
    uint32_t nodes = g->nodes_min ? g->nodes_min : 1, tasks = 1;
    uint64_t cpt = m->cpus_per_task ? m->cpus_per_task : 1, c;
    if (j->ntasks_per_node)
        tasks = j->ntasks_per_node;
    else if (g->kind == MMG_PER_TASK && g->count)
        tasks = ranks / g->count;
    else if (j->num_tasks)
        tasks = j->num_tasks / nodes;
    if (tasks == 0)
        tasks = 1;
    c = tasks * cpt;
    if ((uint64_t)m->cpus_per_gpu * ranks > c)
        c = (uint64_t)m->cpus_per_gpu * ranks;
    if (m->min_cpus > c)
        c = m->min_cpus;
    return sat32(c);
}

/* The job's own request, or the site's default: the bytes the node gets, 0
 * for the whole node. */
static uint64_t node_bytes(const struct mmg_memjob *m, const struct mmg_memsite *site,
                           struct mmg_memnode *n)
{
    if (m->node_set || m->cpu_set) {
        n->kind = m->node_set ? MMG_MEMK_NODE : MMG_MEMK_CPU;
        n->per_mb = m->node_set ? m->mem_per_node_mb : m->mem_per_cpu_mb;
        /* --mem=0 and --mem-per-cpu=0: all of the node's memory */
        return n->kind == MMG_MEMK_NODE ? sat_exact(n->per_mb, MMG_MB)
                                        : sat_exact(sat_exact(n->per_mb, MMG_MB), n->cpus);
    }
    if (m->gpu_set && m->mem_per_gpu_mb) {
        n->kind = MMG_MEMK_GPU;
        n->per_mb = m->mem_per_gpu_mb;
        return sat_exact(sat_exact(n->per_mb, MMG_MB), n->ranks);
    }
    n->from_default = 1;
    if (site->def_per_gpu) {
        n->kind = MMG_MEMK_GPU;
        n->per_mb = site->def_per_gpu / MMG_MB;
        return sat_exact(site->def_per_gpu, n->ranks);
    }
    n->kind = site->def_per_cpu ? MMG_MEMK_CPU : MMG_MEMK_NODE;
    n->per_mb = (site->def_per_cpu ? site->def_per_cpu : site->def_per_node) / MMG_MB;
    return site->def_per_cpu ? sat_exact(site->def_per_cpu, n->cpus) : site->def_per_node;
}

mmg_mem_status mmg_mem_eval(const struct mmg_memjob *m, const struct mmg_jobreq *j,
                            const struct mmg_gpureq *g, const struct mmg_memsite *site,
                            struct mmg_memnode *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    err[0] = '\0';
    out->ranks = busiest_ranks(j, g, site->max_gpus_per_node);
    out->cpus = node_cpus(m, j, g, out->ranks);
    if (out->ranks == 0) {
        snprintf(err, errlen, "the job asks for no GPU on its nodes");
        return MMG_MEM_UNKNOWN;
    }
    out->have_bytes = node_bytes(m, site, out);
    if (out->have_bytes)
        return MMG_MEM_SIZED;
    out->kind = MMG_MEMK_WHOLE;
    if (!site->node_mem)
        return MMG_MEM_WHOLE;
    out->have_bytes = site->node_mem;
    return MMG_MEM_SIZED;
}

uint64_t mmg_mem_need(uint32_t ranks, uint64_t per_rank, uint64_t overhead)
{
    uint64_t each = per_rank > UINT64_MAX - overhead ? UINT64_MAX : per_rank + overhead;
    return ranks && each > UINT64_MAX / ranks ? UINT64_MAX : each * ranks;
}

uint64_t mmg_mem_ask(const struct mmg_memnode *n, uint64_t need, char *out, size_t len)
{
    uint64_t div = 1, mb;
    if (!n->from_default && n->kind == MMG_MEMK_CPU)
        div = n->cpus ? n->cpus : 1;
    else if (!n->from_default && n->kind == MMG_MEMK_GPU)
        div = n->ranks ? n->ranks : 1;
    need = need / div + (need % div != 0);
    mb = need / MMG_MB + (need % MMG_MB != 0);
    if (mb >= 1024) {
        mb = mb / 1024 + (mb % 1024 != 0);
        snprintf(out, len, "%lluG", (unsigned long long)mb);
        return mb * 1024;
    }
    snprintf(out, len, "%lluM", (unsigned long long)mb);
    return mb;
}
