/* import_preset.c - the modules of an mmguard preset spec (a catalog entry
 * that is a .yaml spec) copied into the intermediate form; the preset's
 * training sections, LoRA and quantization are its recipe's, not the job's,
 * and are left for the job's files to decide. */
#include "import_rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a node as YAML flow text; -1 when it does not fit */
static int flow(const mm_node *v, char *out, size_t n, size_t *o)
{
    int k = 0;
    if (v->type == MM_NODE_SCALAR) {
        if (v->quoted)
            k = snprintf(out + *o, n - *o, "\"%s\"", v->str ? v->str : "");
        else
            k = snprintf(out + *o, n - *o, "%s", v->is_null ? "null" : v->str ? v->str : "");
        if (k < 0 || (size_t)k >= n - *o || (v->quoted && v->str && strpbrk(v->str, "\"\\")))
            return -1;
        *o += (size_t)k;
        return 0;
    }
    int map = v->type == MM_NODE_MAP;
    for (size_t i = 0; i <= v->n; i++) {
        const char *sep = i == 0 ? (map ? "{" : "[") : i == v->n ? (map ? "}" : "]") : ", ";
        k = snprintf(out + *o, n - *o, "%s", sep);
        if (k < 0 || (size_t)k >= n - *o)
            return -1;
        *o += (size_t)k;
        if (i == v->n)
            break;
        if (map) {
            k = snprintf(out + *o, n - *o, "%s: ", v->keys[i]);
            if (k < 0 || (size_t)k >= n - *o)
                return -1;
            *o += (size_t)k;
        }
        if (flow(v->vals[i], out, n, o))
            return -1;
    }
    return 0;
}

static int preset_module(imp_spec *s, const mm_node *m, const char *file, mm_error *err)
{
    static const char *const types[][3] = {{"vit", "vision", "clip"}, {"mlp", "connector", "mlp"},
                                           {"llama", "decoder", "llava_llama"}};
    const mm_node *ty = mm_node_get(m, "type");
    if (m->type != MM_NODE_MAP || !ty || ty->type != MM_NODE_SCALAR || !ty->str) {
        mm_err_at(err, file, m->line, m->col, "modules[]: expected a module with a type");
        return -1;
    }
    const char *type = ty->str, *legacy_family = NULL;
    for (size_t k = 0; k < 3; k++)
        if (!strcmp(type, types[k][0]) || !strcmp(type, types[k][1])) {
            legacy_family = strcmp(type, types[k][0]) ? NULL : types[k][2];
            type = types[k][1];
        }
    imp_section *sec = imp_module(s, type);
    if (legacy_family)
        imp_set(sec, "family", file, "%s", legacy_family);
    for (size_t i = 0; i < m->n; i++) {
        const char *key = m->keys[i];
        char val[600];
        size_t o = 0;
        if (!strcmp(key, "type"))
            continue;
        if (!strcmp(key, "lora") || !strcmp(key, "quantization")) {
            imp_note(s, "ignored the preset's %s of %s: the job's files decide", key, sec->name);
            continue;
        }
        /* a LoRA/QLoRA recipe freezes the base; without its adapters that would
         * leave nothing to train */
        if (!strcmp(key, "trainable") &&
            (mm_node_get(m, "lora") || mm_node_get(m, "quantization"))) {
            imp_note(s, "ignored the preset's trainable of %s: it freezes the base for the "
                        "recipe's LoRA, which the job's files decide", sec->name);
            continue;
        }
        if (flow(m->vals[i], val, sizeof val, &o)) {
            mm_err_at(err, file, m->key_line[i], m->key_col[i], "%s: value too long", key);
            return -1;
        }
        if (!strcmp(key, "name"))
            mm_strlcpy(sec->name, val, sizeof sec->name);
        else
            imp_set(sec, key, file, "%s", val);
    }
    return 0;
}

int imp_preset(imp_spec *s, const char *path, mm_error *err)
{
    size_t len;
    char *buf = imp_read_file(path, &len, err);
    if (!buf)
        return -1;
    mm_node *root = mm_yaml_parse(buf, len, path, err);
    int rc = -1;
    if (!root)
        goto out;
    imp_source(s, path, buf, len);
    const mm_node *mods = mm_node_get(root, "modules");
    if (!mods || mods->type != MM_NODE_SEQ || !mods->n) {
        mm_err_at(err, path, root->line, root->col, "modules: a preset spec lists its modules");
        goto out;
    }
    for (size_t i = 0; i < mods->n; i++)
        if (preset_module(s, mods->vals[i], path, err))
            goto out;
    imp_note(s, "ignored the preset's training sections: the job's files decide");
    rc = 0;
out:
    mm_node_free(root);
    free(buf);
    return rc;
}
