/* config.c - strict parser of the mmguard plugin configuration (see config.h). */
#include "config.h"
#include "parse_u32.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

static const struct { const char *name; uint64_t mib; } builtin_gpus[] = {
    { "h100", 81559 }, { "h200", 143771 }, { "a100", 81920 },
    { "a100-40g", 40960 }, { "l40s", 46068 },
};

__attribute__((format(printf, 3, 4)))
static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

const char *mmg_action_name(mmg_action a)
{
    switch (a) {
    case MMG_ACTION_WARN: return "warn";
    case MMG_ACTION_RESIZE: return "resize";
    default: return "reject";
    }
}

const char *mmg_hostmem_name(mmg_hostmem h)
{
    return h == MMG_HOSTMEM_WARN ? "warn" : h == MMG_HOSTMEM_OFF ? "off" : "check";
}

const char *mmg_flush_name(mmg_flush f)
{
    return f == MMG_FLUSH_ACCEPT ? "accept" : f == MMG_FLUSH_REJECT ? "reject" : "warn";
}

void mmg_config_defaults(struct mmg_config *c)
{
    memset(c, 0, sizeof(*c));
    c->action = MMG_ACTION_REJECT;
    c->flush = MMG_FLUSH_WARN;
    c->on_error = MMG_ONERR_REJECT;
    c->require = MMG_REQUIRE_OFF;
    c->margin_den = 1;
    c->max_gpus_per_node = 8;
    c->max_micro_batch = 1;
    c->host_overhead = MMG_DEFAULT_HOST_OVERHEAD;
    snprintf(c->default_gpu, sizeof(c->default_gpu), "h100");
    for (size_t i = 0; i < sizeof(builtin_gpus) / sizeof(builtin_gpus[0]); i++) {
        snprintf(c->gpus[i].name, sizeof(c->gpus[i].name), "%s", builtin_gpus[i].name);
        c->gpus[i].bytes = builtin_gpus[i].mib << 20;
        c->gpus[i].builtin = 1;
        c->n_gpus++;
    }
}

/* GPU type names as Slurm GRES types use them: [A-Za-z0-9_.-], 1..31 chars. */
static int valid_gpu_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= MMG_GPU_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (!isalnum(ch) && ch != '-' && ch != '_' && ch != '.')
            return 0;
    }
    return 1;
}

/* GPU type names are case-insensitive; stored lower-case (as job_submit.lua). */
static void lower(char *s)
{
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

const struct mmg_gpu *mmg_config_gpu(const struct mmg_config *c, const char *name)
{
    if (!name)
        return NULL;
    for (size_t i = 0; i < c->n_gpus; i++)
        if (strcasecmp(c->gpus[i].name, name) == 0)
            return &c->gpus[i];
    return NULL;
}

static int parse_bool(const char *s)
{
    if (!strcmp(s, "yes") || !strcmp(s, "true") || !strcmp(s, "1") || !strcmp(s, "on"))
        return 1;
    if (!strcmp(s, "no") || !strcmp(s, "false") || !strcmp(s, "0") || !strcmp(s, "off"))
        return 0;
    return -1;
}

static int set_path(char *dst, size_t dstlen, const char *key, const char *value,
                    const char *where, char *err, size_t errlen)
{
    if (value[0] == '\0' || !strcmp(value, "none")) {
        dst[0] = '\0';
        return 0;
    }
    if (value[0] != '/')
        return fail(err, errlen, "%s: %s: '%s' is not an absolute path", where, key, value);
    if (strlen(value) >= dstlen)
        return fail(err, errlen, "%s: %s: path longer than %zu bytes", where, key, dstlen - 1);
    for (const char *p = value; *p; p++)
        if (iscntrl((unsigned char)*p))
            return fail(err, errlen, "%s: %s: control character in path", where, key);
    memcpy(dst, value, strlen(value) + 1);
    return 0;
}

/* Validates the syntax of a comma list of GPU names (table membership is
 * checked in mmg_config_finish, since gpu.* may come later). */
static int set_resize_types(struct mmg_config *c, const char *value, const char *where,
                            char *err, size_t errlen)
{
    char buf[sizeof(c->resize_types)];
    if (strlen(value) >= sizeof(buf))
        return fail(err, errlen, "%s: resize_types: list longer than %zu bytes", where,
                    sizeof(buf) - 1);
    memcpy(buf, value, strlen(value) + 1);
    if (buf[0] != '\0') {
        char *save = NULL;
        /* reject empty entries ("h200,,a100", trailing comma) */
        if (buf[0] == ',' || buf[strlen(buf) - 1] == ',' || strstr(buf, ",,"))
            return fail(err, errlen, "%s: resize_types: empty entry in '%s'", where, value);
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
            if (!valid_gpu_name(tok))
                return fail(err, errlen, "%s: resize_types: invalid GPU type '%s'", where, tok);
        }
    }
    memcpy(c->resize_types, value, strlen(value) + 1);
    lower(c->resize_types);
    return 0;
}

/* One of the names (index = enum value), else -1. */
static int choice(const char *value, const char *const *names)
{
    for (int i = 0; names[i]; i++)
        if (!strcmp(value, names[i]))
            return i;
    return -1;
}

static const char *const action_names[] = { "reject", "warn", "resize", NULL };
static const char *const onerr_names[] = { "reject", "allow", NULL };
static const char *const require_names[] = { "off", "warn", "reject", NULL };
static const char *const hostmem_names[] = { "check", "warn", "off", NULL };
static const char *const flush_names[] = { "warn", "accept", "reject", NULL };

/* A size as mm_parse_size reads it, at most MMG_CONF_MAX_SIZE (job_submit.lua
 * counts in doubles, exact below 2^53). */
static int set_size(uint64_t *dst, const char *key, const char *value, const char *where,
                    char *err, size_t errlen)
{
    mm_error e;
    uint64_t b;
    memset(&e, 0, sizeof(e));
    if (mm_parse_size(value, &b, &e) != 0)
        return fail(err, errlen, "%s: %s: invalid size '%s': %s", where, key, value, e.msg);
    if (b > MMG_CONF_MAX_SIZE)
        return fail(err, errlen, "%s: %s: invalid size '%s': larger than 8 PiB", where, key, value);
    *dst = b;
    return 0;
}

/* "7.5%": digits, at most one '.', at most 6 decimals, below 100; kept as the
 * exact fraction num/den so that usable memory is computed exactly (as
 * job_submit.lua does). */
static int percent(const char *v, uint64_t *num, uint64_t *den)
{
    size_t len = strlen(v), int_digits = 0, decimals = 0;
    int dot = 0;
    *num = 0;
    *den = 1;
    if (len < 2 || v[len - 1] != '%' || !isdigit((unsigned char)v[0]))
        return -1;
    for (size_t i = 0; i + 1 < len; i++) {
        if (v[i] == '.' && !dot) {
            dot = 1;
            continue;
        }
        if (!isdigit((unsigned char)v[i]) || (dot && ++decimals > 6))
            return -1;
        if (!dot && (*num || v[i] != '0') && ++int_digits > 2)
            return -1; /* 100 or more */
        *num = *num * 10 + (uint64_t)(v[i] - '0');
        *den *= dot ? 10 : 1;
    }
    return 0;
}

static int set_margin(struct mmg_config *c, const char *value, const char *where, char *err,
                      size_t errlen)
{
    mm_margin m = { 0, 0 };
    mm_error e;
    memset(&e, 0, sizeof(e));
    if (value[0] && value[strlen(value) - 1] == '%') {
        uint64_t num, den;
        if (percent(value, &num, &den) != 0 || mm_parse_margin(value, &m, &e) != 0)
            return fail(err, errlen, "%s: margin: invalid value '%s': a percentage below 100 "
                        "with at most 6 decimals (10%%, 7.5%%)", where, value);
        c->margin_num = num;
        c->margin_den = den;
    } else {
        if (mm_parse_size(value, &m.bytes, &e) != 0)
            return fail(err, errlen, "%s: margin: invalid value '%s': %s", where, value, e.msg);
        if (m.bytes > MMG_CONF_MAX_SIZE)
            return fail(err, errlen, "%s: margin: invalid value '%s': larger than 8 PiB", where,
                        value);
        c->margin_num = 0;
        c->margin_den = 1;
    }
    c->margin = m;
    return 0;
}

static int set_gpu(struct mmg_config *c, const char *key, const char *value, const char *where,
                   char *err, size_t errlen)
{
    const char *name = key + 4;
    uint64_t b;
    struct mmg_gpu *g;
    if (!valid_gpu_name(name))
        return fail(err, errlen, "%s: %s: invalid GPU type name '%s'", where, key, name);
    if (set_size(&b, key, value, where, err, errlen) != 0)
        return -1;
    if (b == 0)
        return fail(err, errlen, "%s: %s: GPU memory must be > 0", where, key);
    g = (struct mmg_gpu *)mmg_config_gpu(c, name);
    if (!g) {
        if (c->n_gpus >= MMG_MAX_GPU_TYPES)
            return fail(err, errlen, "%s: %s: more than %d GPU types", where, key,
                        MMG_MAX_GPU_TYPES);
        g = &c->gpus[c->n_gpus++];
        snprintf(g->name, sizeof(g->name), "%s", name);
        lower(g->name);
    }
    g->bytes = b;
    g->builtin = 0;
    return 0;
}

/* action, on_error, require, host_mem, flush: one word of a fixed list. */
static int set_choice(struct mmg_config *c, const char *key, const char *value,
                      const char *where, char *err, size_t errlen)
{
    int v;
    if (!strcmp(key, "action")) {
        if ((v = choice(value, action_names)) >= 0)
            c->action = (mmg_action)v;
    } else if (!strcmp(key, "on_error")) {
        if ((v = choice(value, onerr_names)) >= 0)
            c->on_error = (mmg_on_error)v;
    } else if (!strcmp(key, "host_mem")) {
        if ((v = choice(value, hostmem_names)) >= 0)
            c->host_mem = (mmg_hostmem)v;
    } else if (!strcmp(key, "flush")) {
        if ((v = choice(value, flush_names)) >= 0)
            c->flush = (mmg_flush)v;
    } else if ((v = choice(value, require_names)) >= 0) {
        c->require = (mmg_require)v;
    }
    if (v >= 0)
        return 0;
    return fail(err, errlen, "%s: %s: invalid value '%s' (%s)", where, key, value,
                !strcmp(key, "action") ? "reject|warn|resize"
                : !strcmp(key, "on_error") ? "reject|allow"
                : !strcmp(key, "host_mem") ? "check|warn|off"
                : !strcmp(key, "flush") ? "accept|warn|reject" : "off|warn|reject");
}

/* def_mem_per_node / _cpu / _gpu, node_mem: slurm.conf's values, which count
 * in MiB there, so a unit is required ("4000MiB", "4GiB"); none or 0 unsets. */
static int set_slurm_mem(struct mmg_config *c, const char *key, const char *value,
                         const char *where, char *err, size_t errlen)
{
    uint64_t *dst = !strcmp(key, "def_mem_per_node") ? &c->def_mem_per_node
                  : !strcmp(key, "def_mem_per_cpu") ? &c->def_mem_per_cpu
                  : !strcmp(key, "def_mem_per_gpu") ? &c->def_mem_per_gpu : &c->node_mem;
    size_t n = strlen(value);
    if (!strcmp(value, "none") || !strcmp(value, "0")) {
        *dst = 0;
        return 0;
    }
    if (n && isdigit((unsigned char)value[n - 1]))
        return fail(err, errlen, "%s: %s: '%s' needs a unit (slurm.conf counts in MiB: "
                    "DefMemPerCPU=4000 is %sMiB here)", where, key, value, value);
    return set_size(dst, key, value, where, err, errlen);
}

static int set_other(struct mmg_config *c, const char *key, const char *value, const char *where,
                     char *err, size_t errlen)
{
    if (!strcmp(key, "default_gpu")) {
        if (!valid_gpu_name(value))
            return fail(err, errlen, "%s: default_gpu: invalid GPU type '%s'", where, value);
        snprintf(c->default_gpu, sizeof(c->default_gpu), "%s", value);
        lower(c->default_gpu);
        return 0;
    }
    if (!strcmp(key, "syslog") || !strcmp(key, "max_micro_batch")) {
        int b = parse_bool(value);
        if (b < 0)
            return fail(err, errlen, "%s: %s: invalid value '%s' (yes|no)", where, key, value);
        *(!strcmp(key, "syslog") ? &c->syslog : &c->max_micro_batch) = b;
        return 0;
    }
    if (mmg_parse_u32(value, 1, 1024, &c->max_gpus_per_node) != 0)
        return fail(err, errlen, "%s: max_gpus_per_node: '%s' is not an integer in 1..1024",
                    where, value);
    return 0;
}

int mmg_config_set(struct mmg_config *c, const char *key, const char *value,
                   const char *where, char *err, size_t errlen)
{
    if (!strcmp(key, "action") || !strcmp(key, "on_error") || !strcmp(key, "require") ||
        !strcmp(key, "host_mem") || !strcmp(key, "flush"))
        return set_choice(c, key, value, where, err, errlen);
    if (!strcmp(key, "host_overhead"))
        return set_size(&c->host_overhead, key, value, where, err, errlen);
    if (!strcmp(key, "def_mem_per_node") || !strcmp(key, "def_mem_per_cpu") ||
        !strcmp(key, "def_mem_per_gpu") || !strcmp(key, "node_mem"))
        return set_slurm_mem(c, key, value, where, err, errlen);
    if (!strcmp(key, "margin"))
        return set_margin(c, value, where, err, errlen);
    if (!strcmp(key, "reserve"))
        return set_size(&c->reserve, key, value, where, err, errlen);
    if (!strncmp(key, "gpu.", 4))
        return set_gpu(c, key, value, where, err, errlen);
    if (!strcmp(key, "log"))
        return set_path(c->log_path, sizeof(c->log_path), key, value, where, err, errlen);
    if (!strcmp(key, "ctld_log"))
        return set_path(c->ctld_log, sizeof(c->ctld_log), key, value, where, err, errlen);
    if (!strcmp(key, "resize_types"))
        return set_resize_types(c, value, where, err, errlen);
    if (!strcmp(key, "default_gpu") || !strcmp(key, "syslog") || !strcmp(key, "max_gpus_per_node") ||
        !strcmp(key, "max_micro_batch"))
        return set_other(c, key, value, where, err, errlen);
    if (!strcmp(key, "config"))
        return fail(err, errlen, "%s: config: only allowed on the plugstack.conf line", where);
    return fail(err, errlen, "%s: unknown key '%s'", where, key);
}

static char *trim(char *s)
{
    char *e;
    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
        *--e = '\0';
    return s;
}

/* Parse "key=value" (whitespace around both allowed) at `where`. */
static int set_assignment(struct mmg_config *c, char *line, const char *where,
                          char *err, size_t errlen)
{
    char *eq = strchr(line, '=');
    char *key, *value;
    if (!eq)
        return fail(err, errlen, "%s: expected key=value, got '%s'", where, line);
    *eq = '\0';
    key = trim(line);
    value = trim(eq + 1);
    if (!*key)
        return fail(err, errlen, "%s: empty key before '='", where);
    return mmg_config_set(c, key, value, where, err, errlen);
}

int mmg_config_load_file(struct mmg_config *c, const char *path, char *err, size_t errlen)
{
    struct stat st;
    char *buf;
    ssize_t n;
    size_t len = 0, lineno = 0;
    int fd, rc = 0;

    if (!path || path[0] != '/')
        return fail(err, errlen, "config: '%s' is not an absolute path", path ? path : "");
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return fail(err, errlen, "%s: cannot open config file: %s", path, strerror(errno));
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(err, errlen, "%s: config file is not a regular file", path);
    }
    if (st.st_size > (off_t)MMG_CONF_MAX_BYTES) {
        close(fd);
        return fail(err, errlen, "%s: config file larger than %u bytes", path, MMG_CONF_MAX_BYTES);
    }
    buf = malloc(MMG_CONF_MAX_BYTES + 2);
    if (!buf) {
        close(fd);
        return fail(err, errlen, "%s: out of memory", path);
    }
    while (len <= MMG_CONF_MAX_BYTES) {
        n = read(fd, buf + len, MMG_CONF_MAX_BYTES + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = fail(err, errlen, "%s: read error: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (rc == 0 && len > MMG_CONF_MAX_BYTES)
        rc = fail(err, errlen, "%s: config file larger than %u bytes", path, MMG_CONF_MAX_BYTES);
    if (rc == 0 && memchr(buf, '\0', len))
        rc = fail(err, errlen, "%s: NUL byte in config file", path);
    if (rc != 0) {
        free(buf);
        return -1;
    }
    buf[len] = '\0';

    for (char *line = buf; rc == 0 && line && *line;) {
        char *nl = strchr(line, '\n');
        char *s;
        char where[MMG_PATH_MAX + 32];
        if (nl)
            *nl = '\0';
        lineno++;
        snprintf(where, sizeof(where), "%s:%zu", path, lineno);
        if (strlen(line) >= MMG_CONF_MAX_LINE) {
            rc = fail(err, errlen, "%s: line longer than %d bytes", where, MMG_CONF_MAX_LINE - 1);
            break;
        }
        s = trim(line);
        if (*s && *s != '#')
            rc = set_assignment(c, s, where, err, errlen);
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    if (rc == 0)
        snprintf(c->config_file, sizeof(c->config_file), "%s", path);
    return rc;
}

int mmg_config_finish(const struct mmg_config *c, char *err, size_t errlen)
{
    const char *src = c->config_file[0] ? c->config_file : "plugstack.conf";
    if (!mmg_config_gpu(c, c->default_gpu))
        return fail(err, errlen, "%s: default_gpu: unknown GPU type '%s' (add gpu.%s=SIZE)",
                    src, c->default_gpu, c->default_gpu);
    if (c->resize_types[0]) {
        char buf[sizeof(c->resize_types)];
        char *save = NULL;
        memcpy(buf, c->resize_types, sizeof(buf));
        for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (!mmg_config_gpu(c, tok))
                return fail(err, errlen, "%s: resize_types: unknown GPU type '%s'", src, tok);
    }
    if (c->def_mem_per_cpu && c->def_mem_per_node)
        return fail(err, errlen, "%s: def_mem_per_cpu: mutually exclusive with def_mem_per_node "
                    "(as DefMemPerCPU and DefMemPerNode in slurm.conf)", src);
    if (mmg_config_usable(c, mmg_config_gpu(c, c->default_gpu)->bytes) == 0)
        return fail(err, errlen, "%s: margin/reserve leave no usable memory on %s", src,
                    c->default_gpu);
    return 0;
}

int mmg_config_parse_args(struct mmg_config *c, int ac, char **av, char *err, size_t errlen)
{
    mmg_config_defaults(c);
    for (int i = 0; i < ac; i++) {
        char where[64];
        char arg[MMG_CONF_MAX_LINE];
        snprintf(where, sizeof(where), "plugstack.conf argument %d", i + 1);
        if (!av[i] || strlen(av[i]) >= sizeof(arg))
            return fail(err, errlen, "%s: argument too long", where);
        memcpy(arg, av[i], strlen(av[i]) + 1);
        if (!strncmp(arg, "config=", 7)) {
            if (mmg_config_load_file(c, arg + 7, err, errlen) != 0)
                return -1;
            continue;
        }
        if (set_assignment(c, arg, where, err, errlen) != 0)
            return -1;
    }
    return mmg_config_finish(c, err, errlen);
}

/* gpu_mem - ceil(gpu_mem * percent / 100) - margin bytes - reserve, exactly
 * (percent = margin_num / margin_den, as written). */
uint64_t mmg_config_usable(const struct mmg_config *c, uint64_t gpu_mem)
{
    unsigned __int128 prod = (unsigned __int128)gpu_mem * c->margin_num;
    unsigned __int128 den = (unsigned __int128)c->margin_den * 100u;
    uint64_t cut = (uint64_t)(prod / den + (prod % den != 0)), left;
    if (cut >= gpu_mem)
        return 0;
    left = gpu_mem - cut;
    if (c->margin.bytes >= left || c->reserve >= left - c->margin.bytes)
        return 0;
    return left - c->margin.bytes - c->reserve;
}

void mmg_config_margin_str(const struct mmg_config *c, char *buf, size_t n)
{
    uint64_t b = c->margin.bytes;
    b = (b > UINT64_MAX - c->reserve) ? UINT64_MAX : b + c->reserve;
    snprintf(buf, n, "%g%%+%" PRIu64, c->margin.percent, b);
}
