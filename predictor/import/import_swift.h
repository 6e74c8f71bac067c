/* import_swift.h (layer import) - an ms-swift `swift sft` command line: split
 * into its environment, ms-swift's own flags and the HF TrainingArguments
 * flags (import_swift.c), then mapped (import_swift_rules.c). */
#ifndef MM_IMPORT_SWIFT_H
#define MM_IMPORT_SWIFT_H

#include "import_rd.h"

/* 1: ms-swift's own flag (import_swift_rules.c reads it), 0: a TrainingArguments one */
typedef int (*swift_owns_fn)(const char *key);

typedef struct swift_cmd {
    mm_node *swift, *trainer, *env; /* maps: ms-swift's flags, TrainingArguments, NAME=VALUE */
    int line, col;                  /* the `swift` word */
    swift_owns_fn owns;
} swift_cmd;

int imp_swift_split(swift_cmd *c, const char *buf, size_t len, const char *name,
                    swift_owns_fn owns, mm_error *err);
void imp_swift_cmd_free(swift_cmd *c);
/* the Qwen2/2.5-VL video variables (VIDEO_*_PIXELS, FPS*): video_frames and a
 * frame's bounds (import_swift_video.c) */
int imp_swift_video(imp_job *j, hfc *env);

#endif
