/* log.c - the decision log: one JSON object per line (json-c) for every
 * decision of a --mm-model job, appended to the site's log file by the
 * submitting user's process (never through a symlink, never blocking on a
 * FIFO, whole lines only), and optionally to syslog. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "plugin.h"

static json_object *u64(uint64_t v)
{
    return json_object_new_int64(v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

static json_object *factors_json(const mm_factors *f)
{
    json_object *o = json_object_new_object();
    uint64_t v[MM_NFACTORS];
    mm_factor_values(f, v);
    for (int i = 0; i < MM_NFACTORS; i++)
        json_object_object_add(o, mm_factor_names[i], u64(v[i]));
    return o;
}

static json_object *str_or_null(const char *s)
{
    return s ? json_object_new_string(s) : NULL;
}

/* The job name if the command line or environment names one. */
static const char *job_name(const char *source, char *buf, size_t n)
{
    const char *env = !strcmp(source, "sbatch") ? "SBATCH_JOB_NAME"
                    : !strcmp(source, "salloc") ? "SALLOC_JOB_NAME" : "SLURM_JOB_NAME";
    char cmd[4096];
    ssize_t len = 0;
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        len = read(fd, cmd, sizeof(cmd) - 1);
        close(fd);
    }
    if (len > 0) {
        const char *prev = NULL;
        cmd[len] = '\0';
        for (const char *a = cmd; a < cmd + len; a += strlen(a) + 1) {
            if (prev && (!strcmp(prev, "-J") || !strcmp(prev, "--job-name"))) {
                snprintf(buf, n, "%s", a);
                return buf;
            }
            if (!strncmp(a, "--job-name=", 11)) {
                snprintf(buf, n, "%s", a + 11);
                return buf;
            }
            if (!strncmp(a, "-J", 2) && a[2]) {
                snprintf(buf, n, "%s", a + 2);
                return buf;
            }
            prev = a;
        }
    }
    return getenv(env);
}

/* time, user, uid, job name, source */
static void add_who(json_object *o, const struct mmg_check *chk)
{
    char tbuf[32], name[256], pwbuf[1024];
    struct tm tm;
    time_t now = time(NULL);
    uid_t uid = getuid();
    struct passwd pw, *pwp = NULL;

    gmtime_r(&now, &tm);
    strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_object_object_add(o, "time", json_object_new_string(tbuf));
    if (getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &pwp) != 0)
        pwp = NULL;
    json_object_object_add(o, "user", str_or_null(pwp ? pw.pw_name : NULL));
    json_object_object_add(o, "uid", json_object_new_int64((int64_t)uid));
    json_object_object_add(o, "job_name", str_or_null(job_name(chk->source, name, sizeof(name))));
    json_object_object_add(o, "source", json_object_new_string(chk->source));
}

/* action, margin, GPU and the request as derived */
static void add_site(json_object *o, const struct mmg_check *chk)
{
    char margin[64];
    int req_ok = chk->have_req && chk->req.status == MMG_REQ_OK;
    if (chk->cfg_ok) {
        json_object *m = json_object_new_object();
        json_object_object_add(o, "action", json_object_new_string(mmg_action_name(chk->cfg.action)));
        json_object_object_add(m, "percent", json_object_new_double(chk->cfg.margin.percent));
        json_object_object_add(m, "bytes", u64(chk->cfg.margin.bytes));
        json_object_object_add(m, "reserve_bytes", u64(chk->cfg.reserve));
        mmg_config_margin_str(&chk->cfg, margin, sizeof(margin));
        json_object_object_add(m, "text", json_object_new_string(margin));
        json_object_object_add(o, "margin", m);
    }
    /* unknown type or no config: what was asked for */
    json_object_object_add(o, "gpu", str_or_null(chk->gpu ? chk->gpu->name : mmg_opts.gpu));
    if (chk->gpu)
        json_object_object_add(o, "gpu_mem_bytes", u64(chk->gpu->bytes));
    json_object_object_add(o, "request", str_or_null(req_ok ? chk->req.text : NULL));
    if (req_ok)
        json_object_object_add(o, "nodes", json_object_new_int64(chk->req.gpus.nodes_min));
}

static void add_prediction(json_object *o, const struct mmg_check *chk)
{
    const mm_prediction *p = &chk->pred;
    json_object *mods = json_object_new_array();
    json_object_object_add(o, "usable_bytes", u64(chk->usable));
    json_object_object_add(o, "data_parallel",
                           json_object_new_int64(chk->dp / (chk->tp ? chk->tp : 1)));
    if (chk->tp > 1)
        json_object_object_add(o, "tensor_parallel", json_object_new_int64(chk->tp));
    /* GPUs the job trains on (what `mmguard report` multiplies by time) */
    json_object_object_add(o, "gpus", json_object_new_int64(chk->dp));
    json_object_object_add(o, "spec_data_parallel", json_object_new_int64(chk->spec_dp));
    json_object_object_add(o, "micro_batch_size", json_object_new_int64(p->micro_batch_size));
    json_object_object_add(o, "peak_bytes", u64(chk->peak));
    if (chk->have_verdict) {
        const mm_verdict *v = &chk->verdict;
        static const char *const kinds[] = { "fits", "flushes", "oom" };
        json_object_object_add(o, "verdict", json_object_new_string(kinds[v->kind]));
        json_object_object_add(o, "alloc_retries_per_step", u64(v->retries_step));
        /* the allocator's reserved peak at the card's capacity plus what is
         * outside it: never above the card */
        struct mmg_card c;
        mmg_card_from_verdict(&c, "", v);
        json_object_object_add(o, "card_peak_bytes", u64(c.peak));
        json_object_object_add(o, "verdict_data_parallel", json_object_new_int64(v->n));
        json_object_object_add(o, "flush", json_object_new_string(mmg_flush_name(chk->cfg.flush)));
    }
    json_object_object_add(o, "allocated_peak_bytes", u64(chk->alloc_peak));
    json_object_object_add(o, "peak_phase", json_object_new_string(mm_phase_name(p->peak_phase)));
    json_object_object_add(o, "peak_event", json_object_new_string(p->peak_event));
    json_object_object_add(o, "factors", factors_json(&p->factors));
    for (size_t i = 0; i < p->n_modules && p->modules; i++) {
        json_object *m = json_object_new_object();
        json_object_object_add(m, "name", json_object_new_string(p->modules[i].name));
        json_object_object_add(m, "type", json_object_new_string(p->modules[i].type));
        json_object_object_add(m, "factors", factors_json(&p->modules[i].factors));
        json_object_array_add(mods, m);
    }
    json_object_object_add(o, "modules", mods);
    if (chk->have_fit)
        json_object_object_add(o, "max_micro_batch", json_object_new_int64(chk->fit.max_micro_batch));
}

/* "host": the host memory check (hostmem.c), when it ran. */
static void add_host(json_object *o, const struct mmg_check *chk)
{
    static const char *const results[] = { "none", "fits", "misfit", "unchecked", "unknown" };
    const struct mmg_hostcheck *h = &chk->host;
    json_object *x;
    if (h->result == MMG_HOST_NONE || !(x = json_object_new_object()))
        return;
    json_object_object_add(x, "result", json_object_new_string(results[h->result]));
    json_object_object_add(x, "peak_bytes_per_process", u64(h->per_rank));
    json_object_object_add(x, "overhead_bytes", u64(h->overhead));
    json_object_object_add(x, "processes", json_object_new_int64(h->node.ranks));
    json_object_object_add(x, "need_bytes", u64(h->need));
    json_object_object_add(x, "have_bytes", h->result == MMG_HOST_FITS ||
                           h->result == MMG_HOST_MISFIT ? u64(h->node.have_bytes) : NULL);
    json_object_object_add(x, "request", str_or_null(h->request[0] ? h->request : NULL));
    json_object_object_add(x, "ask", str_or_null(h->ask[0] ? h->ask : NULL));
    json_object_object_add(o, "host", x);
}

char *mmg_decision_json(const struct mmg_check *chk)
{
    json_object *o = json_object_new_object();
    char *out;
    if (!o)
        return NULL;
    add_who(o, chk);
    json_object_object_add(o, "decision", json_object_new_string(mmg_decision_name(chk->decision)));
    json_object_object_add(o, "reason", json_object_new_string(chk->reason));
    json_object_object_add(o, "spec", json_object_new_string(chk->spec_path));
    json_object_object_add(o, "spec_sha256", str_or_null(chk->spec ? mm_spec_digest(chk->spec) : NULL));
    json_object_object_add(o, "model", str_or_null(chk->spec ? mm_spec_name(chk->spec) : NULL));
    add_site(o, chk);
    if (chk->have_pred)
        add_prediction(o, chk);
    add_host(o, chk);
    out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return out;
}

/* Append one record (line + newline) to fd, opened O_APPEND.  Writers take an
 * exclusive flock() for at most ~1 s (a user holding the lock cannot stall
 * every sbatch) so that a short write -- disk or quota full -- can be undone:
 * the log keeps only complete lines.  0 ok, else an errno value. */
static int append_record(int fd, const char *rec, size_t len)
{
    struct stat st;
    off_t start = -1;
    size_t done = 0;
    int locked = 0, err = 0;

    for (int i = 0; i < 100; i++) {
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            locked = 1;
            break;
        }
        if (errno != EWOULDBLOCK && errno != EINTR)
            break; /* no locking here (e.g. some network file systems) */
        (void)nanosleep(&(struct timespec){ .tv_sec = 0, .tv_nsec = 10 * 1000 * 1000 }, NULL);
    }
    if (locked && fstat(fd, &st) == 0)
        start = st.st_size;
    while (done < len) {
        ssize_t n = write(fd, rec + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            err = n < 0 ? errno : ENOSPC;
            break;
        }
        done += (size_t)n;
        /* only continue a partial record while no other writer can interleave */
        if (done < len && !locked) {
            err = ENOSPC;
            break;
        }
    }
    /* drop our partial line */
    if (err && done > 0 && start >= 0 && ftruncate(fd, start) != 0)
        slurm_debug(MMG_PREFIX "cannot remove a partial log record: %s", strerror(errno));
    if (locked)
        (void)flock(fd, LOCK_UN);
    return err;
}

void mmg_log_decision(const struct mmg_check *chk)
{
    static int reported;
    char *json;
    size_t len;

    if (!chk->cfg_ok || (!chk->cfg.log_path[0] && !chk->cfg.syslog))
        return;
    json = mmg_decision_json(chk);
    if (!json) {
        if (!reported++)
            slurm_error(MMG_PREFIX "log: out of memory building the decision record "
                        "(decision %s stands)", mmg_decision_name(chk->decision));
        return;
    }
    if (chk->cfg.syslog) {
        openlog("mmguard", LOG_PID, LOG_USER);
        syslog(chk->decision == MMG_ACCEPT ? LOG_INFO : LOG_NOTICE, "%s", json);
        closelog();
    }
    if (chk->cfg.log_path[0]) {
        int fd, saved = 0;
        len = strlen(json);
        json[len] = '\n'; /* overwrite the NUL: the record is line + newline */
        /* O_NOFOLLOW: never write through a symlink planted in the log's place;
         * O_NONBLOCK: never hang on a FIFO (refused below) */
        fd = open(chk->cfg.log_path,
                  O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
                  0644);
        if (fd >= 0) {
            struct stat st;
            if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
                saved = EINVAL;
            else
                saved = append_record(fd, json, len + 1);
            close(fd);
        } else {
            saved = errno;
        }
        if (saved && !reported++)
            slurm_error(MMG_PREFIX "log=%s: cannot append the decision record: %s "
                        "(decision %s stands)", chk->cfg.log_path,
                        saved == EINVAL ? "not a regular file"
                        : saved == ELOOP ? "it is a symbolic link (not followed)"
                        : strerror(saved),
                        mmg_decision_name(chk->decision));
    }
    free(json);
}
