/* cli_fit.h - `mmguard fit`: what would fit on a card, in words or JSON. */
#ifndef MM_CLI_FIT_H
#define MM_CLI_FIT_H
#include "mmguard.h"
/* What fits `s` on a card of gpu bytes, `usable` after the margin (mm_fit).
 * Exit code: 0 the spec runs (with or without flushes), 1 out of memory, 2
 * error. */
int mm_cli_fit(mm_spec *s, uint64_t gpu, uint64_t usable, int json);
#endif
