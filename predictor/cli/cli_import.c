/* cli_import.c - `mmguard import`: write a complete, commented spec from the
 * files a user already has (import*.c): the model (--hf or the trainer's
 * model_name_or_path, through the catalog for HF ids), the trainer
 * arguments (--trainer, --args or --llamafactory), the DeepSpeed config
 * (--deepspeed or the trainer's `deepspeed:`); check that it loads, print it.
 * The data-parallel degree is never read from these files. */
#include "cli_import.h"
#include "import.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: mmguard import [--hf DIR|config.json|HF-ID] [--deepspeed ds_config.json]\n"
          "                      [--trainer FILE | --args \"--flag value ...\"|@FILE |\n"
          "                       --llamafactory train.yaml | --torchtitan train.toml |\n"
          "                       --swift sft.sh]\n"
          "                      [--catalog DIR] [--name NAME]\n"
          "                      [--set SECTION.KEY=VALUE]... [--allow-unknown] [-o SPEC.yaml]\n"
          "  Write an mmguard spec from the files of a training job.  Every value says\n"
          "  where it came from; what was assumed and every input key ignored (and why)\n"
          "  are listed on top.  Unknown or unsupported keys are errors (file:line).\n"
          "  --hf            the model: a directory with config.json (and\n"
          "                  preprocessor_config.json), a config.json, or an HF id of the\n"
          "                  catalog; default: the trainer's model_name_or_path\n"
          "  --deepspeed     a DeepSpeed config (\"auto\" resolved as transformers does)\n"
          "  --trainer       HF TrainingArguments / TRL SFTConfig keys (JSON or YAML)\n"
          "  --args          the same as command-line flags (LLaVA's finetune.sh);\n"
          "                  @FILE reads them from FILE\n"
          "  --llamafactory  a LLaMA-Factory training YAML\n"
          "  --torchtitan    a torchtitan job config (TOML: the model flavor, FSDP2, AC)\n"
          "  --swift         a shell script running `swift sft` (ms-swift's flags, MAX_PIXELS)\n"
          "  --catalog DIR   where HF ids are looked up (DIR/catalog.txt: \"ID FILE\" lines);\n"
          "                  default $MMGUARD_CATALOG, the installed catalog, contrib/models\n"
          "  --set           override a value of the written spec: a module by name\n"
          "                  (vision_tower, projector, language_model) or a section\n"
          "                  (training, deepspeed, fsdp, ddp), e.g. --set training.seq_len=4096\n"
          "  --allow-unknown list unknown input keys instead of refusing them\n"
          "  -o FILE         write there instead of standard output\n",
          f);
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
                         ? &s->deepspeed : !strcmp(sec, "fsdp") ? &s->fsdp
                         : !strcmp(sec, "ddp") ? &s->ddp
                         : !strcmp(sec, "framework") ? &s->framework : NULL;
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

typedef struct opts {
    const char *hf, *ds, *trainer, *args, *lf, *titan, *swift, *catalog, *out, *name, *sets[64];
    int nsets, allow;
} opts;

/* 1 done (help), 0 go on, -1 bad usage */
static int parse(int argc, char **argv, opts *o)
{
    memset(o, 0, sizeof *o);
    struct { const char *flag; const char **dst; } v[] = {
        {"--hf", &o->hf}, {"--deepspeed", &o->ds}, {"--trainer", &o->trainer}, {"--args", &o->args},
        {"--llamafactory", &o->lf}, {"--torchtitan", &o->titan},
        {"--swift", &o->swift}, {"--catalog", &o->catalog}, {"-o", &o->out}, {"--name", &o->name}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        size_t k, nv = sizeof v / sizeof v[0];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return usage(stdout), 1;
        if (!strcmp(a, "--allow-unknown")) {
            o->allow = 1;
            continue;
        }
        if (i + 1 < argc && !strcmp(a, "--set") && o->nsets < 64) {
            o->sets[o->nsets++] = argv[++i];
            continue;
        }
        for (k = 0; k < nv && (i + 1 >= argc || strcmp(a, v[k].flag) || *v[k].dst); k++)
            ;
        if (k == nv) {
            fprintf(stderr, "mmguard import: unexpected argument '%s'%s\n", a,
                    i + 1 < argc ? "" : " (missing its value, or given twice)");
            return usage(stderr), -1;
        }
        *v[k].dst = argv[++i];
    }
    if (!!o->trainer + !!o->args + !!o->lf + !!o->titan + !!o->swift > 1) {
        fprintf(stderr, "mmguard import: give one of --trainer, --args, --llamafactory, "
                        "--torchtitan, --swift\n");
        return -1;
    }
    if (!o->hf && !o->trainer && !o->args && !o->lf && !o->titan && !o->swift) {
        fprintf(stderr, "mmguard import: give a model (--hf) or a trainer file naming one\n");
        return usage(stderr), -1;
    }
    return 0;
}

/* the DeepSpeed config: --deepspeed, else the trainer's `deepspeed:` */
static int read_ds(imp_job *j, const opts *o, mm_error *e)
{
    if (o->ds) {
        if (j->ds_path[0])
            imp_note(j->s, "ignored %s: --deepspeed %s given instead", j->ds_where, o->ds);
        return imp_deepspeed(j, o->ds, e);
    }
    if (!j->ds_path[0])
        return 0;
    if (imp_deepspeed(j, j->ds_path, e) == 0)
        return 0;
    size_t n = strlen(j->ds_path);
    if (!strncmp(e->msg, j->ds_path, n) && (!strncmp(e->msg + n, ": cannot open", 13) ||
                                            !strncmp(e->msg + n, ": not a regular file", 20))) {
        char m[sizeof e->msg];
        snprintf(m, sizeof m, "%s", e->msg);
        mm_err(e, "%s: %s (the path as given or beside the file naming it; --deepspeed FILE "
                  "gives it)", j->ds_where, m);
    }
    return -1;
}

static int read_inputs(imp_job *j, const opts *o, mm_error *e)
{
    if (o->catalog)
        snprintf(j->catalog, sizeof j->catalog, "%s", o->catalog);
    if (o->hf && imp_model(j, o->hf, "--hf", e))
        return -1;
    if ((o->trainer && imp_trainer(j, o->trainer, e)) || (o->args && imp_args(j, o->args, e)) ||
        (o->lf && imp_llamafactory(j, o->lf, e)) || (o->titan && imp_torchtitan(j, o->titan, e)) ||
        (o->swift && imp_swift(j, o->swift, e)))
        return -1;
    if (!j->have_model) {
        mm_err(e, "no model: give --hf, or model_name_or_path in %s", j->trainer_file);
        return -1;
    }
    if (read_ds(j, o, e))
        return -1;
    imp_job_finish(j);
    return 0;
}

static int write_spec(const imp_spec *s, const char *out)
{
    mm_error e;
    char *yaml = imp_emit(s);
    mm_spec *spec = yaml ? mm_spec_load_buffer(yaml, strlen(yaml), out ? out : "<import>",
                                               MM_FMT_YAML, &e) : NULL;
    if (!spec) {
        fprintf(stderr, "mmguard import: the written spec does not load: %s\n%s",
                yaml ? e.msg : "out of memory", yaml ? yaml : "");
        free(yaml);
        return 2;
    }
    mm_spec_free(spec);
    FILE *f = out ? fopen(out, "w") : stdout;
    int rc = 0;
    if (!f || fputs(yaml, f) < 0 || (out && fclose(f))) {
        fprintf(stderr, "mmguard import: cannot write %s\n", out ? out : "standard output");
        rc = 2;
    }
    free(yaml);
    return rc;
}

int mm_cli_import(int argc, char **argv)
{
    opts o;
    int p = parse(argc, argv, &o);
    if (p)
        return p > 0 ? 0 : 2;
    imp_spec *s = calloc(1, sizeof *s);
    imp_job *j = calloc(1, sizeof *j);
    int rc = 2;
    mm_error e;
    if (!s || !j)
        goto done;
    imp_init_zeroed(s);
    imp_job_init(j, s);
    s->allow_unknown = o.allow;
    if (read_inputs(j, &o, &e)) {
        fprintf(stderr, "mmguard import: %s\n", e.msg);
        goto done;
    }
    mm_strlcpy(s->name, o.name ? o.name : "imported", sizeof s->name);
    for (int i = 0; i < o.nsets; i++)
        if (apply_set(s, o.sets[i]))
            goto done;
    rc = write_spec(s, o.out);
done:
    free(j);
    free(s);
    return rc;
}
