/* toml.h (layer import) - the TOML subset of torchtitan's job configs, read
 * into node.h's tree (toml.c says what is read and what is refused). */
#ifndef MM_TOML_H
#define MM_TOML_H

#include <stddef.h>
#include "node.h"

/* the document as a map of tables; NULL with "name:line:col: problem" */
mm_node *mm_toml_parse(const char *buf, size_t len, const char *name, mm_error *err);

#endif
