/* alloc.c - allocator context (sbatch, salloc): the submit-time check. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

extern char **environ;

static int job_control_set(void *ctx, const char *name, const char *value)
{
    spank_err_t e = spank_job_control_setenv((spank_t)ctx, name, value, 1);
    if (e != ESPANK_SUCCESS)
        slurm_error(MMG_PREFIX "cannot publish %s: %s", name, spank_strerror(e));
    return e == ESPANK_SUCCESS ? 0 : -1;
}

/* A job submitted from inside another mmguard job inherits the outer job's
 * SLURM_SPANK_MMGUARD (and, from older plugins, SLURM_SPANK_MMGUARD_*); drop
 * them so that they cannot describe this job. */
static void drop_inherited(void)
{
    for (size_t i = 0; environ && environ[i];) {
        if (!strncmp(environ[i], "SLURM_SPANK_MMGUARD", 19) &&
            (environ[i][19] == '=' || environ[i][19] == '_')) {
            char name[128];
            const char *eq = strchr(environ[i], '=');
            size_t n = eq ? (size_t)(eq - environ[i]) : strlen(environ[i]);
            if (n < sizeof(name)) {
                memcpy(name, environ[i], n);
                name[n] = '\0';
                unsetenv(name);
                continue; /* environ shifted: re-examine index i */
            }
        }
        i++;
    }
}

static mmg_tool allocator_tool(void)
{
    char comm[32] = "";
    FILE *f = fopen("/proc/self/comm", "re");
    if (f) {
        if (!fgets(comm, sizeof(comm), f))
            comm[0] = '\0';
        fclose(f);
    }
    return !strncmp(comm, "salloc", 6) ? MMG_TOOL_SALLOC : MMG_TOOL_SBATCH;
}

int mmg_alloc_post_opt(spank_t sp, int ac, char **av)
{
    if (!mmg_opts.model || mmg_model_inherited()) {
        drop_inherited();
        if (!mmg_opts.model && (mmg_opts.gpu || mmg_opts.gpus))
            slurm_info(MMG_PREFIX "--mm-gpu/--mm-gpus given without --mm-model: ignored");
        return 0;
    }
    return mmg_check_submit(allocator_tool(), job_control_set, sp, ac, av);
}
