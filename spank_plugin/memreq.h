/* memreq.h - the job's host memory request as Slurm 22.05 will see it, and
 * whether the predicted host memory of its GPU processes fits in it.
 *
 * Why this file exists: with CPU offload (DeepSpeed offload_optimizer /
 * offload_param, FSDP cpu_offload) the optimizer states and parameters live in
 * host memory, and a job whose --mem is too small is killed by the
 * out-of-memory killer after it has waited for its GPUs.  The request is
 * rebuilt with Slurm's own rules (src/common/slurm_opt.c, proc_args.c):
 *   --mem (per node), --mem-per-cpu (x the CPUs of the node), --mem-per-gpu
 *   (x the GPUs of the node), from the command line, #SBATCH lines and the
 *   SBATCH_/SALLOC_/SLURM_MEM_PER_{NODE,CPU,GPU} variables; sizes as
 *   str_to_mbytes() reads them (MB by default, K/M/G/T suffixes, "B" allowed);
 *   the three are mutually exclusive as _validate_memory_options() says.
 * Without a request slurmctld applies the site's defaults (DefMemPerGPU for GPU
 * jobs under cons_tres, else DefMemPerCPU or DefMemPerNode, else the whole
 * node); the plugin cannot read slurm.conf, so mmguard.conf repeats them
 * (def_mem_per_node / def_mem_per_cpu / def_mem_per_gpu, node_mem).
 * The fields are those job_submit.lua sees in job_desc (min_mem_per_node,
 * min_mem_per_cpu, mem_per_tres, cpus_per_task, cpus_per_tres, pn_min_cpus),
 * and mmg_mem_eval() is the C twin of its evaluation: the table
 * tests/unit/request_cases.txt ("mem" cases) drives both.
 *
 * No Slurm dependency: unit-tested and fuzzed directly.
 */
#ifndef MMG_MEMREQ_H
#define MMG_MEMREQ_H

#include <stddef.h>
#include <stdint.h>

#include "request.h"

#define MMG_MB (1024ull * 1024ull) /* Slurm's "MB" is 2^20 bytes */

/* The job_desc memory and CPU fields (22.05 Lua names); *_set = given. */
struct mmg_memjob {
    int node_set, cpu_set, gpu_set;
    uint64_t mem_per_node_mb;     /* --mem: min_mem_per_node (0 = the whole node) */
    uint64_t mem_per_cpu_mb;      /* --mem-per-cpu: min_mem_per_cpu */
    uint64_t mem_per_gpu_mb;      /* --mem-per-gpu: mem_per_tres "gres:gpu:N" */
    uint32_t cpus_per_task;       /* -c, 0 = not given (1) */
    uint32_t cpus_per_gpu;        /* --cpus-per-gpu: cpus_per_tres "gres:gpu:N", 0 none */
    uint32_t min_cpus;            /* --mincpus: pn_min_cpus, 0 none */
    const struct mmg_optval *src; /* the option the request came from (plugin only) */
};

/* The site's defaults and limits (mmguard.conf; bytes, 0 = not set). */
struct mmg_memsite {
    uint64_t def_per_node, def_per_cpu, def_per_gpu;
    uint64_t node_mem;            /* what a job gets with --mem=0 or no limit at all */
    uint32_t max_gpus_per_node;
};

/* str_to_mbytes(): "4096", "4G", "4gb", " 512M", "1T", "3K" (rounded up) ->
 * MB.  -1 when Slurm would refuse the value or it overflows. */
int mmg_str_to_mbytes(const char *s, uint64_t *mb);

/* _validate_memory_options() and slurm_opt_create_job_desc(): which of the
 * three options stands, its value, and the CPU fields.  -1 with the message in
 * err when a value cannot be read or Slurm would refuse the combination. */
int mmg_reqin_to_mem(const struct mmg_reqin *r, struct mmg_memjob *m, char *err, size_t errlen);

typedef enum {
    MMG_MEM_SIZED = 0,  /* have_bytes is what the node gets */
    MMG_MEM_WHOLE,      /* the whole node, whose memory is not configured (node_mem) */
    MMG_MEM_UNKNOWN     /* cannot be told, why in err */
} mmg_mem_status;

typedef enum { MMG_MEMK_NODE = 0, MMG_MEMK_CPU, MMG_MEMK_GPU, MMG_MEMK_WHOLE } mmg_mem_kind;

/* What the busiest GPU node of the job gets. */
struct mmg_memnode {
    mmg_mem_kind kind;    /* which rule gave have_bytes */
    int from_default;     /* 1: the site's default (no request of the job) */
    uint64_t per_mb;      /* the request or default in MB per node/CPU/GPU */
    uint32_t ranks;       /* GPU processes on that node (one per GPU) */
    uint32_t cpus;        /* CPUs it gets at least (MMG_MEMK_CPU) */
    uint64_t have_bytes;  /* its memory (MMG_MEM_SIZED) */
};

/* Evaluate the request on the job's GPU request g (mmg_jobreq_eval) and the
 * task fields of j, as job_submit.lua does. */
mmg_mem_status mmg_mem_eval(const struct mmg_memjob *m, const struct mmg_jobreq *j,
                            const struct mmg_gpureq *g, const struct mmg_memsite *site,
                            struct mmg_memnode *out, char *err, size_t errlen);

/* The host memory the node needs: ranks x (per_rank + overhead); UINT64_MAX
 * when it overflows. */
uint64_t mmg_mem_need(uint32_t ranks, uint64_t per_rank, uint64_t overhead);

/* The request to ask for so that `need` bytes fit, in the kind's unit (per
 * node, per CPU or per GPU of that node), in MB rounded up to whole GB when
 * at least 1 GB: written "160G" / "900M" into out.  Returns the MB. */
uint64_t mmg_mem_ask(const struct mmg_memnode *n, uint64_t need, char *out, size_t len);

#endif
