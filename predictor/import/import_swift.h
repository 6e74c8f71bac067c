/* import_swift.h (layer import) - an ms-swift `swift sft` command line: split
 * into its environment, ms-swift's own flags and the HF TrainingArguments
 * flags (import_swift.c), then mapped (import_swift_rules.c). */
#ifndef MM_IMPORT_SWIFT_H
#define MM_IMPORT_SWIFT_H

#include "import_rd.h"

typedef struct swift_cmd {
    mm_node *swift, *trainer, *env; /* maps: ms-swift's flags, TrainingArguments, NAME=VALUE */
    int line, col;                  /* the `swift` word */
} swift_cmd;

/* ms-swift's own flag (read by import_swift_rules.c), not a TrainingArguments one */
int imp_swift_owns(const char *key);
int imp_swift_split(swift_cmd *c, const char *buf, size_t len, const char *name, mm_error *err);
void imp_swift_cmd_free(swift_cmd *c);

#endif
