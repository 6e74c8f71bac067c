/* unit_spec.c - specs the unit suites share: a shipped preset, and a tiny
 * Llama (4 layers of 512) with extra lines under `training:`. */
#include "unit.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>

static const char *const TINY =
    "name: tiny\n"
    "modules:\n"
    "  - {name: language_model, type: decoder, family: llama, hidden_size: 512,\n"
    "     num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4,\n"
    "     intermediate_size: 1376, vocab_size: 32000, trainable: true}\n"
    "training:\n"
    "  micro_batch_size: 2\n"
    "  seq_len: 512\n"
    "  precision: bf16\n";

mm_spec *unit_preset(const char *name)
{
    char path[1024];
    mm_error e;
    snprintf(path, sizeof path, "%s/contrib/models/%s.yaml", SRCDIR, name);
    mm_spec *s = mm_spec_load_file(path, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    return s;
}

mm_spec *unit_tiny(const char *extra, mm_error *e)
{
    char buf[2048];
    snprintf(buf, sizeof buf, "%s%s", TINY, extra);
    return mm_spec_load_buffer(buf, strlen(buf), "tiny.yaml", MM_FMT_YAML, e);
}

mm_prediction unit_predict(const mm_spec *s)
{
    mm_error e;
    mm_prediction p;
    ck_assert_msg(mm_predict(s, &p, &e) == 0, "%s", e.msg);
    return p;
}

mm_prediction unit_set_predict(mm_spec *s, const char *kv)
{
    mm_error e;
    ck_assert_msg(mm_spec_set(s, kv, &e) == 0, "%s: %s", kv, e.msg);
    return unit_predict(s);
}

uint64_t unit_set_forward_peak(mm_spec *s, const char *kv)
{
    mm_prediction p = unit_set_predict(s, kv);
    uint64_t v = p.phase_peak[MM_PHASE_FORWARD];
    mm_prediction_free(&p);
    return v;
}

mm_prediction unit_tiny_predict(const char *extra)
{
    mm_error e;
    mm_spec *s = unit_tiny(extra, &e);
    ck_assert_msg(s != NULL, "%s", e.msg);
    mm_prediction p = unit_predict(s);
    mm_spec_free(s);
    return p;
}

void unit_tiny_refused(const char *extra, const char *key, const char *why)
{
    mm_error e;
    mm_spec *s = unit_tiny(extra, &e);
    ck_assert_msg(s == NULL, "accepted: %s", extra);
    ck_assert_msg(strstr(e.msg, key) && strstr(e.msg, why), "%s", e.msg);
}

size_t unit_each_yaml(const char *dir, void (*fn)(const char *path, void *ctx), void *ctx)
{
    char d[512];
    snprintf(d, sizeof d, "%s/%s", SRCDIR, dir);
    DIR *dp = opendir(d);
    ck_assert_msg(dp != NULL, "cannot open %s", d);
    struct dirent *de;
    size_t n = 0;
    while ((de = readdir(dp))) {
        size_t l = strlen(de->d_name);
        if (l < 6 || strcmp(de->d_name + l - 5, ".yaml"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", d, de->d_name);
        fn(path, ctx);
        n++;
    }
    closedir(dp);
    ck_assert_msg(n > 0, "no specs in %s", d);
    return n;
}
