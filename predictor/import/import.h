/* import.h - the files users already have -> an mmguard spec.
 *
 * Readers (HF config.json + preprocessor_config.json, DeepSpeed ds_config,
 * trainer arguments, LLaMA-Factory YAML) fill one intermediate form: for each
 * spec section an ordered list of key = value with where it came from, plus
 * what was assumed and every input key that was ignored and why.  The
 * emitter (import_emit.c) writes it as a commented YAML spec, which is then
 * loaded like any spec. */
#ifndef MM_IMPORT_H
#define MM_IMPORT_H

#include <stddef.h>
#include "mmguard.h"
#include "node.h"

#define IMP_MAX_KV 96
#define IMP_MAX_NOTES 512

typedef struct imp_kv {
    char key[64];
    char val[1600];
    char from[160];     /* "vision_config.depth", "ds_config.json: zero_optimization.stage" */
} imp_kv;

typedef struct imp_section {
    char name[32];      /* module name, or training / deepspeed / fsdp / framework */
    char type[16];      /* module type; "" for sections */
    imp_kv kv[IMP_MAX_KV];
    size_t n;
} imp_section;

typedef struct imp_spec {
    char name[128];
    imp_section mod[MM_MAX_MODULES];
    size_t nmod;
    imp_section training, deepspeed, fsdp, ddp, framework;
    char sources[8][600];           /* input files with their sha256 */
    size_t nsources;
    char notes[IMP_MAX_NOTES][240]; /* "assumed: ..." / "ignored: ..." lines */
    size_t nnotes;
    int allow_unknown;              /* unknown input keys are notes, not errors */
} imp_spec;

void imp_init(imp_spec *s);
/* imp_init of an imp_spec already zeroed (calloc): the 2.4 MB are not cleared
 * twice (1.5 M instructions, and every page touched) */
void imp_init_zeroed(imp_spec *s);
/* set key = formatted value in a section (replacing an earlier value) */
void imp_set(imp_section *sec, const char *key, const char *from, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
const char *imp_get(const imp_section *sec, const char *key);
imp_section *imp_module(imp_spec *s, const char *type);
void imp_note(imp_spec *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void imp_source(imp_spec *s, const char *path, const char *buf, size_t len);

/* import_hf.c: config.json (and preprocessor_config.json beside it) */
int imp_hf(imp_spec *s, const char *config_path, mm_error *err);
int imp_hf_buffer(imp_spec *s, const char *buf, size_t len, const char *name,
                  const char *pre, size_t prelen, const char *prename, mm_error *err);
/* import_emit.c: the commented YAML spec (malloc'd) */
char *imp_emit(const imp_spec *s);

/* what a spec needs that no input gave: micro_batch_size 1, a sequence length,
 * one image per sample, bf16 - each stated as an assumption */
/* training values no input gave, each stated as an assumption; dynamic_size:
 * also assume LLaMA-Factory's default image size for dynamic-resolution towers */
void imp_training_defaults(imp_spec *s, int dynamic_size);
/* read a whole regular file (limit MM_MAX_SPEC_BYTES); NULL with err */
char *imp_read_file(const char *path, size_t *len, mm_error *err);

/* ---- the job's other files (import_job.c, import_rules.c, import_ds.c,
 * import_trainer.c, import_args.c, import_lf.c, import_catalog.c) ---------- */

/* What the trainer arguments said that the DeepSpeed config's "auto" values
 * take (transformers integrations/deepspeed.py trainer_config_process), and
 * the paths the trainer files name. */
typedef struct imp_job {
    imp_spec *s;
    int trainer;               /* trainer arguments were read */
    char trainer_file[512];    /* their file (or "--args") */
    int sft;                   /* TRL SFTConfig defaults apply */
    int lf;                    /* LLaMA-Factory */
    int llava;                 /* LLaVA's train.py arguments */
    int swift;                 /* an ms-swift `swift sft` command (import_swift*.c) */
    uint64_t micro_batch, grad_accum;   /* TrainingArguments (defaults 8, 1) */
    double max_grad_norm;               /* default 1.0 */
    int bf16, fp16;
    int zero_stage;            /* -1 until a DeepSpeed config is read */
    int fsdp;                  /* an FSDP config was read */
    int pure_bf16;             /* LLaMA-Factory pure_bf16 */
    int quantized;             /* 4/8-bit base weights */
    char finetuning[16];       /* LLaMA-Factory finetuning_type */
    char ds_path[1024];        /* `deepspeed:` of a trainer file, resolved */
    char ds_where[600];        /* "file:line:col: deepspeed" for errors */
    char model[512];           /* model_name_or_path */
    char model_where[600];
    char catalog[1024];        /* the catalog directory (--catalog or the default) */
    int have_model;            /* a model was imported (--hf, or model_name_or_path) */
    char model_type[48];       /* config.json model_type ("" for a preset) */
} imp_job;

void imp_job_init(imp_job *j, imp_spec *s);
/* the model: a directory with config.json, a config.json, or an id of the
 * catalog (import_catalog.c); `where` names the key for errors ("" = --hf) */
int imp_model(imp_job *j, const char *ref, const char *where, mm_error *err);
/* the catalog entry of an HF id: 1 found (path set), 0 not in it, -1 error */
int imp_catalog_find(const char *dir, const char *id, char *path, size_t n, mm_error *err);
/* the default catalog: $MMGUARD_CATALOG, the one beside the program (set by
 * imp_catalog_beside), the installed one, or contrib/models */
const char *imp_catalog_default(void);
/* the CLI: the directory of its own executable, whose tree's catalog comes next */
void imp_catalog_beside(const char *bindir);
/* a preset spec's modules (a catalog entry that is an mmguard spec) */
int imp_preset(imp_spec *s, const char *path, mm_error *err);

/* DeepSpeed ds_config.json (import_ds.c); trainer values fill "auto" */
int imp_deepspeed(imp_job *j, const char *path, mm_error *err);
int imp_deepspeed_buffer(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err);
/* HF TrainingArguments / TRL SFTConfig / LLaVA arguments as JSON or YAML
 * (import_trainer_rules.c), or as command-line flags (import_args.c: "@FILE"
 * reads the flags from FILE) */
int imp_trainer(imp_job *j, const char *path, mm_error *err);
int imp_trainer_buffer(imp_job *j, const char *buf, size_t len, const char *name, int json,
                       mm_error *err);
int imp_args(imp_job *j, const char *args, mm_error *err);
int imp_args_buffer(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err);
/* LLaMA-Factory train.yaml (import_lf.c) */
int imp_llamafactory(imp_job *j, const char *path, mm_error *err);
int imp_llamafactory_buffer(imp_job *j, const char *buf, size_t len, const char *name,
                            mm_error *err);
/* a torchtitan TOML job config (import_titan_rules.c, import_titan.c) */
int imp_torchtitan(imp_job *j, const char *path, mm_error *err);
int imp_torchtitan_buffer(imp_job *j, const char *buf, size_t len, const char *name,
                          mm_error *err);
/* an ms-swift `swift sft` command line in a shell script (import_swift*.c) */
int imp_swift(imp_job *j, const char *path, mm_error *err);
int imp_swift_buffer(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err);
/* after every input: what none of them said, stated as assumptions */
void imp_job_finish(imp_job *j);
/* remove a key from a section (a later input decides it) */
void imp_unset(imp_section *sec, const char *key);

#endif
