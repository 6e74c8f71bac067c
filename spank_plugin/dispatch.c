/* dispatch.c - every slurm_spank_* entry point of the mmguard plugin, switching
 * on spank_context().  A plugin bug must never take down sbatch, slurmd or
 * slurmstepd: only the allocator/local init_post_opt may return an error, and
 * only to reject the job the user asked about. */
#include "plugin.h"

SPANK_PLUGIN(mmguard, 1)

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    switch (spank_context()) {
    case S_CTX_ALLOCATOR:
    case S_CTX_LOCAL:
    case S_CTX_REMOTE:
        /* registration failures are logged; sbatch then reports the option
         * as unknown only if the user actually uses it */
        (void)mmg_options_register(sp);
        return 0;
    case S_CTX_SLURMD:
        return mmg_slurmd_init(sp, ac, av);
    default:
        return 0;
    }
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    switch (spank_context()) {
    case S_CTX_ALLOCATOR:
        return mmg_alloc_post_opt(sp, ac, av);
    case S_CTX_LOCAL:
        return mmg_local_post_opt(sp, ac, av);
    default:
        return 0;
    }
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    if (spank_context() == S_CTX_REMOTE) {
        mmg_outcome_user_init(sp);
        return mmg_remote_user_init(sp, ac, av);
    }
    return 0;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
    if (spank_context() == S_CTX_REMOTE)
        mmg_outcome_exit(sp, ac, av);
    mmg_options_free();
    return 0;
}
