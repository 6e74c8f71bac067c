/* spec_refs.c - a spec that points at the user's own files:
 *
 *   hf_config: Qwen2.5-VL-7B-Instruct/     # or config.json, relative to the spec
 *   deepspeed: ds_z3_config.json            # (a mapping stays the deepspeed section)
 *   trainer: train_args.yaml
 *   llamafactory: qwen2_5vl_lora_sft.yaml
 *
 * The files are imported (import*.c) into a spec tree; the spec's own keys
 * are laid over it (maps key by key, modules by name), so a 5-line job file
 * works and can still override anything.  Each file read is recorded with its
 * sha256 (the decision log keeps them).  sbatch runs this as the submitting
 * user: nothing is read with more rights than the user has. */
#include "spec_internal.h"
#include "import.h"
#include "util.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const ref_keys[] = {"hf_config", "trainer", "llamafactory", "deepspeed"};
#define NREFS (sizeof ref_keys / sizeof ref_keys[0])

int spec_is_ref_key(const char *key)
{
    for (size_t i = 0; i < NREFS; i++)
        if (!strcmp(key, ref_keys[i]))
            return 1;
    return 0;
}

/* a path relative to the spec's directory */
static void resolve(const char *spec_path, const char *p, char *out, size_t n)
{
    if (p[0] == '/' || !spec_path[0]) {
        snprintf(out, n, "%s", p);
        return;
    }
    char d[512];
    snprintf(d, sizeof d, "%s", spec_path);
    snprintf(out, n, "%s/%s", dirname(d), p);
}

/* does `p`, relative to the spec's directory, exist? */
static int spec_path_exists(const char *spec_path, const char *p)
{
    char full[1024];
    resolve(spec_path, p, full, sizeof full);
    return access(full, F_OK) == 0;
}

static void clear_positions(mm_node *n)
{
    n->line = n->col = 0;
    for (size_t i = 0; i < n->n; i++) {
        if (n->type == MM_NODE_MAP)
            n->key_line[i] = n->key_col[i] = 0;
        clear_positions(n->vals[i]);
    }
}

static mm_node *module_named(mm_node *mods, const char *name)
{
    for (size_t i = 0; mods && mods->type == MM_NODE_SEQ && i < mods->n; i++) {
        mm_node *nm = mm_node_get(mods->vals[i], "name");
        if (nm && nm->type == MM_NODE_SCALAR && nm->str && !strcmp(nm->str, name))
            return mods->vals[i];
    }
    return NULL;
}

/* lay `over` onto `base` (both maps): maps merge, modules by name, the rest replaces */
static int overlay(mm_node *base, const mm_node *over, int top)
{
    for (size_t i = 0; i < over->n; i++) {
        const char *k = over->keys[i];
        const mm_node *v = over->vals[i];
        if (top && spec_is_ref_key(k) && v->type == MM_NODE_SCALAR)
            continue;
        mm_node *b = mm_node_get(base, k);
        if (top && !strcmp(k, "modules") && b && v->type == MM_NODE_SEQ && b->type == MM_NODE_SEQ) {
            for (size_t j = 0; j < v->n; j++) {
                const mm_node *nm = mm_node_get(v->vals[j], "name");
                mm_node *bm = nm && nm->type == MM_NODE_SCALAR ? module_named(b, nm->str) : NULL;
                if (bm && v->vals[j]->type == MM_NODE_MAP && overlay(bm, v->vals[j], 0))
                    return -1;
                mm_node *c = bm ? NULL : mm_node_clone(v->vals[j]);
                if (!bm && (!c || mm_node_seq_push(b, c)))
                    return -1;
            }
            continue;
        }
        if (b && b->type == MM_NODE_MAP && v->type == MM_NODE_MAP && strcmp(k, "lora")) {
            if (overlay(b, v, 0))
                return -1;
            continue;
        }
        mm_node *c = mm_node_clone(v);
        if (!c || mm_node_map_put(base, k, c, over->key_line[i], over->key_col[i]))
            return -1;
    }
    return 0;
}

/* "path (sha256 HEX)" as the importer recorded it */
static void add_source(mm_spec *s, const char *rec)
{
    if (s->n_sources == MM_MAX_SOURCES)
        return;
    spec_source *src = &s->sources[s->n_sources++];
    const char *h = strstr(rec, " (sha256 ");
    size_t n = h ? (size_t)(h - rec) : strlen(rec);
    snprintf(src->path, sizeof src->path, "%.*s", (int)(n < 511 ? n : 511), rec);
    mm_strlcpy(src->digest, h ? h + 9 : "", sizeof src->digest);
}

/* the reader for a reference key; the model first (an HF id goes through the
 * catalog), then the trainer arguments, then DeepSpeed ("auto" needs both) */
static int spec_run_reader(size_t kind, imp_job *j, const char *path, mm_error *err)
{
    switch (kind) {
    case 0: return imp_model(j, path, "hf_config", err);
    case 1: return imp_trainer(j, path, err);
    case 2: return imp_llamafactory(j, path, err);
    default: return imp_deepspeed(j, path, err);
    }
}

static int blame(const mm_spec *s, const mm_node *v, const char *key, mm_error *err)
{
    char inner[sizeof err->msg];
    mm_strlcpy(inner, err->msg, sizeof inner);
    mm_err_at(err, s->path, v->line, v->col, "%s: %s", key, inner);
    return -1;
}

/* the spec's reference key ref_keys[i], or NULL when it has none there (an
 * inline `deepspeed:` mapping is the spec's own section, not a file) */
static const mm_node *ref_at(const mm_node *root, size_t i)
{
    const mm_node *v = mm_node_get(root, ref_keys[i]);
    return v && !(i == 3 && v->type == MM_NODE_MAP) ? v : NULL;
}

/* run the readers the spec names; *any = 0: nothing to import */
static int import_refs(mm_spec *s, imp_job *j, int *any, mm_error *err)
{
    const mm_node *root = s->doc;
    char path[1024];
    *any = 0;
    for (size_t i = 0; i < NREFS; i++) {
        const mm_node *v = ref_at(root, i);
        if (!v)
            continue;
        if (v->type != MM_NODE_SCALAR || v->is_null || !v->str[0]) {
            mm_err_at(err, s->path, v->line, v->col, "%s: expected a path to the file",
                      ref_keys[i]);
            return -1;
        }
        if (i == 1 && mm_node_get(root, ref_keys[2])) {
            mm_err_at(err, s->path, v->line, v->col, "trainer: give trainer or llamafactory, "
                      "not both");
            return -1;
        }
        /* an HF id (org/name) is looked up in the catalog, not next to the spec */
        int id = i == 0 && v->str[0] != '/' && v->str[0] != '.' && strchr(v->str, '/') &&
                 !strchr(strchr(v->str, '/') + 1, '/') && !spec_path_exists(s->path, v->str);
        if (id)
            mm_strlcpy(path, v->str, sizeof path);
        else
            resolve(s->path, v->str, path, sizeof path);
        *any = 1;
        if (spec_run_reader(i, j, path, err))
            return blame(s, v, ref_keys[i], err);
    }
    if (!*any)
        return 0;
    if (!j->have_model) {
        mm_err_at(err, s->path, 1, 1, "hf_config: no model: name one with hf_config, or "
                  "model_name_or_path in the trainer file");
        return -1;
    }
    /* the trainer file's own `deepspeed:` when the spec names none */
    const mm_node *ds = mm_node_get(root, "deepspeed");
    if (!ds && j->ds_path[0] && imp_deepspeed(j, j->ds_path, err))
        return blame(s, mm_node_get(root, mm_node_get(root, "trainer") ? "trainer"
                                           : "llamafactory"), "deepspeed", err);
    imp_job_finish(j);
    return 0;
}

/* does the spec name a file to import (a reference key import_refs reads)?
 * Most specs name none: then the importer's 2.4 MB intermediate form is
 * neither allocated nor cleared (1.5 M instructions of memset per load). */
static int names_a_file(const mm_node *root)
{
    for (size_t i = 0; i < NREFS; i++)
        if (ref_at(root, i))
            return 1;
    return 0;
}

int spec_resolve_refs(mm_spec *s, mm_error *err)
{
    if (!s->doc || s->doc->type != MM_NODE_MAP || !names_a_file(s->doc))
        return 0;
    imp_spec *imp = calloc(1, sizeof *imp);
    if (!imp) {
        mm_err(err, "out of memory");
        return -1;
    }
    imp_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(imp);
        mm_err(err, "out of memory");
        return -1;
    }
    imp_init_zeroed(imp);
    imp_job_init(j, imp);
    int any, rc = -1;
    if (import_refs(s, j, &any, err) || !any) {
        rc = any ? -1 : 0;
        free(j);
        free(imp);
        return rc;
    }
    free(j);
    mm_strlcpy(imp->name, "imported", sizeof imp->name);
    char *yaml = imp_emit(imp);
    mm_node *base = yaml ? mm_yaml_parse(yaml, strlen(yaml), "<imported>", err) : NULL;
    free(yaml);
    if (base) {
        clear_positions(base);
        if (overlay(base, s->doc, 1) == 0) {
            for (size_t i = 0; i < imp->nsources; i++)
                add_source(s, imp->sources[i]);
            mm_node_free(s->doc);
            s->doc = base;
            base = NULL;
            rc = 0;
        } else {
            mm_err(err, "out of memory");
        }
    }
    mm_node_free(base);
    free(imp);
    return rc;
}
