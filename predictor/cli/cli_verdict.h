/* cli_verdict.h - `mmguard check`'s verdict on a card, in words or JSON. */
#ifndef MM_CLI_VERDICT_H
#define MM_CLI_VERDICT_H
#include "mmguard.h"
/* Judge `s` on a card of gpu bytes, `usable` after the margin; `margin` as the
 * user wrote it (or NULL).  Exit code: 0 fits (with or without flushes), 1 out
 * of memory, 2 error. */
int mm_cli_check(mm_spec *s, uint64_t gpu, uint64_t usable, const char *margin, int json);
#endif
