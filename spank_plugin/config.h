/* config.h - strict parser of the mmguard plugin configuration.
 *
 * The configuration comes from the plugstack.conf line (key=value arguments)
 * and/or from a file named there with config=FILE (one key=value per line,
 * '#' starts a comment line).  One file serves both the SPANK plugin and
 * job_submit/lua, so keys only the Lua side uses are accepted and validated.
 * Unknown keys and bad values are errors naming the key and where it was
 * written ("FILE:LINE" or "plugstack.conf argument N").
 *
 * No Slurm dependency: the unit tests link this file directly.
 */
#ifndef MMG_CONFIG_H
#define MMG_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "mmguard.h"

#define MMG_MAX_GPU_TYPES 32
#define MMG_GPU_NAME_MAX  32
#define MMG_PATH_MAX      1024
#define MMG_CONF_MAX_BYTES (64u * 1024u)
#define MMG_CONF_MAX_LINE  1024

typedef enum { MMG_ACTION_REJECT = 0, MMG_ACTION_WARN, MMG_ACTION_RESIZE } mmg_action;
typedef enum { MMG_ONERR_REJECT = 0, MMG_ONERR_ALLOW } mmg_on_error;
/* GPU jobs without --mm-model (job_submit.lua): off | warn | reject */
typedef enum { MMG_REQUIRE_OFF = 0, MMG_REQUIRE_WARN, MMG_REQUIRE_REJECT } mmg_require;
/* host memory that does not fit the job's request: check (as action= says:
 * reject, or warn for warn/resize) | warn | off */
typedef enum { MMG_HOSTMEM_CHECK = 0, MMG_HOSTMEM_WARN, MMG_HOSTMEM_OFF } mmg_hostmem;
/* a job that fits only with cache flushes (the caching allocator frees its
 * cache and retries cudaMalloc, docs/allocator.md): warn (default) | accept |
 * reject (a misfit, handled as action= says) */
typedef enum { MMG_FLUSH_WARN = 0, MMG_FLUSH_ACCEPT, MMG_FLUSH_REJECT } mmg_flush;

/* Host memory of one GPU process outside what the predictor models: Python,
 * torch and CUDA initialised (docs/plugin.md, "Host memory"). */
#define MMG_DEFAULT_HOST_OVERHEAD (3ull << 30)

/* Largest size accepted (2^53 - 1): job_submit.lua counts bytes in doubles. */
#define MMG_CONF_MAX_SIZE ((1ull << 53) - 1)

struct mmg_gpu {
    char name[MMG_GPU_NAME_MAX];
    uint64_t bytes;
    int builtin;
};

struct mmg_config {
    mmg_action action;
    mmg_flush flush;                /* flush= */
    mm_margin margin;               /* margin= (percent or bytes) */
    uint64_t margin_num, margin_den;/* the percentage exactly: num/den percent */
    uint64_t reserve;               /* reserve= bytes, added to margin.bytes */
    struct mmg_gpu gpus[MMG_MAX_GPU_TYPES];
    size_t n_gpus;
    char default_gpu[MMG_GPU_NAME_MAX];
    char log_path[MMG_PATH_MAX];    /* "" = no decision log */
    int syslog;
    int max_micro_batch;            /* max_micro_batch=: search it at submit (mmb=) */
    mmg_on_error on_error;
    mmg_require require;            /* job_submit.lua only, validated here */
    /* job_submit.lua only, validated here */
    uint32_t max_gpus_per_node;
    char resize_types[256];
    char ctld_log[MMG_PATH_MAX];
    /* host memory (memreq.h); bytes, 0 = not set */
    mmg_hostmem host_mem;
    uint64_t host_overhead;         /* per GPU process */
    uint64_t def_mem_per_node, def_mem_per_cpu, def_mem_per_gpu; /* slurm.conf's DefMemPer* */
    uint64_t node_mem;              /* a GPU node's memory for jobs (--mem=0, no default) */
    char config_file[MMG_PATH_MAX]; /* last config= loaded, "" if none */
};

/* Built-in defaults: action=reject flush=warn margin=0% reserve=0 default_gpu=h100,
 * on_error=reject, syslog=no, no log, max_gpus_per_node=8, host_mem=check,
 * host_overhead=3GiB, no def_mem_* nor node_mem, max_micro_batch=yes, GPU table
 * h100=81559MiB h200=143771MiB a100=81920MiB a100-40g=40960MiB l40s=46068MiB. */
void mmg_config_defaults(struct mmg_config *c);

/* Set one key.  `where` names the source for messages ("mmguard.conf:3").
 * On error writes "WHERE: KEY: problem" into err and returns -1. */
int mmg_config_set(struct mmg_config *c, const char *key, const char *value,
                   const char *where, char *err, size_t errlen);

/* Load a config file (regular file, <= 64 KiB, lines <= 1023 chars). */
int mmg_config_load_file(struct mmg_config *c, const char *path,
                         char *err, size_t errlen);

/* Defaults, then the plugstack arguments in order (config=FILE is loaded where
 * it appears, later arguments override), then mmg_config_finish(). */
int mmg_config_parse_args(struct mmg_config *c, int ac, char **av,
                          char *err, size_t errlen);

/* Cross-key checks: default_gpu and every resize_types entry are in the table;
 * def_mem_per_cpu and def_mem_per_node are not both set. */
int mmg_config_finish(const struct mmg_config *c, char *err, size_t errlen);

/* Table lookup, case-insensitive; NULL if unknown. */
const struct mmg_gpu *mmg_config_gpu(const struct mmg_config *c, const char *name);

/* gpu_mem - ceil(gpu_mem * percent / 100) - margin bytes - reserve, computed
 * exactly (as job_submit.lua does); 0 if eaten. */
uint64_t mmg_config_usable(const struct mmg_config *c, uint64_t gpu_mem);

/* "10%+2147483648": margin percent, then margin bytes + reserve. */
void mmg_config_margin_str(const struct mmg_config *c, char *buf, size_t n);

const char *mmg_action_name(mmg_action a);
const char *mmg_hostmem_name(mmg_hostmem h);
const char *mmg_flush_name(mmg_flush f);

#endif
