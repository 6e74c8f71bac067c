/* node.h - a small document tree with source positions.  YAML (libyaml) and
 * JSON (json-c) are both loaded into it so that one decoder (spec.c) checks
 * every key and reports "file:line:col: key: problem" for either format. */
#ifndef MM_NODE_H
#define MM_NODE_H

#include <stddef.h>
#include "mmguard.h"

typedef enum { MM_NODE_SCALAR, MM_NODE_MAP, MM_NODE_SEQ } mm_node_type;

typedef struct mm_node {
    mm_node_type type;
    int line, col;
    /* scalar */
    char *str;
    int quoted;          /* a quoted YAML scalar or a JSON string: always a string */
    int is_null;         /* YAML ~/null, JSON null */
    /* map: keys[i] -> vals[i]; seq: vals[i] */
    size_t n, cap;
    char **keys;
    int *key_line, *key_col;
    struct mm_node **vals;
} mm_node;

mm_node *mm_node_new(mm_node_type t, int line, int col);
void mm_node_free(mm_node *n);
mm_node *mm_node_clone(const mm_node *n);
/* map helpers; return NULL / -1 on failure */
mm_node *mm_node_get(const mm_node *map, const char *key);
int mm_node_map_put(mm_node *map, const char *key, mm_node *val, int line, int col);
int mm_node_seq_push(mm_node *seq, mm_node *val);

/* Parse a buffer; `name` is used in error messages. */
mm_node *mm_yaml_parse(const char *buf, size_t len, const char *name, mm_error *err);
mm_node *mm_json_parse(const char *buf, size_t len, const char *name, mm_error *err);

#endif
