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
    imp_section training, deepspeed, fsdp, framework;
    char sources[8][600];           /* input files with their sha256 */
    size_t nsources;
    char notes[IMP_MAX_NOTES][240]; /* "assumed: ..." / "ignored: ..." lines */
    size_t nnotes;
    int allow_unknown;              /* unknown input keys are notes, not errors */
} imp_spec;

void imp_init(imp_spec *s);
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
void imp_training_defaults(imp_spec *s);
/* read a whole regular file (limit MM_MAX_SPEC_BYTES); NULL with err */
char *imp_read_file(const char *path, size_t *len, mm_error *err);

#endif
