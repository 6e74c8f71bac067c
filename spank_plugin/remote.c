/* remote.c - remote context (slurmstepd, runs as root): hand the submit-time
 * prediction to the job's tasks as MMGUARD_* variables.
 *
 * Nothing user-named is opened here.  The values were computed by sbatch /
 * salloc / srun at submit time and published with spank_job_control_setenv();
 * Slurm 22.05 carries them into the job's environment as SLURM_SPANK_<NAME>
 * (sbatch/salloc set those in their own environment, which the job inherits;
 * srun reads them back into its job-control env).  We copy the validated
 * values to their plain MMGUARD_* names.  Never fails. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

static int numeric(const char *name)
{
    return strstr(name, "_BYTES") || strstr(name, "_MEM") || strstr(name, "_BATCH") ||
           strstr(name, "_PARALLEL");
}

static int valid_value(const char *name, const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= MMG_PATH_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)v[i];
        if (numeric(name) ? !isdigit(ch) : (iscntrl(ch) || ch > 126))
            return 0;
    }
    return !numeric(name) || n <= 20;
}

int mmg_remote_user_init(spank_t sp, int ac, char **av)
{
    char probe[64];
    (void)ac;
    (void)av;
    /* No submit-time decision for this job: MMGUARD_* inherited through the
     * submitting environment (e.g. a job submitted from inside an mmguard job)
     * would describe another job; remove them. */
    if (spank_getenv(sp, "SLURM_SPANK_MMGUARD_DECISION", probe, sizeof(probe)) != ESPANK_SUCCESS &&
        spank_getenv(sp, "SPANK_MMGUARD_DECISION", probe, sizeof(probe)) != ESPANK_SUCCESS) {
        for (size_t i = 0; mmg_task_vars[i]; i++)
            (void)spank_unsetenv(sp, mmg_task_vars[i]);
        return 0;
    }
    for (size_t i = 0; mmg_task_vars[i]; i++) {
        const char *name = mmg_task_vars[i];
        char src[96], val[MMG_PATH_MAX + 8];
        snprintf(src, sizeof(src), "SLURM_SPANK_%s", name);
        if (spank_getenv(sp, src, val, sizeof(val)) != ESPANK_SUCCESS) {
            snprintf(src, sizeof(src), "SPANK_%s", name);
            if (spank_getenv(sp, src, val, sizeof(val)) != ESPANK_SUCCESS)
                continue;
        }
        if (!valid_value(name, val)) {
            slurm_debug(MMG_PREFIX "ignoring malformed %s", src);
            continue;
        }
        if (spank_setenv(sp, name, val, 1) != ESPANK_SUCCESS)
            slurm_debug(MMG_PREFIX "cannot set %s for the tasks", name);
    }
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
