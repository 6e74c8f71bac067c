/* optable.c - every long and short option of Slurm 22.05's sbatch, salloc and
 * srun, with whether it takes an argument.
 *
 * Why this file exists: to rebuild a job's GPU request from its command line
 * (request.h) the walk must know which arguments are option values, where the
 * options end (the script or command), and which option an abbreviation such
 * as --gpus-per-n stands for.  The names, argument kinds and tools are those of
 * common_options[] in slurm-22-05-8-1 src/common/slurm_opt.c (data, not code);
 * the three mmguard options are added as SPANK adds them.  Options of other
 * SPANK plugins are unknown here: mmg_args_apply() treats an unknown long
 * option as taking no argument unless written --name=value.
 */
#include <string.h>

#include "request.h"

#define ALL (MMG_TOOL_SBATCH | MMG_TOOL_SALLOC | MMG_TOOL_SRUN)

static const struct mmg_slurm_opt table[] = {
    { "accel-bind", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "account", MMG_ARG_REQ, 'A', ALL, MMG_O_OTHER },
    { "acctg-freq", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "array", MMG_ARG_REQ, 'a', MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "batch", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "bcast", MMG_ARG_OPT, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "bcast-exclude", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "begin", MMG_ARG_REQ, 'b', ALL, MMG_O_OTHER },
    { "bell", MMG_ARG_NONE, 0, MMG_TOOL_SALLOC, MMG_O_OTHER },
    { "bb", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "bbf", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "cluster-constraint", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "chdir", MMG_ARG_REQ, 'D', ALL, MMG_O_CHDIR },
    { "cluster", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "clusters", MMG_ARG_REQ, 'M', ALL, MMG_O_OTHER },
    { "comment", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "compress", MMG_ARG_OPT, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "container", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "context", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "contiguous", MMG_ARG_NONE, 0, ALL, MMG_O_OTHER },
    { "constraint", MMG_ARG_REQ, 'C', ALL, MMG_O_OTHER },
    { "core-spec", MMG_ARG_REQ, 'S', ALL, MMG_O_OTHER },
    { "cores-per-socket", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "cpu-bind", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "cpu_bind", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "cpu-freq", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "cpus-per-gpu", MMG_ARG_REQ, 0, ALL, MMG_O_CPUS_PER_GPU },
    { "cpus-per-task", MMG_ARG_REQ, 'c', ALL, MMG_O_CPUS_PER_TASK },
    { "deadline", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "debugger-test", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "delay-boot", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "dependency", MMG_ARG_REQ, 'd', ALL, MMG_O_OTHER },
    { "disable-status", MMG_ARG_NONE, 'X', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "distribution", MMG_ARG_REQ, 'm', ALL, MMG_O_OTHER },
    { "epilog", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "error", MMG_ARG_REQ, 'e', MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "exact", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "exclude", MMG_ARG_REQ, 'x', ALL, MMG_O_OTHER },
    { "exclusive", MMG_ARG_OPT, 0, ALL, MMG_O_OTHER },
    { "export", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "export-file", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "extra-node-info", MMG_ARG_REQ, 'B', ALL, MMG_O_OTHER },
    { "get-user-env", MMG_ARG_OPT, 0, MMG_TOOL_SBATCH | MMG_TOOL_SALLOC, MMG_O_OTHER },
    { "gid", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "gpu-bind", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "gpu-freq", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "gpus", MMG_ARG_REQ, 'G', ALL, MMG_O_GPUS },
    { "gpus-per-node", MMG_ARG_REQ, 0, ALL, MMG_O_GPUS_PER_NODE },
    { "gpus-per-socket", MMG_ARG_REQ, 0, ALL, MMG_O_GPUS_PER_SOCKET },
    { "gpus-per-task", MMG_ARG_REQ, 0, ALL, MMG_O_GPUS_PER_TASK },
    { "gres", MMG_ARG_REQ, 0, ALL, MMG_O_GRES },
    { "gres-flags", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "help", MMG_ARG_NONE, 'h', ALL, MMG_O_OTHER },
    { "het-group", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_HET },
    { "hint", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "hold", MMG_ARG_NONE, 'H', ALL, MMG_O_OTHER },
    { "ignore-pbs", MMG_ARG_NONE, 0, MMG_TOOL_SBATCH, MMG_O_IGNORE_PBS },
    { "immediate", MMG_ARG_OPT, 'I', MMG_TOOL_SALLOC | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "input", MMG_ARG_REQ, 'i', MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "interactive", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "jobid", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_JOBID },
    { "job-name", MMG_ARG_REQ, 'J', ALL, MMG_O_OTHER },
    { "kill-command", MMG_ARG_OPT, 'K', MMG_TOOL_SALLOC, MMG_O_OTHER },
    { "kill-on-bad-exit", MMG_ARG_OPT, 'K', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "kill-on-invalid-dep", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "label", MMG_ARG_NONE, 'l', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "licenses", MMG_ARG_REQ, 'L', ALL, MMG_O_OTHER },
    { "mail-type", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "mail-user", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "threads", MMG_ARG_REQ, 'T', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "mcs-label", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "mem", MMG_ARG_REQ, 0, ALL, MMG_O_MEM },
    { "mem-bind", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "mem-per-cpu", MMG_ARG_REQ, 0, ALL, MMG_O_MEM_PER_CPU },
    { "mem-per-gpu", MMG_ARG_REQ, 0, ALL, MMG_O_MEM_PER_GPU },
    { "mincpus", MMG_ARG_REQ, 0, ALL, MMG_O_MINCPUS },
    { "mpi", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "msg-timeout", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "multi-prog", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "network", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "nice", MMG_ARG_OPT, 0, ALL, MMG_O_OTHER },
    { "no-allocate", MMG_ARG_NONE, 'Z', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "no-bell", MMG_ARG_NONE, 0, MMG_TOOL_SALLOC, MMG_O_OTHER },
    { "no-kill", MMG_ARG_OPT, 'k', ALL, MMG_O_OTHER },
    { "no-shell", MMG_ARG_NONE, 0, MMG_TOOL_SALLOC, MMG_O_OTHER },
    { "no-requeue", MMG_ARG_NONE, 0, MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "nodefile", MMG_ARG_REQ, 'F', ALL, MMG_O_NODEFILE },
    { "nodelist", MMG_ARG_REQ, 'w', ALL, MMG_O_NODELIST },
    { "nodes", MMG_ARG_REQ, 'N', ALL, MMG_O_NODES },
    { "ntasks", MMG_ARG_REQ, 'n', ALL, MMG_O_NTASKS },
    { "ntasks-per-core", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "ntasks-per-gpu", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "ntasks-per-node", MMG_ARG_REQ, 0, ALL, MMG_O_NTASKS_PER_NODE },
    { "ntasks-per-socket", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "ntasks-per-tres", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "open-mode", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "output", MMG_ARG_REQ, 'o', MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "overcommit", MMG_ARG_NONE, 'O', ALL, MMG_O_OTHER },
    { "overlap", MMG_ARG_OPT, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "oversubscribe", MMG_ARG_NONE, 's', ALL, MMG_O_OTHER },
    { "pack-group", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_HET },
    { "parsable", MMG_ARG_NONE, 0, MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "partition", MMG_ARG_REQ, 'p', ALL, MMG_O_OTHER },
    { "power", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "prefer", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "preserve-env", MMG_ARG_NONE, 'E', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "priority", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "profile", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "prolog", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "propagate", MMG_ARG_OPT, 0, MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "pty", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "qos", MMG_ARG_REQ, 'q', ALL, MMG_O_OTHER },
    { "quiet", MMG_ARG_NONE, 'Q', ALL, MMG_O_OTHER },
    { "quit-on-interrupt", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "reboot", MMG_ARG_NONE, 0, ALL, MMG_O_OTHER },
    { "relative", MMG_ARG_REQ, 'r', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "requeue", MMG_ARG_NONE, 0, MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "reservation", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "resv-ports", MMG_ARG_OPT, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "send-libs", MMG_ARG_OPT, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "signal", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "slurmd-debug", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "sockets-per-node", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "spread-job", MMG_ARG_NONE, 0, ALL, MMG_O_OTHER },
    { "switches", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "task-epilog", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "task-prolog", MMG_ARG_REQ, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "tasks-per-node", MMG_ARG_REQ, 0, ALL, MMG_O_NTASKS_PER_NODE },
    { "test-only", MMG_ARG_NONE, 0, MMG_TOOL_SBATCH | MMG_TOOL_SRUN, MMG_O_OTHER },
    { "thread-spec", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "threads-per-core", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "time", MMG_ARG_REQ, 't', ALL, MMG_O_OTHER },
    { "time-min", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "tmp", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "uid", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "unbuffered", MMG_ARG_NONE, 'u', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "use-min-nodes", MMG_ARG_NONE, 0, ALL, MMG_O_OTHER },
    { "verbose", MMG_ARG_NONE, 'v', ALL, MMG_O_OTHER },
    { "version", MMG_ARG_NONE, 'V', ALL, MMG_O_OTHER },
    { "usage", MMG_ARG_NONE, 0, ALL, MMG_O_OTHER },
    { "wait", MMG_ARG_NONE, 'W', MMG_TOOL_SBATCH, MMG_O_OTHER },
    { "wait-all-nodes", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH | MMG_TOOL_SALLOC, MMG_O_OTHER },
    { "wait", MMG_ARG_REQ, 'W', MMG_TOOL_SRUN, MMG_O_OTHER },
    { "wckey", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "whole", MMG_ARG_NONE, 0, MMG_TOOL_SRUN, MMG_O_OTHER },
    { "wrap", MMG_ARG_REQ, 0, MMG_TOOL_SBATCH, MMG_O_WRAP },
    { "x11", MMG_ARG_OPT, 0, MMG_TOOL_SALLOC | MMG_TOOL_SRUN, MMG_O_OTHER },

    { "mm-model", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "mm-gpu", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
    { "mm-gpus", MMG_ARG_REQ, 0, ALL, MMG_O_OTHER },
};
#define NOPTS (sizeof(table) / sizeof(table[0]))

/* getopt_long: an exact name wins, else the first option the text is a prefix
 * of (Slurm has already refused a truly ambiguous abbreviation). */
const struct mmg_slurm_opt *mmg_opt_long(mmg_tool tool, const char *name, size_t len)
{
    const struct mmg_slurm_opt *prefix = NULL;
    if (len == 0)
        return NULL;
    for (size_t i = 0; i < NOPTS; i++) {
        if (!(table[i].tools & (unsigned)tool) || strncmp(table[i].name, name, len) != 0)
            continue;
        if (table[i].name[len] == '\0')
            return &table[i];
        if (!prefix)
            prefix = &table[i];
    }
    return prefix;
}

const struct mmg_slurm_opt *mmg_opt_short(mmg_tool tool, char c)
{
    for (size_t i = 0; c && i < NOPTS; i++)
        if ((table[i].tools & (unsigned)tool) && table[i].shortopt == c)
            return &table[i];
    return NULL;
}
