/* util.h - internal helpers shared by the library: errors, checked 64-bit
 * arithmetic, string utilities.  Not part of the public API. */
#ifndef MM_UTIL_H
#define MM_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stddef.h>
#include "mmguard.h"

#if defined(__GNUC__)
#define MM_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MM_PRINTF(a, b)
#endif

/* Write "file:line:col: " + fmt into err (line/col skipped when <= 0). */
void mm_err_at(mm_error *err, const char *file, int line, int col, const char *fmt, ...)
    MM_PRINTF(5, 6);
void mm_err(mm_error *err, const char *fmt, ...) MM_PRINTF(2, 3);

/* Checked arithmetic: return 0 on success, -1 on overflow (result untouched). */
static inline int mm_add(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r) ? -1 : 0;
}
static inline int mm_mul(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r) ? -1 : 0;
}
/* Saturating versions for accumulators whose inputs were already checked. */
static inline uint64_t mm_sat_add(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t mm_sat_mul(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t mm_ceil_div(uint64_t a, uint64_t b)
{
    return b ? a / b + (a % b != 0) : a;
}

/* strlcpy-like copy that always terminates; returns strlen(src). */
size_t mm_strlcpy(char *dst, const char *src, size_t n);
/* Levenshtein distance (small strings only; capped at 64 chars). */
unsigned mm_edit_distance(const char *a, const char *b);
/* The candidate closest to `word` if close enough to suggest, else NULL. */
const char *mm_suggest(const char *word, const char *const *candidates, size_t n);

#endif
