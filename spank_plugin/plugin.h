/* plugin.h - internals shared by the mmguard SPANK plugin's files.
 *
 * dispatch.c  every slurm_spank_* entry point, switching on spank_context()
 * options.c   --mm-model / --mm-gpu / --mm-gpus registration and callbacks
 * gather.c    the job's GPU request from the process: command line, #SBATCH
 *             lines, environment, or (srun steps) the allocation
 * check.c     the submit-time decision: config, request, spec, prediction
 * decision.c  its name and the lines the user reads
 * explain.c   what the user reads: breakdown and suggestions in their terms
 * hostmem.c   the host memory of the GPU processes against the job's --mem
 * submit.c    run, print, publish, log (what sbatch/salloc/srun do)
 * publish.c   the MMGUARD record (record.c) for job_submit.lua and the job
 * log.c       the JSON-lines decision log and syslog
 * alloc.c     sbatch / salloc (allocator context)
 * local.c     srun (local context)
 * remote.c    slurmstepd (remote context): MMGUARD_* for the tasks
 * outcome.c   slurmstepd: MMGUARD_RECORD for the tasks; at the step's end the
 *             job's record (outcome_rec.c) as an outcome line in the log
 * Slurm-free, unit-tested and fuzzed: config.c, request.c, walk.c,
 * optable.c, script.c, reqtext.c, jobinfo.c, record.c, memreq.c, outcome_rec.c.
 */
#ifndef MMG_PLUGIN_H
#define MMG_PLUGIN_H

#include <stdint.h>
#include <slurm/spank.h>

#include "config.h"
#include "memreq.h"
#include "mmguard.h"
#include "record.h"
#include "request.h"

#define MMG_PREFIX "mmguard: "
#define MMG_MAX_LINES 24
#define MMG_LINE_MAX 640

/* ---- options ------------------------------------------------------------- */
struct mmg_opts {
    char *model;     /* --mm-model, NULL if not given */
    char *gpu;       /* --mm-gpu: overrides the request's GPU type */
    uint32_t gpus;   /* --mm-gpus: overrides the request's GPU count, 0 = not given */
    unsigned model_calls; /* how often the --mm-model callback ran */
};
extern struct mmg_opts mmg_opts;
int mmg_options_register(spank_t sp);
void mmg_options_free(void);
/* Slurm hands a job's SPANK options to commands run inside it (the job env has
 * SLURM_SPANK__SLURM_SPANK_OPTION_mmguard_mm_model, which sbatch/salloc/srun
 * apply as if given).  1 when --mm-model only came from there: a step of an
 * already-checked job, or a nested submission that did not ask for a check. */
int mmg_model_inherited(void);

/* ---- the request (gather.c) ------------------------------------------------ */
struct mmg_request {
    struct mmg_reqin in;        /* options as the tool ended with them */
    struct mmg_gpureq gpus;     /* evaluated */
    mmg_req_status status;
    char why[512];              /* status != OK: what the user reads */
    char text[512];             /* "2 GPUs (--gres=gpu:h100:2 on 1 node)" */
    struct mmg_jobreq job;      /* the job_desc fields (status OK) */
    struct mmg_memjob mem;      /* the memory request (mem_ok) */
    int mem_ok;
    char mem_why[512];          /* !mem_ok: why it cannot be read */
};
/* Rebuild the request of this sbatch/salloc/srun.  Never fails: problems end
 * in status/why. */
void mmg_gather_request(mmg_tool tool, struct mmg_request *req);

/* ---- the check --------------------------------------------------------------- */
typedef enum {
    MMG_ACCEPT = 0, MMG_WARN, MMG_REJECT, MMG_ERROR
} mmg_decision;
const char *mmg_decision_name(mmg_decision d);

/* The host memory check (hostmem.c). */
typedef enum { MMG_HOST_NONE = 0, MMG_HOST_FITS, MMG_HOST_MISFIT, MMG_HOST_UNCHECKED,
               MMG_HOST_UNKNOWN } mmg_host_result;
struct mmg_hostcheck {
    mmg_host_result result;
    struct mmg_memnode node;    /* what the busiest GPU node gets */
    uint64_t per_rank;          /* predicted host bytes per GPU process */
    uint64_t overhead;          /* host_overhead per GPU process */
    uint64_t need;              /* ranks x (per_rank + overhead) */
    char ask[32];               /* the size that fits, in the request's unit ("162G") */
    char request[300];          /* the request in the user's words */
    char reason[700];
};

struct mmg_check {
    const char *source;           /* "sbatch" | "salloc" | "srun" */
    struct mmg_config cfg;
    int cfg_ok;
    char spec_arg[MMG_PATH_MAX];  /* --mm-model as given */
    char spec_path[MMG_PATH_MAX]; /* resolved (realpath) when possible */
    mm_spec *spec;
    uint32_t spec_dp;             /* the spec's own training.data_parallel */
    char spec_err[1100];          /* the spec's own error, reported with any later one */
    struct mmg_request req;
    int have_req;                 /* the request was gathered */
    int have_pred, have_fit;
    mm_prediction pred;
    mm_fit_result fit;
    const struct mmg_gpu *gpu;
    uint32_t dp;                  /* GPUs judged: data-parallel degree x tp */
    uint32_t tp;                  /* the spec's training.tensor_parallel (>= 1) */
    uint32_t worst_dp;            /* where the peak of a node range is highest */
    uint64_t peak, alloc_peak, usable;
    mm_verdict verdict;           /* on the judged card at worst_dp (mm_verdict_for) */
    int have_verdict;
    int misfit;                   /* out of memory, or cache flushes under flush=reject */
    size_t n_cards;               /* the verdicts published for job_submit.lua */
    struct mmg_card cards[MMG_RECORD_CARDS];
    mmg_decision decision;
    int blocks;                   /* 1: init_post_opt must return -1 */
    char reason[1024];
    struct mmg_hostcheck host;
    char lines[MMG_MAX_LINES][MMG_LINE_MAX]; /* user-facing explanation */
    size_t n_lines;
};

/* Run the whole check for mmg_opts (model must be set).  Never fails: every
 * problem becomes decision MMG_ERROR with the on_error policy in `blocks`. */
void mmg_check_run(struct mmg_check *chk, mmg_tool tool, int ac, char **av);
void mmg_check_free(struct mmg_check *chk);
/* Add one line of explanation (at most MMG_MAX_LINES). */
void mmg_check_line(struct mmg_check *chk, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- explanation (explain.c) ------------------------------------------------- */
/* A misfit: where the memory goes and what would fit, in the user's terms. */
void mmg_explain_misfit(struct mmg_check *chk);

/* ---- host memory (hostmem.c) ------------------------------------------------------ */
/* The predicted host memory of the job's GPU processes against its memory
 * request (host_mem=): may turn the decision into warn, reject or error. */
void mmg_host_check(struct mmg_check *chk);

/* ---- publishing and logging ---------------------------------------------------- */
typedef int (*mmg_setenv_f)(void *ctx, const char *name, const char *value);
/* The one MMGUARD variable: set(ctx, "MMGUARD", text). */
#define MMG_VAR "MMGUARD"
void mmg_publish(const struct mmg_check *chk, mmg_setenv_f set, void *ctx);
void mmg_record_from_check(const struct mmg_check *chk, struct mmg_record *r);
/* Append one JSON line to cfg.log_path (and syslog when enabled). */
void mmg_log_decision(const struct mmg_check *chk);
/* The JSON text of the decision record (malloc'd), NULL on OOM. */
char *mmg_decision_json(const struct mmg_check *chk);

/* What sbatch/salloc and srun do with --mm-model: run, print, publish with
 * `set`, log.  Returns what init_post_opt returns (-1 blocks the job). */
int mmg_check_submit(mmg_tool tool, mmg_setenv_f set, void *ctx, int ac, char **av);

/* ---- contexts ------------------------------------------------------------------ */
int mmg_alloc_post_opt(spank_t sp, int ac, char **av);
int mmg_local_post_opt(spank_t sp, int ac, char **av);
int mmg_remote_user_init(spank_t sp, int ac, char **av);
int mmg_slurmd_init(spank_t sp, int ac, char **av);
/* outcome.c: never fail, never return anything to Slurm */
void mmg_outcome_user_init(spank_t sp);
void mmg_outcome_exit(spank_t sp, int ac, char **av);

#endif
