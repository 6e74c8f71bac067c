/* local.c - local context (srun): the same check as sbatch when srun creates
 * the allocation; inside an allocation it checks the step against the GPUs
 * the step gets.  The record also goes into srun's own environment as
 * SLURM_SPANK_MMGUARD, which srun forwards to the step (remote.c reads it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

static int local_set(void *ctx, const char *name, const char *value)
{
    spank_t sp = (spank_t)ctx;
    char env[64];
    /* job-control env only matters when srun submits a new job; inside an
     * allocation it is refused, which is fine */
    (void)spank_job_control_setenv(sp, name, value, 1);
    /* like sbatch/salloc do for their job-control env */
    snprintf(env, sizeof(env), "SLURM_SPANK_%s", name);
    return setenv(env, value, 1);
}

int mmg_local_post_opt(spank_t sp, int ac, char **av)
{
    if (!mmg_opts.model || mmg_model_inherited())
        return 0;
    return mmg_check_submit(MMG_TOOL_SRUN, local_set, sp, ac, av);
}
