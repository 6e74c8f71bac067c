/* fuzz_split.h - how the request harnesses (fuzz_request.c, fuzz_memreq.c) cut
 * one input into the parts a tool reads: NUL-separated parts, each a
 * '\n'-separated list (environment, command line). */
#ifndef MM_FUZZ_SPLIT_H
#define MM_FUZZ_SPLIT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "request.h"

/* The next NUL-terminated part of the input (malloc'd), or "" at the end. */
static inline char *fuzz_part(const uint8_t **d, size_t *n)
{
    const uint8_t *nul = memchr(*d, '\0', *n);
    size_t len = nul ? (size_t)(nul - *d) : *n;
    char *s = malloc(len + 1);
    if (!s)
        FUZZ_FAIL("out of memory");
    memcpy(s, *d, len);
    s[len] = '\0';
    *d += len + (nul != NULL);
    *n -= len + (nul != NULL);
    return s;
}

/* "a\nb\nc" -> {"a","b","c",NULL} pointing into s (argv[0] first when given). */
static inline char **fuzz_lines(char *s, const char *first, int *count)
{
    size_t n = 2;
    for (char *p = s; *p; p++)
        n += *p == '\n';
    char **v = calloc(n + 1, sizeof *v);
    int k = 0;
    if (!v)
        FUZZ_FAIL("out of memory");
    if (first)
        v[k++] = (char *)first;
    for (char *p = s, *nl; p && *p; p = nl) {
        nl = strchr(p, '\n');
        if (nl)
            *nl++ = '\0';
        v[k++] = p;
    }
    *count = k;
    return v;
}

/* One input as a tool reads it: a tool selector byte, then the parts batch
 * script, environment, command line and one more (`last`), applied in
 * sbatch's order to r. */
struct fuzz_input {
    struct mmg_reqin *r;
    char *script, *env, *args, *last;
    char **envp, **argv;
    int nenv, nargs;
};

static inline void fuzz_input_read(struct fuzz_input *in, const uint8_t *data, size_t size)
{
    static const mmg_tool tools[] = { MMG_TOOL_SBATCH, MMG_TOOL_SALLOC, MMG_TOOL_SRUN };
    in->r = malloc(sizeof *in->r);
    if (!in->r)
        FUZZ_FAIL("out of memory");
    mmg_reqin_init(in->r, tools[data[0] % 3]);
    data++;
    size--;
    in->script = fuzz_part(&data, &size);
    in->env = fuzz_part(&data, &size);
    in->args = fuzz_part(&data, &size);
    in->last = fuzz_part(&data, &size);
    in->envp = fuzz_lines(in->env, NULL, &in->nenv);
    in->argv = fuzz_lines(in->args, mmg_tool_name(in->r->tool), &in->nargs);
    (void)mmg_script_apply(in->r, in->script, strlen(in->script));
    mmg_env_apply(in->r, in->envp);
    (void)mmg_args_apply(in->r, in->nargs, in->argv, MMG_FROM_ARGS, NULL);
}

static inline void fuzz_input_free(struct fuzz_input *in)
{
    free(in->envp);
    free(in->argv);
    free(in->script);
    free(in->env);
    free(in->args);
    free(in->last);
    free(in->r);
}

#endif
