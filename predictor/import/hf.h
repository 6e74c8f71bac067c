/* hf.h - reading one Hugging Face (sub-)config map: typed getters with the
 * config class's default when the key is absent (config.json files only
 * store values that differ from the class defaults), each marking the key as
 * used; then every unused key is either ignored with a reason or refused. */
#ifndef MM_HF_H
#define MM_HF_H

#include "import.h"
#include "util.h"

typedef struct hfc {
    imp_spec *s;
    const mm_node *map;       /* NULL: every value is the default */
    char path[64];            /* "vision_config", "" for the top level */
    const char *file;
    mm_error *err;
    unsigned char used[512];
} hfc;

void hfc_init(hfc *h, imp_spec *s, const mm_node *map, const char *path, const char *file,
              mm_error *err);
/* the value of key (marked used), or NULL when absent or null */
const mm_node *hf_node(hfc *h, const char *key);
/* "vision_config.depth" (the dotted place of key, for comments and errors) */
const char *hf_where(const hfc *h, const char *key, char *buf, size_t n);
int hf_u64(hfc *h, const char *key, uint64_t def, uint64_t *out);
int hf_i64(hfc *h, const char *key, int64_t def, int64_t *out);
int hf_bool(hfc *h, const char *key, int def, int *out);
int hf_f64(hfc *h, const char *key, double def, double *out);
/* a string; def when absent; out must hold 64 bytes */
int hf_str(hfc *h, const char *key, const char *def, char *out, size_t n);
/* an int or the first of [a, b] (image_size: 448 or [448, 448]) */
int hf_u64_or_pair(hfc *h, const char *key, uint64_t def, uint64_t *out);
/* a list of ints as "[a, b, ...]" and its length; absent: "" and 0 */
int hf_list(hfc *h, const char *key, char *out, size_t n, size_t *count);
/* an error at key */
int hf_fail(hfc *h, const char *key, const char *fmt, ...) MM_PRINTF(3, 4);
/* every key not read: ignored with its reason (a note), or an error */
int hf_finish(hfc *h);
/* submaps read by their own hfc count as used here */
void hf_mark(hfc *h, const char *key);

#endif
