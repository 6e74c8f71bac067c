/* submit.c - what sbatch, salloc and srun do with --mm-model: run the check,
 * print the explanation, publish the decision, log it.  Its own file so that
 * the decision (check.c) never depends on how it is handed on (publish.c,
 * log.c). */
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "plugin.h"

static void print(const struct mmg_check *chk)
{
    for (size_t i = 0; i < chk->n_lines; i++) {
        if (chk->blocks)
            slurm_error(MMG_PREFIX "%s", chk->lines[i]);
        else
            slurm_info(MMG_PREFIX "%s", chk->lines[i]);
    }
}

int mmg_check_submit(mmg_tool tool, mmg_setenv_f set, void *ctx, int ac, char **av)
{
    /* mmg_check_run clears it: calloc would clear its 170 KB twice */
    struct mmg_check *chk = malloc(sizeof(*chk));
    int rc;

    if (!chk) {
        slurm_error(MMG_PREFIX "--mm-model: out of memory");
        return -1;
    }
    mmg_check_run(chk, tool, ac, av);
    print(chk);
    if (!chk->blocks)
        mmg_publish(chk, set, ctx);
    mmg_log_decision(chk);
    rc = chk->blocks ? -1 : 0;
    mmg_check_free(chk);
    free(chk);
#ifdef __GLIBC__
    /* hand the prediction's freed heap back: sbatch then callocs 256 KiB per
     * environment variable (Slurm's setenvf) from fresh, already zero pages
     * instead of clearing our leftovers (0.25 M fewer instructions per
     * accepted sbatch under max_micro_batch=no, bench/sbatch_instructions.sh) */
    malloc_trim(0);
#endif
    return rc;
}
