/* parse_u32.h - one strict reader of unsigned decimal option values, shared by
 * the configuration (config.c) and the GPU request (request.c) parsers. */
#ifndef MMG_PARSE_U32_H
#define MMG_PARSE_U32_H

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

/* Digits only (no sign, no blanks, nothing after), in [lo, hi]: 0, else -1. */
static inline int mmg_parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    char *end = NULL;
    unsigned long long v;
    if (!isdigit((unsigned char)s[0]))
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        return -1;
    *out = (uint32_t)v;
    return 0;
}

#endif
