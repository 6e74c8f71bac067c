/* request_tool.c - prints the GPU request spank_plugin/request.c rebuilds from
 * a command line, the environment and (sbatch) a batch script, so that
 * tests/slurm/test_request.sh can hold it against what the real slurmctld
 * records for the same submission (scontrol show job).
 *
 *   request_tool sbatch|salloc|srun [SCRIPT|-] -- ARGV...
 * prints one line:
 *   tpn=.. tpj=.. tpt=.. tps=.. min_nodes=N max_nodes=N num_tasks=N ntpn=N \
 *   status=ok|none|unknown gpus=N type=T nodes=A-B
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request.h"

extern char **environ;

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t cap = 0;
    *len = 0;
    if (!f)
        return NULL;
    for (;;) {
        if (*len + 4096 > cap) {
            char *b = realloc(buf, cap = cap * 2 + 4096);
            if (!b)
                break;
            buf = b;
        }
        size_t n = fread(buf + *len, 1, cap - *len, f);
        if (n == 0)
            break;
        *len += n;
    }
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    struct mmg_reqin r;
    struct mmg_jobreq j;
    struct mmg_gpureq g;
    char err[512], desc[512];
    mmg_tool tool;
    int sep = 3;

    if (argc < 4 || strcmp(argv[3], "--") != 0) {
        fprintf(stderr, "usage: request_tool sbatch|salloc|srun SCRIPT|- -- ARGV...\n");
        return 2;
    }
    tool = !strcmp(argv[1], "salloc") ? MMG_TOOL_SALLOC
         : !strcmp(argv[1], "srun") ? MMG_TOOL_SRUN : MMG_TOOL_SBATCH;
    mmg_reqin_init(&r, tool);
    snprintf(r.script_name, sizeof(r.script_name), "%s", argv[2]);
    if (strcmp(argv[2], "-") != 0) {
        size_t len;
        char *text = slurp(argv[2], &len);
        if (!text) {
            perror(argv[2]);
            return 2;
        }
        mmg_script_apply(&r, text, len);
        free(text);
    }
    mmg_env_apply(&r, environ);
    mmg_args_apply(&r, argc - sep - 1, argv + sep + 1, MMG_FROM_ARGS, NULL);
    if (mmg_reqin_to_job(&r, &j) != 0) {
        printf("error=%s\n", r.error);
        return 1;
    }
    printf("tpn=%s tpj=%s tpt=%s tps=%s min_nodes=%u max_nodes=%u num_tasks=%u ntpn=%u ",
           j.tres_per_node, j.tres_per_job, j.tres_per_task, j.tres_per_socket, j.min_nodes,
           j.max_nodes, j.num_tasks, j.ntasks_per_node);
    switch (mmg_jobreq_eval(&j, &g, err, sizeof(err))) {
    case MMG_REQ_OK:
        mmg_request_describe(&r, &g, desc, sizeof(desc));
        printf("status=ok gpus=%u type=%s nodes=%u-%u desc=%s\n", g.gpus_min, g.type, g.nodes_min,
               g.nodes_max, desc);
        return 0;
    case MMG_REQ_NONE:
        printf("status=none %s\n", err);
        return 0;
    default:
        printf("status=unknown %s\n", err);
        return 0;
    }
}
