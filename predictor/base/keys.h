/* keys.h - table-driven decoding of one mapping of the document tree.
 *
 * Why: every section of a spec (modules, training, deepspeed, fsdp, ...) is a
 * table of keys with a type, a range and the module kinds it applies to.  One
 * decoder checks them all the same way, so every error is
 * "file:line:col: key.path: what" with a "did you mean", and no key is ever
 * accepted without changing its field. */
#ifndef MM_KEYS_H
#define MM_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "mmguard.h"
#include "node.h"
#include "util.h"

typedef enum {
    K_UINT,     /* uint64_t */
    K_INT,      /* int64_t */
    K_INT32,    /* int */
    K_BOOL,     /* int 0/1 */
    K_FLOAT,    /* double */
    K_ENUM,     /* int index into enums */
    K_STRING,   /* char[128] */
    K_NAME,     /* char[MM_MAX_NAME], letters digits _ - */
    K_SIZE,     /* uint64_t bytes, "80GiB" */
    K_VERSION,  /* int[2] or int[3] (major, minor[, patch]) */
    K_LAYERS,   /* layer_set: a list of layer indices */
    K_SPECIAL   /* decoded by the caller (nested maps, lists of pairs, ...) */
} kkind;

typedef struct keydesc {
    const char *key;
    kkind kind;
    size_t off;
    double min, max;
    const char *const *enums;
    unsigned kinds;   /* module kinds it applies to (bit per mod_kind), 0 = any */
    int required;     /* required for those kinds */
    int nver;         /* K_VERSION: 2 or 3 components */
} keydesc;

typedef struct dctx {
    const char *file;
    mm_error *err;
} dctx;

int key_fail(dctx *c, const mm_node *at, const char *path, const char *fmt, ...) MM_PRINTF(4, 5);
int key_fail_key(dctx *c, const mm_node *map, size_t i, const char *path, const char *what);
const char *key_type_name(const mm_node *n);
/* "a.b" into buf */
const char *key_path(char *buf, size_t n, const char *prefix, const char *key);

/* One scalar into base + k->off. */
int key_decode_scalar(dctx *c, const keydesc *k, const mm_node *v, void *base, const char *path);
/* Every key of `map` against `keys`; `kinds` = the module kind bit (0 = not a
 * module; then every key applies); kind_name names it in errors.  seen[j] is
 * set for decoded keys.  K_SPECIAL keys are only marked seen. */
int key_decode_map(dctx *c, const mm_node *map, const keydesc *keys, size_t nkeys, void *base,
                   const char *prefix, unsigned kinds, const char *kind_name,
                   unsigned char *seen);
int key_check_required(dctx *c, const mm_node *map, const keydesc *keys, size_t nkeys,
                       const unsigned char *seen, const char *prefix, unsigned kinds);
/* strictly parse an unsigned integer (also 5e8 style, exact below 2^53) */
int key_parse_u64(const char *s, uint64_t *out);
/* the index of a key in a table (the entry that applies to `kinds` when a
 * name has one per module kind), or -1 */
int key_index(const keydesc *keys, size_t nkeys, const char *key, unsigned kinds);

#endif
