/* import_rd.h - shared by the readers of a job's other files (DeepSpeed,
 * trainer arguments, LLaMA-Factory): a table of the input keys that are not
 * mapped to a spec key, each ignored with the reason it does not change GPU
 * memory, accepted only at the default the predictor models, or refused;
 * every other unread key is an error with file:line. */
#ifndef MM_IMPORT_RD_H
#define MM_IMPORT_RD_H

#include "hf.h"
#include "keys.h"

typedef struct imp_rule {
    const char *key;
    char kind;          /* 'i' ignored, 'd' only its default, 'r' refused */
    const char *arg;    /* 'i' and 'r': why; 'd': "DEFAULT|why the default is what is modelled" */
} imp_rule;

/* every key of h not read: by the rules, else unknown (an error unless
 * --allow-unknown); `what` names the input kind in the message */
int imp_rules_finish(hfc *h, const imp_rule *rules, size_t n, const char *what);
/* only the keys of h that the rules name (LLaMA-Factory's own table before
 * the trainer's) */
int imp_rules_apply(hfc *h, const imp_rule *rules, size_t n, const char *what);
/* a document that must be a mapping; recorded as a source; NULL with err */
mm_node *imp_parse_map(imp_job *j, const char *buf, size_t len, const char *name, int json,
                       const char *what, mm_error *err);
/* read path and hand it to a buffer reader */
typedef int (*imp_buffer_fn)(imp_job *j, const char *buf, size_t len, const char *name,
                             mm_error *err);
int imp_read_with(imp_job *j, const char *path, imp_buffer_fn fn, mm_error *err);
/* a JSON "auto" */
int imp_is_auto(const mm_node *v);
/* a number (int or float, "5e8" style); NaN-free; fails at key */
int imp_num(hfc *h, const char *key, double def, double *out);
/* a non-negative integer that may be written 5e8 or 1e9 (JSON floats) */
int imp_u64(hfc *h, const char *key, uint64_t def, uint64_t min, uint64_t max, uint64_t *out);
/* true/false, also the strings "true"/"false"/"True"/"False" of command-line values */
int imp_bool(hfc *h, const char *key, int def, int *out);
/* "file:line:col" of a key, for messages that point at another file */
void imp_where_key(const hfc *h, const char *key, char *buf, size_t n);

/* trainer keys (import_trainer_rules.c): the mapped ones, then the rest by the
 * trainer table; the LLaMA-Factory reader calls both on its own map */
int imp_trainer_map(imp_job *j, hfc *h);
int imp_trainer_finish(imp_job *j, hfc *h);
/* model_name_or_path: the model when none was given yet (import_trainer.c) */
int imp_trainer_model(imp_job *j, hfc *h);
/* batch, precision, checkpointing, optimizer, sequence (import_trainer.c) */
int imp_trainer_core(imp_job *j, hfc *h);
/* attention, Liger, packing, compile, deepspeed, fsdp, ddp (import_trainer_opt.c) */
int imp_trainer_opt(imp_job *j, hfc *h);
/* the ddp: keys are dropped (with a note) once DeepSpeed or FSDP wraps the model */
void imp_ddp_finish(imp_job *j);
/* LLaVA's ModelArguments / TrainingArguments (import_llava.c) */
int imp_llava(imp_job *j, hfc *h);
/* LLaMA-Factory's other keys, then the trainer's (import_lf_rules.c) */
int imp_lf_finish(imp_job *j, hfc *h);
/* a path named in an input file: as given if it exists, else relative to
 * that file's directory */
void imp_resolve_path(const char *file, const char *path, char *out, size_t n);
/* the module of a type when the model has one (never creates it) */
imp_section *imp_find_module(imp_spec *s, const char *type);
/* import_liger.c: a job's Liger switch `key` (on) -> training.liger_kernel or the fused
 * loss, by the model type; instance: the HF Trainer's patch of the built model (reads
 * liger_kernel_config), else LLaMA-Factory's class patch before it is built */
int imp_liger(imp_job *j, hfc *h, const char *key, int instance);

/* shell words as a shell splits them (quotes, backslash-newline, # comments),
 * each with its line and column (import_args.c) */
typedef struct imp_lexer {
    const char *p, *end;
    int line, col;
} imp_lexer;
/* the next word into out (n bytes): 1, 0 at the end, -1 on an unterminated quote */
int imp_lex_word(imp_lexer *x, char *out, size_t n, int *line, int *col);

/* zero_optimization of a DeepSpeed config (import_ds_zero.c); hidden: the
 * model's width for "auto" (0: none imported) */
int imp_ds_zero(imp_job *j, hfc *z, uint64_t hidden);

#endif
