/* local.c - local context (srun): the same check as sbatch when srun creates
 * the allocation; inside an allocation it checks the step.  Values also go into
 * srun's own environment, which srun forwards to the step's tasks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

static int local_set(void *ctx, const char *name, const char *value)
{
    spank_t sp = (spank_t)ctx;
    /* job-control env only matters when srun submits a new job; inside an
     * allocation it is refused, which is fine */
    char env[128];
    (void)spank_job_control_setenv(sp, name, value, 1);
    /* like sbatch/salloc do for their job-control env: the step's tasks (and
     * slurmstepd, see remote.c) find the values as SLURM_SPANK_<NAME> */
    snprintf(env, sizeof(env), "SLURM_SPANK_%s", name);
    if (setenv(env, value, 1) != 0)
        return -1;
    for (size_t i = 0; mmg_task_vars[i]; i++)
        if (!strcmp(mmg_task_vars[i], name))
            return setenv(name, value, 1);
    return 0;
}

int mmg_local_post_opt(spank_t sp, int ac, char **av)
{
    if (!mmg_opts.model || mmg_model_inherited())
        return 0;
    return mmg_check_submit("srun", local_set, sp, ac, av);
}
