/* family.h - model families as data: for each module kind, a table of named
 * block defaults (norm, attention layout, MLP, position embedding, patch
 * embedding, connector kind, image processor).  A spec names a family and
 * overrides any default key by key; adding a family is one table row. */
#ifndef MM_FAMILY_H
#define MM_FAMILY_H

#include "spec.h"

typedef struct family_def {
    const char *name;
    mod_kind kind;
    const char *hf;               /* the Hugging Face classes it mirrors */
    void (*apply)(module_spec *m);
} family_def;

/* Families of a kind (NULL-terminated names for suggestions). */
const family_def *family_find(mod_kind k, const char *name);
const family_def *family_default(mod_kind k);
size_t family_names(mod_kind k, const char **out, size_t cap);
const family_def *family_at(mod_kind k, int index);

#endif
