/* spec.c - decode and validate a model spec from the document tree.
 * Every key is described once in a table (name, type, range, which module
 * types it applies to); unknown keys get a "did you mean" suggestion and every
 * error names file:line:col and the dotted key path.  No silent defaults for
 * required keys; documented defaults for the rest (README "Spec reference"). */
#include "spec_internal.h"
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const top_keys[] = {"name", "modules", "training", "framework",
                                       "deepspeed", "fsdp", "ddp", "device"};
#define NTOP (sizeof top_keys / sizeof top_keys[0])

static int check_top_keys(dctx *c, const mm_node *root)
{
    if (root->type != MM_NODE_MAP)
        return key_fail(c, root, "(top)", "a spec is a mapping with name, modules and training");
    for (size_t i = 0; i < root->n; i++) {
        size_t q;
        for (q = 0; q < NTOP; q++)
            if (strcmp(root->keys[i], top_keys[q]) == 0)
                break;
        if (q == NTOP && spec_is_ref_key(root->keys[i]))
            continue; /* a deepspeed mapping, or a reference left after an import error */
        if (q == NTOP) {
            const char *sug = mm_suggest(root->keys[i], top_keys, NTOP);
            char what[128];
            snprintf(what, sizeof what, "unknown key%s%s%s", sug ? " (did you mean '" : "",
                     sug ? sug : "", sug ? "'?)" : "");
            return key_fail_key(c, root, i, root->keys[i], what);
        }
    }
    return 0;
}

static int decode_modules(dctx *c, const mm_node *root, mm_spec *s)
{
    const mm_node *mods = mm_node_get(root, "modules");
    if (!mods)
        return key_fail(c, root, "modules", "required key is missing");
    if (mods->type != MM_NODE_SEQ || mods->n == 0)
        return key_fail(c, mods, "modules", "expected a non-empty list of modules");
    if (mods->n > MM_MAX_MODULES)
        return key_fail(c, mods, "modules",
                        "%zu modules: a spec has at most %d (a vision encoder, a connector and "
                        "a decoder)", mods->n, MM_MAX_MODULES);
    s->n_modules = mods->n;
    for (size_t i = 0; i < mods->n; i++) {
        if (spec_decode_module(c, mods->vals[i], i, &s->modules[i]))
            return -1;
        char path[96];
        snprintf(path, sizeof path, "%s.name", s->modules[i].name);
        for (size_t j = 0; j < i; j++)
            if (strcmp(s->modules[j].name, s->modules[i].name) == 0)
                return key_fail(c, mm_node_get(mods->vals[i], "name"), path,
                                "duplicate module name (also modules[%zu])", j);
        for (size_t q = 0; q < NTOP; q++)
            if (!strcmp(s->modules[i].name, top_keys[q]))
                return key_fail(c, mm_node_get(mods->vals[i], "name"), path,
                                "'%s' is reserved (it names a top-level section)",
                                s->modules[i].name);
    }
    return 0;
}

static int decode_all(dctx *c, mm_spec *s)
{
    const mm_node *root = s->doc;
    if (check_top_keys(c, root))
        return -1;
    const mm_node *nm = mm_node_get(root, "name");
    if (!nm)
        return key_fail(c, root, "name", "required key is missing");
    static const keydesc name_key = {"name", K_STRING, offsetof(mm_spec, name), 0, 0, NULL, 0, 1, 0};
    if (key_decode_scalar(c, &name_key, nm, s, "name"))
        return -1;
    if (decode_modules(c, root, s) || spec_decode_training(c, root, s) ||
        spec_decode_sections(c, root, s) || spec_check_links(c, root, s))
        return -1;
    return 0;
}

int mm_spec_decode(mm_spec *spec, mm_error *err)
{
    dctx c = {.file = spec->path[0] ? spec->path : "<spec>", .err = err};
    return decode_all(&c, spec);
}

size_t mm_dtype_bytes(precision_kind p)
{
    return p == PREC_FP32 ? 4 : 2;
}

/* ---- loading ----------------------------------------------------------------- */

mm_spec *mm_spec_load_buffer(const char *buf, size_t len, const char *name, mm_format fmt,
                             mm_error *err)
{
    if (!name)
        name = "<spec>";
    if (err)
        err->msg[0] = '\0';
    if (len > MM_MAX_SPEC_BYTES) {
        mm_err(err, "%s: spec is %zu bytes, larger than the %u-byte limit", name, len,
               MM_MAX_SPEC_BYTES);
        return NULL;
    }
    if (memchr(buf, '\0', len)) {
        mm_err(err, "%s: spec contains a NUL byte (binary file?)", name);
        return NULL;
    }
    if (fmt == MM_FMT_AUTO) {
        size_t nl = strlen(name);
        if (nl > 5 && strcmp(name + nl - 5, ".json") == 0)
            fmt = MM_FMT_JSON;
        else if ((nl > 5 && strcmp(name + nl - 5, ".yaml") == 0) ||
                 (nl > 4 && strcmp(name + nl - 4, ".yml") == 0))
            fmt = MM_FMT_YAML;
        else {
            size_t i = 0;
            while (i < len && isspace((unsigned char)buf[i]))
                i++;
            fmt = i < len && buf[i] == '{' ? MM_FMT_JSON : MM_FMT_YAML;
        }
    }
    mm_spec *s = calloc(1, sizeof *s);
    if (!s) {
        mm_err(err, "%s: out of memory", name);
        return NULL;
    }
    mm_strlcpy(s->path, name, sizeof s->path);
    mm_sha256_hex(buf, len, s->digest);
    s->json = fmt == MM_FMT_JSON;
    s->doc = s->json ? mm_json_parse(buf, len, name, err) : mm_yaml_parse(buf, len, name, err);
    if (!s->doc || spec_resolve_refs(s, err) || mm_spec_decode(s, err)) {
        mm_spec_free(s);
        return NULL;
    }
    return s;
}

mm_spec *mm_spec_load_file(const char *path, mm_error *err)
{
    if (err)
        err->msg[0] = '\0';
    /* O_NONBLOCK: never hang on a FIFO; the regular-file check below refuses it */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        mm_err(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        mm_err(err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        mm_err(err, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size > (off_t)MM_MAX_SPEC_BYTES) {
        mm_err(err, "%s: spec is %lld bytes, larger than the %u-byte limit", path,
               (long long)st.st_size, MM_MAX_SPEC_BYTES);
        close(fd);
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        mm_err(err, "%s: out of memory", path);
        close(fd);
        return NULL;
    }
    for (;;) {
        if (len == cap) { /* file grew while reading: refuse beyond the limit */
            if (cap > MM_MAX_SPEC_BYTES) {
                mm_err(err, "%s: spec is larger than the %u-byte limit", path, MM_MAX_SPEC_BYTES);
                free(buf);
                close(fd);
                return NULL;
            }
            size_t ncap = cap * 2;
            char *nb = realloc(buf, ncap);
            if (!nb) {
                mm_err(err, "%s: out of memory", path);
                free(buf);
                close(fd);
                return NULL;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            mm_err(err, "%s: read error: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    mm_spec *s = mm_spec_load_buffer(buf, len, path, MM_FMT_AUTO, err);
    free(buf);
    return s;
}

void mm_spec_free(mm_spec *spec)
{
    if (!spec)
        return;
    mm_node_free(spec->doc);
    free(spec);
}

mm_spec *mm_spec_clone(const mm_spec *spec)
{
    mm_spec *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    memcpy(c, spec, sizeof *c);
    c->doc = mm_node_clone(spec->doc);
    if (!c->doc) {
        free(c);
        return NULL;
    }
    return c;
}

mm_spec *mm_spec_copy_decoded(const mm_spec *spec)
{
    mm_spec *c = malloc(sizeof *c);
    if (!c)
        return NULL;
    memcpy(c, spec, sizeof *c);
    c->doc = NULL;
    return c;
}

/* ---- --set ---------------------------------------------------------------------- */

static void clear_positions(mm_node *n)
{
    n->line = n->col = 0;
    for (size_t i = 0; i < n->n; i++) {
        if (n->type == MM_NODE_MAP)
            n->key_line[i] = n->key_col[i] = 0;
        clear_positions(n->vals[i]);
    }
}

/* --set KEY=VALUE: the key (into key[256]) and the value parsed as YAML flow
 * (8, true, bf16, [q_proj, v_proj], {r: 8, ...}); NULL with err set */
static mm_node *set_parse(const char *assignment, char *key, mm_error *err)
{
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment) {
        mm_err(err, "--set %s: expected KEY=VALUE (e.g. training.micro_batch_size=8)", assignment);
        return NULL;
    }
    size_t kl = (size_t)(eq - assignment);
    if (kl >= 256) {
        mm_err(err, "--set: key too long");
        return NULL;
    }
    memcpy(key, assignment, kl);
    key[kl] = '\0';
    const char *value = eq + 1;
    if (!*value) {
        mm_err(err, "--set %s: empty value", assignment);
        return NULL;
    }
    mm_error verr;
    mm_node *val = mm_yaml_parse(value, strlen(value), "--set", &verr);
    if (!val) {
        mm_err(err, "--set %s: %s", assignment, verr.msg);
        return NULL;
    }
    clear_positions(val);
    return val;
}

static int is_section(const char *k)
{
    return !strcmp(k, "training") || !strcmp(k, "framework") || !strcmp(k, "deepspeed") ||
           !strcmp(k, "fsdp") || !strcmp(k, "ddp") || !strcmp(k, "device");
}

/* the map the first key component names: a section (made when missing) or a
 * module by its name; NULL with err set */
static mm_node *set_first(const mm_spec *spec, mm_node *doc, const char *first,
                          const char *assignment, mm_error *err)
{
    mm_node *cur = NULL;
    if (is_section(first)) {
        cur = mm_node_get(doc, first);
        if (!cur) {
            cur = mm_node_new(MM_NODE_MAP, 0, 0);
            if (!cur || mm_node_map_put(doc, first, cur, 0, 0)) {
                mm_node_free(cur);
                mm_err(err, "out of memory");
                return NULL;
            }
        }
        return cur;
    }
    mm_node *mods = mm_node_get(doc, "modules");
    for (size_t i = 0; mods && mods->type == MM_NODE_SEQ && i < mods->n; i++) {
        mm_node *nm = mm_node_get(mods->vals[i], "name");
        if (nm && nm->type == MM_NODE_SCALAR && nm->str && strcmp(nm->str, first) == 0)
            cur = mods->vals[i];
    }
    if (!cur) {
        const char *cands[MM_MAX_MODULES + 7] = {"training", "framework", "deepspeed",
                                                  "fsdp", "ddp", "device", "name"};
        size_t nc = 7;
        for (size_t i = 0; i < spec->n_modules; i++)
            cands[nc++] = spec->modules[i].name;
        const char *sug = mm_suggest(first, cands, nc);
        mm_err(err, "--set %s: '%s' is neither a section nor a module name%s%s%s", assignment,
               first, sug ? " (did you mean '" : "", sug ? sug : "", sug ? "'?)" : "");
    }
    return cur;
}

/* the rest of the key's components from cur: maps made when missing; the map
 * that holds the leaf, *leaf set; NULL with err set */
static mm_node *set_walk(mm_node *cur, const char *first, char **save, char **leaf,
                         const char *assignment, mm_error *err)
{
    char *part = strtok_r(NULL, ".", save);
    if (!part) {
        mm_err(err, "--set %s: name a key inside '%s'", assignment, first);
        return NULL;
    }
    for (;;) {
        char *next = strtok_r(NULL, ".", save);
        if (!next) {
            *leaf = part;
            return cur;
        }
        mm_node *sub = mm_node_get(cur, part);
        if (!sub) {
            sub = mm_node_new(MM_NODE_MAP, 0, 0);
            if (!sub || mm_node_map_put(cur, part, sub, 0, 0)) {
                mm_node_free(sub);
                mm_err(err, "out of memory");
                return NULL;
            }
        }
        if (sub->type != MM_NODE_MAP) {
            mm_err(err, "--set %s: '%s' is not a mapping", assignment, part);
            return NULL;
        }
        cur = sub;
        part = next;
    }
}

/* decode the edited document into spec; on failure spec is unchanged and the
 * caller still owns doc */
static int set_decode(mm_spec *spec, mm_node *doc, const char *assignment, mm_error *err)
{
    mm_spec *tmp = malloc(sizeof *tmp);
    if (!tmp) {
        mm_err(err, "out of memory");
        return -1;
    }
    memcpy(tmp, spec, sizeof *tmp);
    tmp->doc = doc;
    mm_error derr;
    if (mm_spec_decode(tmp, &derr)) {
        mm_err(err, "--set %s: %s", assignment, derr.msg);
        free(tmp);
        return -1;
    }
    mm_node_free(spec->doc);
    memcpy(spec, tmp, sizeof *spec);
    free(tmp);
    return 0;
}

int mm_spec_set(mm_spec *spec, const char *assignment, mm_error *err)
{
    char key[256];
    mm_node *val = set_parse(assignment, key, err);
    if (!val)
        return -1;
    mm_node *doc = mm_node_clone(spec->doc);
    if (!doc) {
        mm_node_free(val);
        mm_err(err, "out of memory");
        return -1;
    }
    /* walk: first component is a section, "name", or a module name */
    char *save = NULL;
    char *first = strtok_r(key, ".", &save);
    mm_node *cur = NULL;
    char *leaf = NULL;
    if (!first) {
        mm_err(err, "--set %s: empty key", assignment);
        goto fail;
    }
    if (strcmp(first, "name") == 0) {
        cur = doc;
        leaf = first;
    } else if (!(cur = set_first(spec, doc, first, assignment, err)) ||
               !(cur = set_walk(cur, first, &save, &leaf, assignment, err))) {
        goto fail;
    }
    if (cur->type != MM_NODE_MAP) {
        mm_err(err, "--set %s: '%s' is not a mapping", assignment, first);
        goto fail;
    }
    if (mm_node_map_put(cur, leaf, val, 0, 0)) {
        mm_err(err, "out of memory");
        goto fail;
    }
    val = NULL;
    if (set_decode(spec, doc, assignment, err))
        goto fail;
    return 0;
fail:
    mm_node_free(val);
    mm_node_free(doc);
    return -1;
}

/* ---- accessors ---------------------------------------------------------------------- */

const char *mm_spec_name(const mm_spec *s) { return s->name; }
const char *mm_spec_path(const mm_spec *s) { return s->path; }
const char *mm_spec_digest(const mm_spec *s) { return s->digest; }
uint32_t mm_spec_data_parallel(const mm_spec *s) { return (uint32_t)s->training.data_parallel; }
uint32_t mm_spec_tensor_parallel(const mm_spec *s)
{
    return s->training.tensor_parallel > 1 ? (uint32_t)s->training.tensor_parallel : 1;
}
uint32_t mm_spec_micro_batch(const mm_spec *s) { return (uint32_t)s->training.micro_batch_size; }
int mm_spec_zero_stage(const mm_spec *s) { return s->training.zero_stage; }
int mm_spec_checkpointing(const mm_spec *s) { return s->training.ckpt.enabled; }
