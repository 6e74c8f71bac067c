/* plugin.h - internals shared by the mmguard SPANK plugin's files.
 *
 * dispatch.c  every slurm_spank_* entry point, switching on spank_context()
 * options.c   --mm-model / --mm-gpu / --mm-gpus registration and callbacks
 * check.c     the submit-time check: config, spec, prediction, decision, text
 * publish.c   MMGUARD_* values: spank_job_control_setenv, decision log, syslog
 * alloc.c     sbatch / salloc (allocator context)
 * local.c     srun (local context)
 * remote.c    slurmstepd (remote context): export MMGUARD_* to the tasks
 */
#ifndef MMG_PLUGIN_H
#define MMG_PLUGIN_H

#include <stdint.h>
#include <slurm/spank.h>

#include "config.h"
#include "mmguard.h"

#define MMG_PREFIX "mmguard: "
#define MMG_MAX_LINES 24
#define MMG_LINE_MAX 512

/* ---- options ------------------------------------------------------------- */
struct mmg_opts {
    char *model;     /* --mm-model, NULL if not given */
    char *gpu;       /* --mm-gpu */
    uint32_t gpus;   /* --mm-gpus, 0 = spec's training.data_parallel */
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

/* ---- the check ------------------------------------------------------------- */
typedef enum {
    MMG_ACCEPT = 0, MMG_WARN, MMG_REJECT, MMG_ERROR
} mmg_decision;
const char *mmg_decision_name(mmg_decision d);

struct mmg_check {
    const char *source;           /* "sbatch" | "salloc" | "srun" */
    struct mmg_config cfg;
    int cfg_ok;
    char spec_arg[MMG_PATH_MAX];  /* --mm-model as given */
    char spec_path[MMG_PATH_MAX]; /* resolved (realpath) when possible */
    mm_spec *spec;
    int have_pred, have_fit;
    mm_prediction pred;
    mm_fit_result fit;
    const struct mmg_gpu *gpu;
    uint32_t dp;
    uint64_t peak, alloc_peak, usable;
    size_t dom_term;              /* index of the dominant term at dp */
    mmg_decision decision;
    int blocks;                   /* 1: init_post_opt must return -1 */
    char reason[768];
    char lines[MMG_MAX_LINES][MMG_LINE_MAX]; /* user-facing explanation */
    size_t n_lines;
};

/* Run the whole check for mmg_opts (model must be set).  Never fails: every
 * problem becomes decision MMG_ERROR with the on_error policy in `blocks`. */
void mmg_check_run(struct mmg_check *chk, const char *source, int ac, char **av);
void mmg_check_free(struct mmg_check *chk);
/* Print the explanation with slurm_error (blocking) or slurm_info. */
void mmg_check_print(const struct mmg_check *chk);

/* ---- publishing ------------------------------------------------------------ */
typedef int (*mmg_setenv_f)(void *ctx, const char *name, const char *value);
/* Calls set(ctx, "MMGUARD_...", value) for every published variable. */
void mmg_publish(const struct mmg_check *chk, mmg_setenv_f set, void *ctx);
/* Append one JSON line to cfg.log_path (and syslog when enabled). */
void mmg_log_decision(const struct mmg_check *chk);
/* The JSON text of the decision record (malloc'd), NULL on OOM. */
char *mmg_decision_json(const struct mmg_check *chk);

/* Names of the variables a step exports to its tasks (NULL-terminated). */
extern const char *const mmg_task_vars[];

/* What sbatch/salloc and srun do with --mm-model: run, print, publish with
 * `set`, log.  Returns what init_post_opt returns (-1 blocks the job). */
int mmg_check_submit(const char *source, mmg_setenv_f set, void *ctx, int ac, char **av);

/* ---- contexts -------------------------------------------------------------- */
int mmg_alloc_post_opt(spank_t sp, int ac, char **av);
int mmg_local_post_opt(spank_t sp, int ac, char **av);
int mmg_remote_user_init(spank_t sp, int ac, char **av);
int mmg_slurmd_init(spank_t sp, int ac, char **av);

#endif
