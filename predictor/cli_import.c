/* cli_import.c - `mmguard import`: write a complete, commented spec from the
 * files a user already has (import*.c), check that it loads, print it. */
#include "cli_import.h"
#include "import.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: mmguard import --hf DIR|config.json [--name NAME] [--set SECTION.KEY=VALUE]...\n"
          "                      [--allow-unknown] [-o SPEC.yaml]\n"
          "  Write an mmguard spec from a Hugging Face config.json (and the\n"
          "  preprocessor_config.json beside it).  Every value says where it came from;\n"
          "  what was assumed and every input key ignored (and why) are listed on top.\n"
          "  --set            override a value of the written spec: a module by name\n"
          "                   (vision_tower, projector, language_model) or a section\n"
          "                   (training, deepspeed, fsdp), e.g. --set training.seq_len=4096\n"
          "  --allow-unknown  list unknown input keys instead of refusing them\n"
          "  -o FILE          write there instead of standard output\n",
          f);
}

/* training defaults when no trainer file says otherwise: stated as assumptions */
static void training_defaults(imp_spec *s)
{
    imp_section *t = &s->training;
    int vlm = 0;
    for (size_t i = 0; i < s->nmod; i++)
        vlm |= !strcmp(s->mod[i].type, "vision") && s->mod[i].n;
    if (!imp_get(t, "micro_batch_size"))
        imp_set(t, "micro_batch_size", "assumed (no trainer file)", "1");
    if (!imp_get(t, "seq_len"))
        imp_set(t, "seq_len", "assumed (no trainer file): the longest sample, images included",
                "%s", vlm ? "4096" : "2048");
    if (vlm && !imp_get(t, "images_per_sample"))
        imp_set(t, "images_per_sample", "assumed: one image per sample", "1");
    const char *ip = imp_get(imp_module(s, "vision"), "image_processor");
    if (vlm && ip && strstr(ip, "dynamic") && !imp_get(t, "image_size"))
        imp_set(t, "image_size", "assumed: LLaMA-Factory's image_max_pixels default (768 x 768)",
                "[768, 768]");
    if (!imp_get(t, "precision"))
        imp_set(t, "precision", "assumed: bf16", "bf16");
}

static int apply_set(imp_spec *s, const char *kv)
{
    const char *eq = strchr(kv, '='), *dot = strchr(kv, '.');
    if (!eq || !dot || dot > eq || dot == kv || eq == dot + 1) {
        fprintf(stderr, "mmguard import: --set %s: expected SECTION.KEY=VALUE\n", kv);
        return -1;
    }
    char sec[64], key[64];
    snprintf(sec, sizeof sec, "%.*s", (int)(dot - kv), kv);
    snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
    imp_section *t = !strcmp(sec, "training") ? &s->training : !strcmp(sec, "deepspeed")
                         ? &s->deepspeed : !strcmp(sec, "fsdp") ? &s->fsdp : NULL;
    for (size_t i = 0; !t && i < s->nmod; i++)
        if (!strcmp(s->mod[i].name, sec))
            t = &s->mod[i];
    if (!t) {
        fprintf(stderr, "mmguard import: --set %s: no module or section '%s'\n", kv, sec);
        return -1;
    }
    imp_set(t, key, "--set", "%s", eq + 1);
    return 0;
}

int mm_cli_import(int argc, char **argv)
{
    const char *hf = NULL, *out = NULL, *name = NULL, *sets[64];
    int nsets = 0, allow = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--allow-unknown")) {
            allow = 1;
        } else if (i + 1 < argc && !strcmp(a, "--hf")) {
            hf = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--name")) {
            name = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "-o")) {
            out = argv[++i];
        } else if (i + 1 < argc && !strcmp(a, "--set") && nsets < 64) {
            sets[nsets++] = argv[++i];
        } else {
            fprintf(stderr, "mmguard import: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!hf) {
        fprintf(stderr, "mmguard import: give a model (--hf DIR|config.json)\n");
        usage(stderr);
        return 2;
    }
    imp_spec *s = calloc(1, sizeof *s);
    if (!s)
        return 2;
    imp_init(s);
    s->allow_unknown = allow;
    mm_error e;
    int rc = 2;
    if (imp_hf(s, hf, &e)) {
        fprintf(stderr, "mmguard import: %s\n", e.msg);
        goto done;
    }
    mm_strlcpy(s->name, name ? name : "imported", sizeof s->name);
    training_defaults(s);
    for (int i = 0; i < nsets; i++)
        if (apply_set(s, sets[i]))
            goto done;
    char *yaml = imp_emit(s);
    mm_spec *spec = yaml ? mm_spec_load_buffer(yaml, strlen(yaml), out ? out : "<import>",
                                               MM_FMT_YAML, &e) : NULL;
    if (!spec) {
        fprintf(stderr, "mmguard import: the written spec does not load: %s\n%s", e.msg,
                yaml ? yaml : "");
        free(yaml);
        goto done;
    }
    mm_spec_free(spec);
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f || fputs(yaml, f) < 0 || (out && fclose(f))) {
        fprintf(stderr, "mmguard import: cannot write %s\n", out ? out : "standard output");
    } else {
        rc = 0;
    }
    free(yaml);
done:
    free(s);
    return rc;
}
