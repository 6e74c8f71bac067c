/* options.c - the plugin's command-line options (sbatch, salloc, srun and
 * #SBATCH lines).  Callbacks only record values; nothing is opened here, and in
 * slurmstepd (remote != 0) a callback never fails. */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "plugin.h"

struct mmg_opts mmg_opts;

enum { OPT_MODEL = 1, OPT_GPU, OPT_GPUS };

static int set_str(char **dst, const char *arg)
{
    char *s = strdup(arg);
    if (!s)
        return -1;
    free(*dst);
    *dst = s;
    return 0;
}

static int opt_cb(int val, const char *optarg, int remote)
{
    if (!optarg)
        optarg = "";
    switch (val) {
    case OPT_MODEL:
        if (!remote && (optarg[0] == '\0' || strlen(optarg) >= MMG_PATH_MAX)) {
            slurm_error(MMG_PREFIX "--mm-model: expected a spec file name (1..%d bytes)",
                        MMG_PATH_MAX - 1);
            return -1;
        }
        mmg_opts.model_calls++;
        return set_str(&mmg_opts.model, optarg) == 0 || remote ? 0 : -1;
    case OPT_GPU:
        if (!remote) {
            size_t n = strlen(optarg);
            int ok = n > 0 && n < MMG_GPU_NAME_MAX;
            for (size_t i = 0; ok && i < n; i++)
                ok = isalnum((unsigned char)optarg[i]) || strchr("-_.", optarg[i]);
            if (!ok) {
                slurm_error(MMG_PREFIX "--mm-gpu: invalid GPU type '%s'", optarg);
                return -1;
            }
        }
        return set_str(&mmg_opts.gpu, optarg) == 0 || remote ? 0 : -1;
    case OPT_GPUS: {
        char *end = NULL;
        unsigned long v;
        errno = 0;
        v = isdigit((unsigned char)optarg[0]) ? strtoul(optarg, &end, 10) : 0;
        if (errno || !end || *end || v < 1 || v > 1024) {
            if (remote)
                return 0;
            slurm_error(MMG_PREFIX "--mm-gpus: '%s' is not an integer in 1..1024", optarg);
            return -1;
        }
        mmg_opts.gpus = (uint32_t)v;
        return 0;
    }
    default:
        return remote ? 0 : -1;
    }
}

static struct spank_option options[] = {
    { "mm-model", "FILE",
      "mmguard: predict the job's peak GPU memory from this model spec (YAML/JSON) "
      "and reject/warn if it does not fit", 1, OPT_MODEL, opt_cb },
    { "mm-gpu", "TYPE",
      "mmguard: judge on this GPU type instead of the one the job asks for (rarely needed)",
      1, OPT_GPU, opt_cb },
    { "mm-gpus", "N",
      "mmguard: judge on N GPUs (data-parallel degree) instead of the GPUs the job asks for "
      "(rarely needed)", 1, OPT_GPUS, opt_cb },
    SPANK_OPTIONS_TABLE_END
};

int mmg_options_register(spank_t sp)
{
    int rc = 0;
    for (struct spank_option *o = options; o->name; o++) {
        spank_err_t e = spank_option_register(sp, o);
        if (e != ESPANK_SUCCESS) {
            slurm_error(MMG_PREFIX "cannot register --%s: %s", o->name, spank_strerror(e));
            rc = -1;
        }
    }
    return rc;
}

int mmg_model_inherited(void)
{
    const char *env = getenv("SLURM_SPANK__SLURM_SPANK_OPTION_mmguard_mm_model");
    return mmg_opts.model && env && getenv("SLURM_JOB_ID") && mmg_opts.model_calls == 1 &&
           strcmp(env, mmg_opts.model) == 0;
}

void mmg_options_free(void)
{
    free(mmg_opts.model);
    free(mmg_opts.gpu);
    memset(&mmg_opts, 0, sizeof(mmg_opts));
}
