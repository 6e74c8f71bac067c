/* log.c - the decision log: one JSON object per line (as json-c writes it) for every
 * decision of a --mm-model job, appended to the site's log file by the
 * submitting user's process (never through a symlink, never blocking on a
 * FIFO, whole lines only), and optionally to syslog. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
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

#include "plugin.h"

/* ---- the record's JSON, written as json-c's json_object_to_json_string_ext(
 * JSON_C_TO_STRING_PLAIN) wrote it, byte for byte: members in the order
 * added, no spaces, strings escaped as json_escape_str does ('/' too),
 * doubles "%.17g" with ".0" when that reads as an integer.  Building the
 * json-c tree and printing it was 0.19 M instructions of each sbatch. */

struct jw {
    char *buf;
    size_t len, cap;
    int fresh;  /* nothing yet in the innermost object or array: no comma */
    int err;
};

static void jw_raw(struct jw *w, const char *s, size_t n)
{
    if (w->err)
        return;
    if (w->len + n + 1 > w->cap) {
        size_t cap = w->cap ? w->cap : 8192;
        char *b;
        while (w->len + n + 1 > cap)
            cap *= 2;
        if (!(b = realloc(w->buf, cap))) {
            w->err = 1;
            return;
        }
        w->buf = b;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, s, n);
    w->len += n;
    w->buf[w->len] = '\0';
}

/* a value (or a key) begins: the comma before all but the first */
static void jw_sep(struct jw *w)
{
    if (!w->fresh)
        jw_raw(w, ",", 1);
    w->fresh = 0;
}

static void jw_quoted(struct jw *w, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    const char *run = s;
    jw_raw(w, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= ' ' && c != '"' && c != '\\' && c != '/')
            continue;
        const char *esc = c == '\b' ? "\\b" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\f' ? "\\f" : c == '"' ? "\\\""
                        : c == '\\' ? "\\\\" : c == '/' ? "\\/" : NULL;
        char u[6] = { '\\', 'u', '0', '0', hex[c >> 4], hex[c & 15] };
        jw_raw(w, run, (size_t)(s - run));
        jw_raw(w, esc ? esc : u, esc ? 2 : 6);
        run = s + 1;
    }
    jw_raw(w, run, (size_t)(s - run));
    jw_raw(w, "\"", 1);
}

static void jw_key(struct jw *w, const char *k)
{
    jw_sep(w);
    jw_quoted(w, k);
    jw_raw(w, ":", 1);
    w->fresh = 1; /* its value follows without a comma */
}

static void jw_open(struct jw *w, const char *key, char c)
{
    if (key)
        jw_key(w, key);
    jw_sep(w);
    jw_raw(w, &c, 1);
    w->fresh = 1;
}

static void jw_close(struct jw *w, char c)
{
    jw_raw(w, &c, 1);
    w->fresh = 0;
}

/* "key": "string", or null for NULL */
static void jw_str(struct jw *w, const char *key, const char *v)
{
    jw_key(w, key);
    jw_sep(w);
    if (v)
        jw_quoted(w, v);
    else
        jw_raw(w, "null", 4);
}

/* "%" PRId64, digits from the right (a snprintf per number was most of it) */
static void jw_i64(struct jw *w, const char *key, int64_t v)
{
    char b[24], *p = b + sizeof(b);
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    do
        *--p = (char)('0' + u % 10);
    while (u /= 10);
    if (v < 0)
        *--p = '-';
    jw_key(w, key);
    jw_sep(w);
    jw_raw(w, p, (size_t)(b + sizeof(b) - p));
}

/* unsigned counts as json-c's int64 held them: above INT64_MAX clamped */
static void jw_u64(struct jw *w, const char *key, uint64_t v)
{
    jw_i64(w, key, v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

/* json_object_double_to_json_string_format with the default "%.17g" */
static void jw_dbl(struct jw *w, const char *key, double v)
{
    char b[128];
    int n = isnan(v) ? snprintf(b, sizeof(b), "NaN")
          : isinf(v) ? snprintf(b, sizeof(b), v > 0 ? "Infinity" : "-Infinity")
          : snprintf(b, sizeof(b), "%.17g", v);
    char *comma = strchr(b, ',');
    if (comma)
        *comma = '.';
    if (!isnan(v) && !isinf(v) && n < (int)sizeof(b) - 2 && !comma && !strchr(b, '.') &&
        !strchr(b, 'e') && (isdigit((unsigned char)b[0]) ||
                            (n > 1 && b[0] == '-' && isdigit((unsigned char)b[1])))) {
        memcpy(b + n, ".0", 3);
        n += 2;
    }
    jw_key(w, key);
    jw_sep(w);
    jw_raw(w, b, (size_t)n);
}

static void factors_json(struct jw *w, const mm_factors *f)
{
    uint64_t v[MM_NFACTORS];
    mm_factor_values(f, v);
    jw_open(w, "factors", '{');
    for (int i = 0; i < MM_NFACTORS; i++)
        jw_u64(w, mm_factor_names[i], v[i]);
    jw_close(w, '}');
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
static void add_who(struct jw *w, const struct mmg_check *chk)
{
    char tbuf[32], name[256], pwbuf[1024];
    struct tm tm;
    time_t now = time(NULL);
    uid_t uid = getuid();
    struct passwd pw, *pwp = NULL;

    gmtime_r(&now, &tm);
    strftime(tbuf, sizeof(tbuf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    jw_str(w, "time", tbuf);
    if (getpwuid_r(uid, &pw, pwbuf, sizeof(pwbuf), &pwp) != 0)
        pwp = NULL;
    jw_str(w, "user", pwp ? pw.pw_name : NULL);
    jw_i64(w, "uid", (int64_t)uid);
    jw_str(w, "job_name", job_name(chk->source, name, sizeof(name)));
    jw_str(w, "source", chk->source);
}

/* action, margin, GPU and the request as derived */
static void add_site(struct jw *w, const struct mmg_check *chk)
{
    char margin[64];
    int req_ok = chk->have_req && chk->req.status == MMG_REQ_OK;
    if (chk->cfg_ok) {
        jw_str(w, "action", mmg_action_name(chk->cfg.action));
        jw_open(w, "margin", '{');
        jw_dbl(w, "percent", chk->cfg.margin.percent);
        jw_u64(w, "bytes", chk->cfg.margin.bytes);
        jw_u64(w, "reserve_bytes", chk->cfg.reserve);
        mmg_config_margin_str(&chk->cfg, margin, sizeof(margin));
        jw_str(w, "text", margin);
        jw_close(w, '}');
    }
    /* unknown type or no config: what was asked for */
    jw_str(w, "gpu", chk->gpu ? chk->gpu->name : mmg_opts.gpu);
    if (chk->gpu)
        jw_u64(w, "gpu_mem_bytes", chk->gpu->bytes);
    jw_str(w, "request", req_ok ? chk->req.text : NULL);
    if (req_ok)
        jw_i64(w, "nodes", chk->req.gpus.nodes_min);
}

/* the capacity-aware verdict on the judged card */
static void add_verdict(struct jw *w, const struct mmg_check *chk)
{
    static const char *const kinds[] = { "fits", "flushes", "oom" };
    const mm_verdict *v = &chk->verdict;
    struct mmg_card c;
    jw_str(w, "verdict", kinds[v->kind]);
    jw_u64(w, "alloc_retries_per_step", v->retries_step);
    /* the allocator's reserved peak at the card's capacity plus what is
     * outside it: never above the card */
    mmg_card_from_verdict(&c, "", v);
    jw_u64(w, "card_peak_bytes", c.peak);
    jw_i64(w, "verdict_data_parallel", v->n);
    jw_str(w, "flush", mmg_flush_name(chk->cfg.flush));
}

static void add_prediction(struct jw *w, const struct mmg_check *chk)
{
    const mm_prediction *p = &chk->pred;
    jw_u64(w, "usable_bytes", chk->usable);
    jw_i64(w, "data_parallel", chk->dp / (chk->tp ? chk->tp : 1));
    if (chk->tp > 1)
        jw_i64(w, "tensor_parallel", chk->tp);
    /* GPUs the job trains on (what `mmguard report` multiplies by time) */
    jw_i64(w, "gpus", chk->dp);
    jw_i64(w, "spec_data_parallel", chk->spec_dp);
    jw_i64(w, "micro_batch_size", p->micro_batch_size);
    jw_u64(w, "peak_bytes", chk->peak);
    if (chk->have_verdict)
        add_verdict(w, chk);
    jw_u64(w, "allocated_peak_bytes", chk->alloc_peak);
    jw_str(w, "peak_phase", mm_phase_name(p->peak_phase));
    jw_str(w, "peak_event", p->peak_event);
    factors_json(w, &p->factors);
    jw_open(w, "modules", '[');
    for (size_t i = 0; i < p->n_modules && p->modules; i++) {
        jw_open(w, NULL, '{');
        jw_str(w, "name", p->modules[i].name);
        jw_str(w, "type", p->modules[i].type);
        factors_json(w, &p->modules[i].factors);
        jw_close(w, '}');
    }
    jw_close(w, ']');
    if (chk->have_fit)
        jw_i64(w, "max_micro_batch", chk->fit.max_micro_batch);
}

/* "host": the host memory check (hostmem.c), when it ran. */
static void add_host(struct jw *w, const struct mmg_check *chk)
{
    static const char *const results[] = { "none", "fits", "misfit", "unchecked", "unknown" };
    const struct mmg_hostcheck *h = &chk->host;
    if (h->result == MMG_HOST_NONE)
        return;
    jw_open(w, "host", '{');
    jw_str(w, "result", results[h->result]);
    jw_u64(w, "peak_bytes_per_process", h->per_rank);
    jw_u64(w, "overhead_bytes", h->overhead);
    jw_i64(w, "processes", h->node.ranks);
    jw_u64(w, "need_bytes", h->need);
    if (h->result == MMG_HOST_FITS || h->result == MMG_HOST_MISFIT)
        jw_u64(w, "have_bytes", h->node.have_bytes);
    else
        jw_str(w, "have_bytes", NULL);
    jw_str(w, "request", h->request[0] ? h->request : NULL);
    jw_str(w, "ask", h->ask[0] ? h->ask : NULL);
    jw_close(w, '}');
}

char *mmg_decision_json(const struct mmg_check *chk)
{
    struct jw w = { NULL, 0, 0, 1, 0 };
    jw_open(&w, NULL, '{');
    add_who(&w, chk);
    jw_str(&w, "decision", mmg_decision_name(chk->decision));
    jw_str(&w, "reason", chk->reason);
    jw_str(&w, "spec", chk->spec_path);
    jw_str(&w, "spec_sha256", chk->spec ? mm_spec_digest(chk->spec) : NULL);
    jw_str(&w, "model", chk->spec ? mm_spec_name(chk->spec) : NULL);
    add_site(&w, chk);
    if (chk->have_pred)
        add_prediction(&w, chk);
    add_host(&w, chk);
    jw_close(&w, '}');
    if (w.err) {
        free(w.buf);
        return NULL;
    }
    return w.buf;
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
