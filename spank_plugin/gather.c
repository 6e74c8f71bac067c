/* gather.c - the GPU request of this sbatch / salloc / srun process.
 *
 * Why this file exists: in the allocator and local contexts SPANK does not
 * expose --gres/--gpus, so the request is rebuilt from what the tool itself
 * read (request.h): /proc/self/cmdline, the environment, for sbatch the batch
 * script's #SBATCH lines (the script file found as sbatch finds it, or
 * standard input when it is a regular file), and for an srun step without GPU
 * options of its own the allocation's GPUs (`scontrol show job`).  Everything
 * here only reads what the user could read anyway; nothing is trusted for
 * more than the user's own early check (job_submit.lua judges the job
 * slurmctld receives). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "plugin.h"

extern char **environ;

#define CMDLINE_MAX (1u << 20)
#define JOBINFO_MAX (64u * 1024u)
#define SCONTROL_TIMEOUT_MS 20000

/* Read fd to its end into a malloc'd NUL-terminated buffer.  More than max
 * bytes: NULL (errno EFBIG), or with `truncate` the first max bytes. */
static char *read_fd(int fd, size_t max, int truncate, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        ssize_t k;
        if (n == cap && cap >= max) {
            if (truncate)
                break;
            free(buf);
            errno = EFBIG;
            return NULL;
        }
        if (n == cap) {
            char *b = realloc(buf, cap * 2 + 1);
            if (!b)
                break;
            buf = b;
            cap *= 2;
        }
        k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            free(buf);
            return NULL;
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

/* /proc/self/cmdline as an argv array (strings point into *store). */
static char **read_cmdline(char **store, int *argc)
{
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    size_t len = 0, n = 0;
    char **argv;
    *store = fd >= 0 ? read_fd(fd, CMDLINE_MAX, 0, &len) : NULL;
    if (fd >= 0)
        close(fd);
    if (!*store)
        return NULL;
    for (size_t i = 0; i < len; i++)
        n += (*store)[i] == '\0';
    argv = calloc(n + 2, sizeof(*argv));
    *argc = 0;
    for (size_t i = 0; argv && i < len; i += strlen(*store + i) + 1)
        argv[(*argc)++] = *store + i;
    return argv;
}

static int is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && !S_ISDIR(st.st_mode);
}

/* The script as sbatch's search_path() finds it: "/..." and "./..." as
 * given; otherwise in --chdir (or the working directory), then in $PATH. */
static int find_script(const char *cmd, const char *chdir_opt, char *out, size_t n)
{
    const char *path = getenv("PATH");
    char cwd[1024];
    if (cmd[0] == '/' || cmd[0] == '.') {
        snprintf(out, n, "%s", cmd);
        return 0;
    }
    if (!chdir_opt || !chdir_opt[0])
        chdir_opt = getcwd(cwd, sizeof(cwd)) ? cwd : ".";
    snprintf(out, n, "%s/%s", chdir_opt, cmd);
    if (is_file(out))
        return 0;
    for (const char *p = path; p && *p;) {
        const char *c = strchr(p, ':');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (p[0] == '.')
            snprintf(out, n, "%s/%.*s/%s", chdir_opt, (int)len, p, cmd);
        else
            snprintf(out, n, "%.*s/%s", (int)len, p, cmd);
        if (len && is_file(out))
            return 0;
        p = c ? c + 1 : NULL;
    }
    snprintf(out, n, "%s", cmd);
    return -1;
}

/* The batch script's text: the file sbatch reads, or standard input when it
 * is a regular file (read with pread: sbatch's own offset is untouched). */
static char *script_text(struct mmg_reqin *r, int argc, char **argv, int first, size_t *len)
{
    char path[2048];
    char *text = NULL;
    struct stat st;
    int fd;

    if (first < argc) {
        find_script(argv[first], r->o[MMG_O_CHDIR].set ? r->o[MMG_O_CHDIR].value : NULL, path,
                    sizeof(path));
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
        if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
            snprintf(r->error, sizeof(r->error), "cannot read the batch script %.300s: %s", path,
                     fd < 0 ? strerror(errno) : "not a regular file");
            if (fd >= 0)
                close(fd);
            return NULL;
        }
        text = read_fd(fd, MMG_REQ_MAX_SCRIPT, 1, len);
        close(fd);
    } else if (fstat(0, &st) == 0 && S_ISREG(st.st_mode)) {
        text = malloc(MMG_REQ_MAX_SCRIPT + 1);
        ssize_t k = text ? pread(0, text, MMG_REQ_MAX_SCRIPT, 0) : -1;
        *len = k > 0 ? (size_t)k : 0;
        if (text)
            text[*len] = '\0';
    } else {
        snprintf(r->error, sizeof(r->error), "the batch script comes from standard input, "
                 "which mmguard cannot read again (give the script as a file)");
    }
    if (!text && !r->error[0])
        snprintf(r->error, sizeof(r->error), "cannot read the batch script: %s", strerror(errno));
    return text;
}

/* scontrol next to this srun (same installation; no $PATH lookup). */
static int scontrol_path(char *out, size_t n)
{
    char exe[1024];
    ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    char *slash;
    if (k <= 0)
        return -1;
    exe[k] = '\0';
    if (!(slash = strrchr(exe, '/')))
        return -1;
    *slash = '\0';
    snprintf(out, n, "%s/scontrol", exe);
    return access(out, X_OK);
}

/* Output of the child until EOF or the deadline; the child is reaped. */
static char *collect(pid_t pid, int fd, size_t *len)
{
    size_t cap = JOBINFO_MAX, n = 0;
    char *buf = malloc(cap + 1);
    struct timespec t0, t;
    int status;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (buf && n < cap) {
        struct pollfd p = { fd, POLLIN, 0 };
        long ms;
        ssize_t k;
        clock_gettime(CLOCK_MONOTONIC, &t);
        ms = SCONTROL_TIMEOUT_MS - ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000);
        if (ms <= 0 || poll(&p, 1, (int)ms) == 0)
            break;
        k = read(fd, buf + n, cap - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    kill(pid, SIGKILL); /* no-op when it has exited; a stuck one is not waited for forever */
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (buf) {
        buf[n] = '\0';
        *len = n;
    }
    return buf;
}

/* `scontrol show job --oneliner JOBID` (malloc'd), NULL when it cannot run. */
static char *job_record(const char *jobid)
{
    char path[1100], id[32];
    char *argv[] = { path, (char *)"show", (char *)"job", (char *)"--oneliner", id, NULL };
    posix_spawn_file_actions_t fa;
    int pipefd[2], rc;
    pid_t pid;
    size_t len;

    if (strspn(jobid, "0123456789_") != strlen(jobid) || strlen(jobid) >= sizeof(id) ||
        scontrol_path(path, sizeof(path)) != 0 || pipe(pipefd) != 0)
        return NULL;
    (void)fcntl(pipefd[0], F_SETFD, FD_CLOEXEC);
    (void)fcntl(pipefd[1], F_SETFD, FD_CLOEXEC);
    snprintf(id, sizeof(id), "%s", jobid);
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], 1);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    rc = posix_spawn(&pid, path, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        close(pipefd[0]);
        return NULL;
    }
    {
        char *out = collect(pid, pipefd[0], &len);
        close(pipefd[0]);
        return out;
    }
}

static int own_gpu_option(const struct mmg_reqin *r)
{
    static const mmg_opt_id ids[] = { MMG_O_GRES, MMG_O_GPUS, MMG_O_GPUS_PER_NODE,
                                      MMG_O_GPUS_PER_TASK, MMG_O_GPUS_PER_SOCKET };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
        if (r->o[ids[i]].set)
            return 1;
    return 0;
}

/* An srun step that names no GPUs gets the allocation's. */
static void step_in_allocation(struct mmg_reqin *r)
{
    char *rec;
    if (!r->o[MMG_O_JOBID].set || own_gpu_option(r))
        return;
    rec = job_record(r->o[MMG_O_JOBID].value);
    if (!rec || mmg_alloc_apply(r, rec) < 0)
        snprintf(r->error, sizeof(r->error), "cannot read the GPUs of allocation %s "
                 "(scontrol show job failed)", r->o[MMG_O_JOBID].value);
    free(rec);
}

/* sbatch: #SBATCH lines first (read where sbatch reads them), then the
 * environment, then the command line; salloc and srun: environment, command
 * line. */
static void build(struct mmg_reqin *r, mmg_tool tool, int argc, char **argv)
{
    mmg_reqin_init(r, tool);
    if (tool == MMG_TOOL_SBATCH) {
        struct mmg_reqin first;
        int idx;
        size_t len = 0;
        char *text = NULL;
        mmg_reqin_init(&first, tool);
        idx = mmg_args_apply(&first, argc, argv, MMG_FROM_ARGS, NULL);
        if (!first.o[MMG_O_WRAP].set) {
            r->o[MMG_O_CHDIR] = first.o[MMG_O_CHDIR];
            text = script_text(r, argc, argv, idx, &len);
            snprintf(r->script_name, sizeof(r->script_name), "%s",
                     idx < argc ? (strrchr(argv[idx], '/') ? strrchr(argv[idx], '/') + 1 : argv[idx])
                                : "standard input");
        }
        if (text)
            mmg_script_apply(r, text, len);
        free(text);
    }
    mmg_env_apply(r, environ);
    (void)mmg_args_apply(r, argc, argv, MMG_FROM_ARGS, NULL);
    if (tool == MMG_TOOL_SRUN && !r->error[0])
        step_in_allocation(r);
}

void mmg_gather_request(mmg_tool tool, struct mmg_request *req)
{
    struct mmg_jobreq *j = &req->job;
    char *store = NULL;
    int argc = 0;
    char **argv = read_cmdline(&store, &argc);

    memset(req, 0, sizeof(*req));
    req->status = MMG_REQ_UNKNOWN;
    if (!argv) {
        snprintf(req->why, sizeof(req->why), "cannot read the command line (/proc/self/cmdline)");
    } else {
        build(&req->in, tool, argc, argv);
        if (req->in.het)
            snprintf(req->why, sizeof(req->why), "heterogeneous jobs are not supported");
        else if (req->in.pbs_line && !req->in.o[MMG_O_IGNORE_PBS].set)
            snprintf(req->why, sizeof(req->why), "%s line %d: #PBS/#BSUB directives, which sbatch "
                     "translates, are not read by mmguard (use #SBATCH)", req->in.script_name,
                     req->in.pbs_line);
        else if (mmg_reqin_to_job(&req->in, j) != 0)
            snprintf(req->why, sizeof(req->why), "%s", req->in.error);
        else
            req->status = mmg_jobreq_eval(j, &req->gpus, req->why, sizeof(req->why));
        /* the host memory request, read with the same options */
        req->mem_ok = mmg_reqin_to_mem(&req->in, &req->mem, req->mem_why,
                                       sizeof(req->mem_why)) == 0;
    }
    if (req->status == MMG_REQ_OK)
        mmg_request_describe(&req->in, &req->gpus, req->text, sizeof(req->text));
    free(argv);
    free(store);
}
