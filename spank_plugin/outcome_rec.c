/* outcome_rec.c - read the job's record file (written by the user, read by
 * root) and build the outcome line of the decision log.  See outcome_rec.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <json-c/json.h>

#include "outcome_rec.h"

#define MAX_BYTES (UINT64_C(1) << 60)   /* 1 EiB: no card or host has more */
#define MAX_COUNT (UINT64_C(1) << 40)

static int fail(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(char *err, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, n, fmt, ap);
    va_end(ap);
    return -1;
}

static const char *const statuses[] = { "running", "done", "oom", "error", NULL };
static const char *const phases[] = { "setup", "forward", "backward", "optimizer", "step", "exit", NULL };
static const char *const kinds[] = { "cuda", "host", NULL };

typedef enum { K_U64, K_BYTES, K_STR, K_ENUM, K_BOOL, K_OOM, K_ABSENT, K_VERSION } kind;

struct key {
    const char *name;
    kind k;
    int required, nullable;
    size_t off, has_off, size;      /* has_off: offset of the has_ flag, or 0 */
    const char *const *allowed;     /* K_ENUM */
    int cuda_part;                  /* one of the four CUDA counters */
};

#define F(m) offsetof(struct mmg_outcome_rec, m)
#define Z(m) sizeof(((struct mmg_outcome_rec *)0)->m)
static const struct key keys[] = {
    { "v", K_VERSION, 1, 0, 0, 0, 0, NULL, 0 },
    { "status", K_ENUM, 1, 0, F(status), 0, Z(status), statuses, 0 },
    { "phase", K_ENUM, 0, 1, F(phase), 0, Z(phase), phases, 0 },
    { "time", K_STR, 0, 1, F(time), 0, Z(time), NULL, 0 },
    { "steps", K_U64, 1, 0, F(steps), 0, 0, NULL, 0 },
    { "rank", K_U64, 0, 0, F(rank), 0, 0, NULL, 0 },
    { "world_size", K_U64, 0, 0, F(world_size), 0, 0, NULL, 0 },
    { "micro_batch", K_U64, 0, 1, F(micro_batch), F(has_micro_batch), 0, NULL, 0 },
    { "max_seq_len", K_U64, 0, 1, F(max_seq_len), F(has_max_seq_len), 0, NULL, 0 },
    { "host_peak_rss", K_BYTES, 1, 0, F(host_peak_rss), 0, 0, NULL, 0 },
    { "cuda", K_BOOL, 1, 0, F(cuda), 0, 0, NULL, 0 },
    { "device", K_STR, 0, 1, F(device), 0, Z(device), NULL, 0 },
    { "max_allocated", K_BYTES, 0, 1, F(max_allocated), F(has_cuda), 0, NULL, 1 },
    { "max_reserved", K_BYTES, 0, 1, F(max_reserved), 0, 0, NULL, 1 },
    { "alloc_retries", K_U64, 0, 1, F(alloc_retries), 0, 0, NULL, 1 },
    { "ooms", K_U64, 0, 1, F(ooms), 0, 0, NULL, 1 },
    { "nvml_peak_used", K_BYTES, 0, 1, F(nvml_peak_used), F(has_nvml_peak), 0, NULL, 0 },
    { "nvml_total", K_BYTES, 0, 1, F(nvml_total), F(has_nvml_total), 0, NULL, 0 },
    { "oom", K_OOM, 0, 1, 0, F(has_oom), 0, NULL, 0 },
    { "absent", K_ABSENT, 0, 0, 0, 0, 0, NULL, 0 },
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

/* A string value: printable ASCII only (a crafted record cannot put control
 * bytes into root's log or an admin's terminal), shorter than n. */
static int get_str(json_object *v, char *out, size_t n, const char *name, char *err, size_t errlen)
{
    const char *s;
    size_t len;
    if (!json_object_is_type(v, json_type_string))
        return fail(err, errlen, "%s: not a string", name);
    s = json_object_get_string(v);
    len = (size_t)json_object_get_string_len(v);
    if (len >= n)
        return fail(err, errlen, "%s: longer than %zu bytes", name, n - 1);
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return fail(err, errlen, "%s: not printable ASCII", name);
    memcpy(out, s, len);
    out[len] = '\0';
    return 0;
}

static int get_enum(json_object *v, const char *const *allowed, char *out, size_t n,
                    const char *name, char *err, size_t errlen)
{
    if (get_str(v, out, n, name, err, errlen) != 0)
        return -1;
    for (size_t i = 0; allowed[i]; i++)
        if (!strcmp(out, allowed[i]))
            return 0;
    return fail(err, errlen, "%s: unknown value '%s'", name, out);
}

static int get_u64(json_object *v, uint64_t max, uint64_t *out, const char *name,
                   char *err, size_t errlen)
{
    int64_t x;
    if (!json_object_is_type(v, json_type_int))
        return fail(err, errlen, "%s: not an integer", name);
    errno = 0;
    x = json_object_get_int64(v);
    if (x < 0 || errno != 0 || (uint64_t)x > max)
        return fail(err, errlen, "%s: out of range", name);
    *out = (uint64_t)x;
    return 0;
}

static int get_oom(json_object *v, struct mmg_outcome_rec *r, char *err, size_t errlen)
{
    json_object *ph, *kd, *msg;
    if (!json_object_is_type(v, json_type_object) || json_object_object_length(v) != 3 ||
        !json_object_object_get_ex(v, "phase", &ph) || !json_object_object_get_ex(v, "kind", &kd) ||
        !json_object_object_get_ex(v, "message", &msg))
        return fail(err, errlen, "oom: not an object of phase, kind and message");
    if (get_enum(ph, phases, r->oom_phase, sizeof r->oom_phase, "oom.phase", err, errlen) ||
        get_enum(kd, kinds, r->oom_kind, sizeof r->oom_kind, "oom.kind", err, errlen) ||
        get_str(msg, r->oom_message, sizeof r->oom_message, "oom.message", err, errlen))
        return -1;
    return 0;
}

static int get_absent(json_object *v, struct mmg_outcome_rec *r, char *err, size_t errlen)
{
    size_t n;
    if (!json_object_is_type(v, json_type_array))
        return fail(err, errlen, "absent: not an array");
    n = json_object_array_length(v);
    if (n > MMG_OUTCOME_ABSENT)
        return fail(err, errlen, "absent: more than %d entries", MMG_OUTCOME_ABSENT);
    for (size_t i = 0; i < n; i++)
        if (get_str(json_object_array_get_idx(v, i), r->absent[i], sizeof r->absent[i],
                    "absent[]", err, errlen))
            return -1;
    r->n_absent = n;
    return 0;
}

/* One key's value into r. */
static int get_value(const struct key *k, json_object *v, struct mmg_outcome_rec *r,
                     char *err, size_t errlen)
{
    char *base = (char *)r;
    uint64_t ver;
    if (!v && k->nullable)
        return 0;
    if (!v)
        return fail(err, errlen, "%s: null", k->name);
    if (k->has_off)
        *(int *)(base + k->has_off) = 1;
    switch (k->k) {
    case K_VERSION:
        if (get_u64(v, 1000, &ver, k->name, err, errlen))
            return -1;
        return ver == 1 ? 0 : fail(err, errlen, "v: version %" PRIu64 " is not 1", ver);
    case K_U64: return get_u64(v, MAX_COUNT, (uint64_t *)(base + k->off), k->name, err, errlen);
    case K_BYTES: return get_u64(v, MAX_BYTES, (uint64_t *)(base + k->off), k->name, err, errlen);
    case K_STR: return get_str(v, base + k->off, k->size, k->name, err, errlen);
    case K_ENUM: return get_enum(v, k->allowed, base + k->off, k->size, k->name, err, errlen);
    case K_BOOL:
        if (!json_object_is_type(v, json_type_boolean))
            return fail(err, errlen, "%s: not true or false", k->name);
        *(int *)(base + k->off) = json_object_get_boolean(v);
        return 0;
    case K_OOM: return get_oom(v, r, err, errlen);
    default: return get_absent(v, r, err, errlen);
    }
}

static const struct key *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (!strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

/* Every key known, every required key present; the CUDA counters all or none. */
static int check_object(json_object *o, struct mmg_outcome_rec *r, char *err, size_t errlen)
{
    json_object *v;
    int cuda_parts = 0;
    json_object_object_foreach(o, name, val) {
        (void)val;
        if (!find_key(name))
            return fail(err, errlen, "unknown key '%.40s'", name);
    }
    for (size_t i = 0; i < NKEYS; i++) {
        int have = json_object_object_get_ex(o, keys[i].name, &v);
        if (!have && keys[i].required)
            return fail(err, errlen, "%s: missing", keys[i].name);
        if (have && get_value(&keys[i], v, r, err, errlen) != 0)
            return -1;
        if (keys[i].cuda_part && have && v)
            cuda_parts++;
    }
    if (cuda_parts != 0 && cuda_parts != 4)
        return fail(err, errlen, "max_allocated, max_reserved, alloc_retries, ooms: all or none");
    r->has_cuda = cuda_parts == 4;
    return 0;
}

int mmg_outcome_parse(const char *text, size_t len, struct mmg_outcome_rec *r,
                      char *err, size_t errlen)
{
    json_tokener *tok;
    json_object *o;
    int rc;
    memset(r, 0, sizeof(*r));
    if (len > MMG_OUTCOME_MAX)
        return fail(err, errlen, "longer than %d bytes", MMG_OUTCOME_MAX);
    if (memchr(text, '\0', len))
        return fail(err, errlen, "contains a NUL byte");
    tok = json_tokener_new_ex(4);
    if (!tok)
        return fail(err, errlen, "out of memory");
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    o = json_tokener_parse_ex(tok, text, (int)len);
    if (!o || json_tokener_get_error(tok) != json_tokener_success) {
        rc = fail(err, errlen, "not JSON: %s", o ? "trailing text"
                  : json_tokener_error_desc(json_tokener_get_error(tok)));
    } else if (json_tokener_get_parse_end(tok) < len &&
               strspn(text + json_tokener_get_parse_end(tok), " \t\r\n") !=
                   len - json_tokener_get_parse_end(tok)) {
        rc = fail(err, errlen, "not JSON: trailing text");
    } else if (!json_object_is_type(o, json_type_object)) {
        rc = fail(err, errlen, "not a JSON object");
    } else {
        rc = check_object(o, r, err, errlen);
    }
    json_object_put(o);
    json_tokener_free(tok);
    return rc;
}

/* ---- the file ------------------------------------------------------------------- */

static int check_stat(const struct stat *st, uid_t owner, char *err, size_t errlen)
{
    if (!S_ISREG(st->st_mode))
        return fail(err, errlen, "not a regular file");
    if (st->st_uid != owner)
        return fail(err, errlen, "owned by uid %u, not the job's user %u",
                    (unsigned)st->st_uid, (unsigned)owner);
    if (st->st_nlink != 1)
        return fail(err, errlen, "has %u hard links", (unsigned)st->st_nlink);
    if (st->st_size > MMG_OUTCOME_MAX)
        return fail(err, errlen, "larger than %d bytes", MMG_OUTCOME_MAX);
    return 0;
}

static int read_all(int fd, char *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    size_t got = 0;
    for (;;) {
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail(err, errlen, "cannot read: %s", strerror(errno));
        if (n == 0)
            break;
        got += (size_t)n;
        if (got >= cap - 1 || got > MMG_OUTCOME_MAX)
            return fail(err, errlen, "larger than %d bytes", MMG_OUTCOME_MAX);
    }
    buf[got] = '\0';
    *len = got;
    return 0;
}

int mmg_outcome_read(const char *path, uid_t owner, char *buf, size_t cap, size_t *len,
                     char *err, size_t errlen)
{
    struct stat before, after;
    int fd, rc;
    *len = 0;
    if (cap < 2)
        return fail(err, errlen, "no buffer");
    buf[0] = '\0';
    /* lstat first: never open (as root) what is not a plain file of the user's */
    if (lstat(path, &before) != 0)
        return errno == ENOENT ? 1 : fail(err, errlen, "cannot stat: %s", strerror(errno));
    if (S_ISLNK(before.st_mode))
        return fail(err, errlen, "is a symbolic link (not followed)");
    if (check_stat(&before, owner, err, errlen) != 0)
        return -1;
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 1 : fail(err, errlen, "cannot open: %s", errno == ELOOP
                                          ? "a symbolic link (not followed)" : strerror(errno));
    if (fstat(fd, &after) != 0)
        rc = fail(err, errlen, "cannot stat: %s", strerror(errno));
    else if (after.st_dev != before.st_dev || after.st_ino != before.st_ino)
        rc = fail(err, errlen, "replaced while being opened");
    else if ((rc = check_stat(&after, owner, err, errlen)) == 0)
        rc = read_all(fd, buf, cap, len, err, errlen);
    close(fd);
    return rc;
}

int mmg_outcome_path(const char *tmpdir, uint32_t job_id, const char *step, char *out, size_t n)
{
    int w;
    if (!tmpdir || !tmpdir[0])
        tmpdir = "/tmp";
    if (tmpdir[0] != '/' || strlen(tmpdir) > 512)
        return -1;
    w = snprintf(out, n, "%s%smmguard-record.%" PRIu32 ".%s.json", tmpdir,
                 tmpdir[strlen(tmpdir) - 1] == '/' ? "" : "/", job_id, step);
    return w < 0 || (size_t)w >= n ? -1 : 0;
}

/* ---- the outcome line -------------------------------------------------------------- */

static json_object *u64(uint64_t v)
{
    return json_object_new_int64(v > INT64_MAX ? INT64_MAX : (int64_t)v);
}

static json_object *opt_u64(int have, uint64_t v)
{
    return have ? u64(v) : NULL;
}

static json_object *opt_str(const char *s)
{
    return s && s[0] ? json_object_new_string(s) : NULL;
}

/* The measured values: the record's fields, null where absent. */
static json_object *measured_json(const struct mmg_outcome_rec *r)
{
    json_object *m = json_object_new_object(), *ab = json_object_new_array();
    json_object_object_add(m, "status", json_object_new_string(r->status));
    json_object_object_add(m, "phase", opt_str(r->phase));
    json_object_object_add(m, "steps", u64(r->steps));
    json_object_object_add(m, "world_size", u64(r->world_size));
    json_object_object_add(m, "micro_batch", opt_u64(r->has_micro_batch, r->micro_batch));
    json_object_object_add(m, "max_seq_len", opt_u64(r->has_max_seq_len, r->max_seq_len));
    json_object_object_add(m, "host_peak_rss_bytes", u64(r->host_peak_rss));
    json_object_object_add(m, "cuda", json_object_new_boolean(r->cuda));
    json_object_object_add(m, "device", opt_str(r->device));
    json_object_object_add(m, "max_allocated_bytes", opt_u64(r->has_cuda, r->max_allocated));
    json_object_object_add(m, "max_reserved_bytes", opt_u64(r->has_cuda, r->max_reserved));
    json_object_object_add(m, "num_alloc_retries", opt_u64(r->has_cuda, r->alloc_retries));
    json_object_object_add(m, "num_ooms", opt_u64(r->has_cuda, r->ooms));
    json_object_object_add(m, "nvml_peak_used_bytes", opt_u64(r->has_nvml_peak, r->nvml_peak_used));
    json_object_object_add(m, "nvml_total_bytes", opt_u64(r->has_nvml_total, r->nvml_total));
    if (r->has_oom) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "phase", json_object_new_string(r->oom_phase));
        json_object_object_add(o, "kind", json_object_new_string(r->oom_kind));
        json_object_object_add(o, "message", json_object_new_string(r->oom_message));
        json_object_object_add(m, "oom", o);
    } else {
        json_object_object_add(m, "oom", NULL);
    }
    for (size_t i = 0; i < r->n_absent; i++)
        json_object_array_add(ab, json_object_new_string(r->absent[i]));
    json_object_object_add(m, "absent", ab);
    return m;
}

/* The decision the job carried (its published MMGUARD record). */
static json_object *predicted_json(const struct mmg_record *p)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "decision", opt_str(p->decision));
    json_object_object_add(o, "model", opt_str(p->model));
    json_object_object_add(o, "spec", opt_str(p->spec));
    json_object_object_add(o, "spec_sha256", opt_str(p->sha256));
    json_object_object_add(o, "gpu", opt_str(p->gpu));
    json_object_object_add(o, "gpu_mem_bytes", opt_u64(p->gpu_mem != 0, p->gpu_mem));
    json_object_object_add(o, "usable_bytes", opt_u64(p->usable != 0, p->usable));
    json_object_object_add(o, "data_parallel", opt_u64(p->dp != 0, p->dp));
    json_object_object_add(o, "peak_bytes", opt_u64(p->peak != 0, p->peak));
    json_object_object_add(o, "allocated_peak_bytes", opt_u64(p->alloc != 0, p->alloc));
    json_object_object_add(o, "max_micro_batch", opt_u64(p->has_mmb, p->mmb));
    return o;
}

char *mmg_outcome_line(const struct mmg_outcome_job *j)
{
    json_object *o = json_object_new_object();
    char tbuf[32], *out;
    time_t now = time(NULL);
    struct tm tm;
    if (!o)
        return NULL;
    strftime(tbuf, sizeof tbuf, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    json_object_object_add(o, "time", json_object_new_string(tbuf));
    json_object_object_add(o, "event", json_object_new_string("outcome"));
    json_object_object_add(o, "job_id", u64(j->job_id));
    json_object_object_add(o, "step", json_object_new_string(j->step));
    json_object_object_add(o, "uid", u64(j->uid));
    json_object_object_add(o, "record", opt_str(j->record_path));
    json_object_object_add(o, "record_state", json_object_new_string(j->record_state));
    json_object_object_add(o, "record_error", opt_str(j->record_error));
    json_object_object_add(o, "measured", j->rec ? measured_json(j->rec) : NULL);
    json_object_object_add(o, "predicted", j->pred ? predicted_json(j->pred) : NULL);
    out = strdup(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN));
    json_object_put(o);
    return out;
}
