/* import_catalog.c - where the model comes from: a directory with
 * config.json, a config.json, or a Hugging Face id looked up with no network
 * in a catalog: catalog.txt lines "ID FILE" ('#' comments), FILE relative to
 * the catalog directory and either an HF config directory / config.json or an
 * mmguard preset spec (.yaml), whose modules are taken as they are. */
#include "import_rd.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifndef MM_DATADIR
#define MM_DATADIR "/usr/local/share/mmguard"
#endif

/* the catalog beside the running program (imp_catalog_beside), "" when none */
static char beside[4096];

static int has_catalog(const char *dir)
{
    char cat[4200];
    struct stat st;
    snprintf(cat, sizeof cat, "%s/catalog.txt", dir);
    return stat(cat, &st) == 0 && S_ISREG(st.st_mode);
}

/* A program in BINDIR finds the catalog of its own tree: BINDIR/../share/mmguard/models
 * (an install moved as a whole) or BINDIR/../contrib/models (the uninstalled build/mmguard
 * of a source tree), whatever the current directory is. */
void imp_catalog_beside(const char *bindir)
{
    static const char *const rel[] = {"/../share/mmguard/models", "/../contrib/models"};
    beside[0] = 0;
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char dir[sizeof beside], real[PATH_MAX];
        int n = snprintf(dir, sizeof dir, "%s%s", bindir, rel[i]);
        if (n > 0 && (size_t)n < sizeof dir && has_catalog(dir) && realpath(dir, real) &&
            strlen(real) < sizeof beside) {
            strcpy(beside, real);
            return;
        }
    }
}

const char *imp_catalog_default(void)
{
    const char *env = getenv("MMGUARD_CATALOG");
    if (env && env[0])
        return env;
    if (beside[0])
        return beside;
    if (has_catalog(MM_DATADIR "/models"))
        return MM_DATADIR "/models";
    return "contrib/models"; /* the source tree, from its root */
}

int imp_catalog_find(const char *dir, const char *id, char *path, size_t n, mm_error *err)
{
    char cat[1100];
    snprintf(cat, sizeof cat, "%s/catalog.txt", dir);
    size_t len;
    char *buf = imp_read_file(cat, &len, err);
    if (!buf)
        return -1;
    int found = 0, line = 0;
    for (char *save = NULL, *l = strtok_r(buf, "\n", &save); l && !found;
         l = strtok_r(NULL, "\n", &save)) {
        line++;
        char a[512], b[512], extra[8];
        while (isspace((unsigned char)*l))
            l++;
        if (!*l || *l == '#')
            continue;
        int k = sscanf(l, "%511s %511s %7s", a, b, extra);
        if (k != 2 || b[0] == '#') {
            mm_err_at(err, cat, line, 1, "expected 'HF-ID FILE'");
            free(buf);
            return -1;
        }
        if (!strcmp(a, id)) {
            snprintf(path, n, "%s%s%s", b[0] == '/' ? "" : dir, b[0] == '/' ? "" : "/", b);
            found = 1;
        }
    }
    free(buf);
    return found;
}

static int ends_with(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

/* config.json's model_type (LLaMA-Factory decides Liger and the VLM keys by it) */
static int hf_model(imp_job *j, const char *path, mm_error *err)
{
    if (imp_hf(j->s, path, err))
        return -1;
    char cfg[1100];
    size_t len, n = strlen(path);
    snprintf(cfg, sizeof cfg, "%s%s", path, n >= 11 && !strcmp(path + n - 11, "config.json") ? ""
                                                                                     : "/config.json");
    mm_error e;
    char *buf = imp_read_file(cfg, &len, &e);
    mm_node *root = buf ? mm_json_parse(buf, len, cfg, &e) : NULL;
    const mm_node *mt = root ? mm_node_get(root, "model_type") : NULL;
    if (mt && mt->type == MM_NODE_SCALAR && mt->str)
        snprintf(j->model_type, sizeof j->model_type, "%s", mt->str);
    mm_node_free(root);
    free(buf);
    return 0;
}

int imp_model(imp_job *j, const char *ref, const char *where, mm_error *err)
{
    struct stat st;
    char path[1100];
    j->have_model = 1;
    snprintf(j->model, sizeof j->model, "%s", ref);
    snprintf(j->model_where, sizeof j->model_where, "%s", where);
    if (stat(ref, &st) == 0 && !ends_with(ref, ".yaml") && !ends_with(ref, ".yml"))
        return hf_model(j, ref, err);
    if (stat(ref, &st) == 0)
        return imp_preset(j->s, ref, err);
    const char *dir = j->catalog[0] ? j->catalog : imp_catalog_default();
    mm_error e;
    int f = imp_catalog_find(dir, ref, path, sizeof path, &e);
    if (f <= 0) {
        mm_err(err, "%s%s%s: no directory '%s', and %s", where, where[0] ? ": " : "", ref, ref,
               f < 0 ? e.msg : "the id is not in the catalog");
        if (f == 0)
            snprintf(err->msg + strlen(err->msg), sizeof err->msg - strlen(err->msg),
                     " (%s/catalog.txt; --catalog DIR, or give the model's directory)", dir);
        return -1;
    }
    imp_note(j->s, "assumed %s is the catalog's %s", ref, path);
    if (ends_with(path, ".yaml") || ends_with(path, ".yml"))
        return imp_preset(j->s, path, err);
    return hf_model(j, path, err);
}
