/* remote.c - remote context (slurmstepd, runs as root): hand the submit-time
 * prediction to the job's tasks as MMGUARD_* variables.
 *
 * Nothing user-named is opened here.  The values were computed by sbatch /
 * salloc / srun at submit time and published as the one MMGUARD variable
 * (record.h); Slurm 22.05 carries it into the job's environment as
 * SLURM_SPANK_MMGUARD (sbatch/salloc set it in their own environment, which
 * the job inherits; srun sets it in its own) and hands it to prolog/epilog as
 * SPANK_MMGUARD.  The text is parsed strictly (it comes from the user) and the
 * task variables are derived from it.  Never fails. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

/* The variables a task sees, in this order. */
static const char *const task_vars[] = {
    "MMGUARD_DECISION", "MMGUARD_PEAK_BYTES", "MMGUARD_ALLOC_PEAK_BYTES",
    "MMGUARD_MAX_MICRO_BATCH", "MMGUARD_GPU", "MMGUARD_GPU_MEM", "MMGUARD_USABLE_BYTES",
    "MMGUARD_DATA_PARALLEL", "MMGUARD_MODEL", "MMGUARD_SPEC", "MMGUARD_SPEC_SHA256",
    "MMGUARD_HOST_PEAK_BYTES", NULL
};

static void u64s(char *buf, size_t n, uint64_t v, int present)
{
    if (present)
        snprintf(buf, n, "%" PRIu64, v);
    else
        buf[0] = '\0';
}

/* Value of task_vars[i] from the record; "" = not set. */
static void task_value(const struct mmg_record *r, size_t i, char *buf, size_t n)
{
    switch (i) {
    case 0: snprintf(buf, n, "%s", r->decision); break;
    case 1: u64s(buf, n, r->peak, r->peak != 0); break;
    case 2: u64s(buf, n, r->alloc, r->alloc != 0); break;
    case 3: u64s(buf, n, r->mmb, r->has_mmb); break;
    case 4: snprintf(buf, n, "%s", r->gpu); break;
    case 5: u64s(buf, n, r->gpu_mem, r->gpu_mem != 0); break;
    case 6: u64s(buf, n, r->usable, r->usable != 0); break;
    case 7: u64s(buf, n, r->dp, r->dp != 0); break;
    case 8: snprintf(buf, n, "%s", r->model); break;
    case 9: snprintf(buf, n, "%s", r->spec); break;
    case 10: snprintf(buf, n, "%s", r->sha256); break;
    default: u64s(buf, n, r->host, r->peak != 0); break; /* 0 without offload */
    }
}

static int read_record(spank_t sp, struct mmg_record *r)
{
    static char text[MMG_RECORD_MAX + 2];
    char err[256];
    if (spank_getenv(sp, "SLURM_SPANK_" MMG_VAR, text, sizeof(text)) != ESPANK_SUCCESS &&
        spank_getenv(sp, "SPANK_" MMG_VAR, text, sizeof(text)) != ESPANK_SUCCESS)
        return 0;
    if (mmg_record_parse(text, r, err, sizeof(err)) != 0) {
        slurm_debug(MMG_PREFIX "ignoring a malformed SLURM_SPANK_" MMG_VAR ": %s", err);
        return -1;
    }
    return 1;
}

int mmg_remote_user_init(spank_t sp, int ac, char **av)
{
    struct mmg_record *r = calloc(1, sizeof(*r));
    char val[1100];
    int got;
    (void)ac;
    (void)av;
    if (!r)
        return 0;
    got = read_record(sp, r);
    for (size_t i = 0; task_vars[i]; i++) {
        /* No submit-time decision for this job: MMGUARD_* inherited through
         * the submitting environment (e.g. a job submitted from inside an
         * mmguard job) would describe another job; remove them. */
        if (got <= 0) {
            (void)spank_unsetenv(sp, task_vars[i]);
            continue;
        }
        task_value(r, i, val, sizeof(val));
        if (!val[0])
            (void)spank_unsetenv(sp, task_vars[i]);
        else if (spank_setenv(sp, task_vars[i], val, 1) != ESPANK_SUCCESS)
            slurm_debug(MMG_PREFIX "cannot set %s for the tasks", task_vars[i]);
    }
    free(r);
    return 0;
}

/* slurmd context: report a broken configuration in slurmd's log at start-up,
 * where the admin looks, but never fail slurmd. */
int mmg_slurmd_init(spank_t sp, int ac, char **av)
{
    struct mmg_config *cfg;
    char err[1024];
    (void)sp;
    cfg = calloc(1, sizeof(*cfg));
    if (!cfg)
        return 0;
    if (mmg_config_parse_args(cfg, ac, av, err, sizeof(err)) != 0)
        slurm_error(MMG_PREFIX "configuration error (jobs using --mm-model will be "
                    "rejected): %s", err);
    free(cfg);
    return 0;
}
