/* fuzz_import.h - shared by the import harnesses: a small Qwen2-VL model
 * (vision, merger, decoder, so every module key of the readers applies) in
 * the intermediate form, then the reader under test; an error must name the
 * input, a success must emit a spec, which is loaded and, when it loads,
 * predicted and checked like any spec (fuzz_common.h).  No file is opened:
 * the model counts as given, so model_name_or_path is never resolved. */
#ifndef MM_FUZZ_IMPORT_H
#define MM_FUZZ_IMPORT_H

#include "fuzz_common.h"
#include "import.h"

static const char fuzz_model[] =
    "{\"model_type\": \"qwen2_vl\", \"hidden_size\": 64, \"num_attention_heads\": 4,"
    " \"num_key_value_heads\": 2, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
    " \"vocab_size\": 128, \"vision_config\": {\"depth\": 2, \"embed_dim\": 32, \"num_heads\": 4,"
    " \"hidden_size\": 64, \"mlp_ratio\": 2, \"patch_size\": 14, \"spatial_merge_size\": 2,"
    " \"temporal_patch_size\": 2}}";

typedef int (*fuzz_reader)(imp_job *j, const char *buf, size_t len, const char *name,
                           mm_error *err);

/* with_model 0: the reader names the model itself (torchtitan's flavors) */
static inline void fuzz_import_with(const uint8_t *data, size_t size, const char *name,
                                    fuzz_reader rd, int with_model)
{
    imp_spec *s = calloc(1, sizeof *s);
    imp_job *j = calloc(1, sizeof *j);
    char *buf = malloc(size + 1);
    mm_error e;
    memset(&e, 0, sizeof e);
    if (!s || !j || !buf)
        goto out;
    memcpy(buf, data, size);
    buf[size] = '\0';
    imp_init(s);
    imp_job_init(j, s);
    if (with_model &&
        imp_hf_buffer(s, fuzz_model, sizeof fuzz_model - 1, "config.json", NULL, 0, NULL, &e))
        FUZZ_FAIL("the fixed model does not import");
    j->have_model = with_model;
    if (rd(j, buf, size, name, &e)) {
        fuzz_check_error(&e);
        if (!strstr(e.msg, name))
            FUZZ_FAIL("an import error does not name the input");
        goto out;
    }
    imp_job_finish(j);
    char *yaml = imp_emit(s);
    if (!yaml)
        FUZZ_FAIL("imp_emit returned NULL");
    mm_spec *spec = mm_spec_load_buffer(yaml, strlen(yaml), "imported.yaml", MM_FMT_YAML, &e);
    if (spec) {
        fuzz_predict(spec);
        mm_spec_free(spec);
    } else {
        fuzz_check_error(&e);
    }
    free(yaml);
out:
    free(buf);
    free(j);
    free(s);
}

static inline void fuzz_import(const uint8_t *data, size_t size, const char *name, fuzz_reader rd)
{
    fuzz_import_with(data, size, name, rd, 1);
}

#endif
