/* request.h - the job's GPU request as Slurm 22.05 will see it.
 *
 * Why this file exists: the check must judge the GPUs a job really asks for,
 * not the spec's training.data_parallel.  In sbatch/salloc/srun the SPANK API
 * does not expose --gres/--gpus, so the request is rebuilt from the sources
 * Slurm's own option processing reads, in its order: #SBATCH lines of the
 * batch script (sbatch) < input environment variables < the command line.
 * The result has the shape of the job_desc fields slurmctld receives
 * (tres_per_node, tres_per_job, ...), and mmg_jobreq_eval() turns those into a
 * GPU type and count exactly as contrib/job_submit.lua does with the real
 * job_desc (one table of cases, tests/unit/request_cases.txt, drives both).
 *
 * No Slurm dependency: unit-tested and fuzzed directly.
 */
#ifndef MMG_REQUEST_H
#define MMG_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#define MMG_REQ_VAL_MAX 256   /* longest option value kept */
#define MMG_REQ_TRES_MAX 520  /* a tres string: GPU part + the user's --gres */
#define MMG_REQ_TYPE_MAX 32
#define MMG_REQ_MAX_GPUS 65536u  /* the spec's limit for training.data_parallel */
#define MMG_REQ_MAX_SCRIPT (4u << 20) /* #SBATCH lines are read from at most 4 MiB */

typedef enum { MMG_TOOL_SBATCH = 1, MMG_TOOL_SALLOC = 2, MMG_TOOL_SRUN = 4 } mmg_tool;
const char *mmg_tool_name(mmg_tool t);

/* The options that shape the GPU request (everything else only matters for
 * whether it takes an argument). */
typedef enum {
    MMG_O_OTHER = -1,
    MMG_O_GRES = 0, MMG_O_GPUS, MMG_O_GPUS_PER_NODE, MMG_O_GPUS_PER_TASK,
    MMG_O_GPUS_PER_SOCKET, MMG_O_NODES, MMG_O_NTASKS, MMG_O_NTASKS_PER_NODE,
    MMG_O_NODELIST, MMG_O_NODEFILE, MMG_O_JOBID, MMG_O_CHDIR, MMG_O_WRAP,
    MMG_O_IGNORE_PBS, MMG_O_HET,
    /* the host memory request (memreq.h) */
    MMG_O_MEM, MMG_O_MEM_PER_CPU, MMG_O_MEM_PER_GPU, MMG_O_CPUS_PER_TASK, MMG_O_CPUS_PER_GPU,
    MMG_O_MINCPUS,
    MMG_O_COUNT
} mmg_opt_id;

typedef enum { MMG_FROM_NONE = 0, MMG_FROM_SCRIPT, MMG_FROM_ENV, MMG_FROM_ARGS,
               MMG_FROM_ALLOC } mmg_from;

/* One option's effective value and where the user wrote it. */
struct mmg_optval {
    int set;
    mmg_from from;
    unsigned line;                 /* #SBATCH line (MMG_FROM_SCRIPT) */
    char spelled[40];              /* "--gres", "-G", "SBATCH_GRES" */
    char value[MMG_REQ_VAL_MAX];
};

/* What the tool's option processing ends with. */
struct mmg_reqin {
    mmg_tool tool;
    struct mmg_optval o[MMG_O_COUNT];
    int het;                       /* a hetjob separator was seen */
    int pbs_line;                  /* first #PBS/#BSUB directive line, 0 none */
    int first_nonopt;              /* argv index of the script / command */
    char script_name[64];          /* for messages: "train.sh" */
    char error[512];               /* first problem found, "" none */
};

void mmg_reqin_init(struct mmg_reqin *r, mmg_tool tool);

/* The command line as getopt_long("+...") walks it for this tool: every
 * option that shapes the request is recorded (later ones win).  lines (may be
 * NULL) gives each argument's #SBATCH line.  Returns the index of the first
 * non-option (script or command), or argc. */
int mmg_args_apply(struct mmg_reqin *r, int argc, char *const argv[], mmg_from from,
                   const unsigned *lines);

/* The tool's input environment variables (SBATCH_GRES, SALLOC_GPUS,
 * SLURM_GPUS_PER_NODE, ...) from a NULL-terminated "NAME=value" array. */
void mmg_env_apply(struct mmg_reqin *r, char *const envp[]);

/* #SBATCH (and #SLURM) lines of a batch script up to its first command, split
 * into arguments as sbatch does (quotes, backslashes, '#' comments).  0, or
 * -1 with r->error set (unmatched quote: sbatch itself would have failed). */
int mmg_script_apply(struct mmg_reqin *r, const char *text, size_t len);

/* A step's allocation (srun inside salloc or a batch job): the allocation's
 * GPU request from `scontrol show job --oneliner` text, as options from
 * MMG_FROM_ALLOC; options srun set itself (nodes, tasks) are kept.  1 when
 * the allocation has a GPU request, 0 none, -1 not a job record. */
int mmg_alloc_apply(struct mmg_reqin *r, const char *text);

/* The job_desc fields slurmctld receives (22.05 names); 0 = not given. */
struct mmg_jobreq {
    char tres_per_node[MMG_REQ_TRES_MAX];
    char tres_per_job[MMG_REQ_TRES_MAX];
    char tres_per_task[MMG_REQ_TRES_MAX];
    char tres_per_socket[MMG_REQ_TRES_MAX];
    uint32_t min_nodes, max_nodes, num_tasks, ntasks_per_node;
};

/* sbatch's option verification and job_desc construction (_opt_verify,
 * slurm_opt_create_job_desc, gres_job_state_validate's task count).
 * -1 with r->error when an option value cannot be read. */
int mmg_reqin_to_job(struct mmg_reqin *r, struct mmg_jobreq *j);

typedef enum { MMG_PER_NODE = 0, MMG_PER_JOB, MMG_PER_TASK } mmg_req_kind;
typedef enum { MMG_REQ_OK = 0, MMG_REQ_NONE, MMG_REQ_UNKNOWN } mmg_req_status;

/* The GPU request: type, count and the GPU totals Slurm may allocate. */
struct mmg_gpureq {
    char type[MMG_REQ_TYPE_MAX];   /* "" = untyped (the site's default_gpu) */
    mmg_req_kind kind;
    uint32_t count;                /* per node / per job / per task */
    uint32_t nodes_min, nodes_max; /* node counts Slurm may choose */
    uint32_t tasks;                /* MMG_PER_TASK */
    uint32_t gpus_min;             /* total at nodes_min: the data-parallel degree */
};

/* Evaluate the fields as job_submit.lua does.  MMG_REQ_NONE: no GPU asked
 * for; MMG_REQ_UNKNOWN: a request that cannot be judged (GPUs per socket,
 * several GPU entries, unreadable), why in err. */
mmg_req_status mmg_jobreq_eval(const struct mmg_jobreq *j, struct mmg_gpureq *g, char *err,
                               size_t errlen);

/* Total GPUs when the job gets `nodes` nodes (nodes_min..nodes_max). */
uint32_t mmg_gpureq_total(const struct mmg_gpureq *g, uint32_t nodes);

/* Number of hosts in a Slurm hostlist ("gpu[001-004,7],login"), 0 if bad. */
uint32_t mmg_hostlist_count(const char *s);

/* "gres:gpu:h100:2,gres:shard:1" -> the GPU entry; 1 found, 0 none, -1 bad
 * or several (msg in err). */
int mmg_tres_gpu(const char *tres, char type[MMG_REQ_TYPE_MAX], uint32_t *count, char *err,
                 size_t errlen);

/* ---- in the user's terms (reqtext.c) ------------------------------------ */

/* The option the GPU count came from, NULL when it is an allocation's own. */
const struct mmg_optval *mmg_request_source(const struct mmg_reqin *r,
                                            const struct mmg_gpureq *g);

/* The request rewritten to ask for at least `want` GPUs of `type` ("" keeps
 * the user's), in the form the user wrote it, at most max_per_node GPUs per
 * node (more nodes when needed): "--gres=gpu:h100:6", "#SBATCH --gpus=6
 * (train.sh line 3)", "SBATCH_GRES=gpu:h100:6", "-N 2 --gres=gpu:h100:8".
 * Returns the GPU total written, 0 when it cannot be written. */
uint32_t mmg_request_spell(const struct mmg_reqin *r, const struct mmg_gpureq *g, uint32_t want,
                           const char *type, uint32_t max_per_node, char *out, size_t n);

/* What the job asks for: "2 GPUs (--gres=gpu:h100:2 on 1 node)". */
void mmg_request_describe(const struct mmg_reqin *r, const struct mmg_gpureq *g, char *out,
                          size_t n);

/* ---- the table of Slurm 22.05 options (optable.c) ----------------------- */
enum { MMG_ARG_NONE = 0, MMG_ARG_REQ, MMG_ARG_OPT };
struct mmg_slurm_opt {
    const char *name;
    int has_arg;
    char shortopt;   /* 0 = none */
    unsigned tools;  /* mmg_tool mask */
    mmg_opt_id id;
};
/* Long option by name or unambiguous prefix (getopt_long's rule); NULL if
 * unknown. */
const struct mmg_slurm_opt *mmg_opt_long(mmg_tool tool, const char *name, size_t len);
const struct mmg_slurm_opt *mmg_opt_short(mmg_tool tool, char c);

#endif
