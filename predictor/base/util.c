/* util.c - error formatting, sizes, margins, byte formatting and SHA-256.
 * Kept dependency-free so the SPANK plugin links nothing beyond libc,
 * json-c and libyaml. */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mm_err(mm_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
}

void mm_err_at(mm_error *err, const char *file, int line, int col, const char *fmt, ...)
{
    if (!err)
        return;
    const char *f = file ? file : "<spec>";
    int n;
    if (line > 0 && col > 0)
        n = snprintf(err->msg, sizeof err->msg, "%s:%d:%d: ", f, line, col);
    else if (line > 0)
        n = snprintf(err->msg, sizeof err->msg, "%s:%d: ", f, line);
    else
        n = snprintf(err->msg, sizeof err->msg, "%s: ", f);
    if (n < 0 || (size_t)n >= sizeof err->msg)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + n, sizeof err->msg - (size_t)n, fmt, ap);
    va_end(ap);
}

size_t mm_strlcpy(char *dst, const char *src, size_t n)
{
    size_t len = strlen(src);
    if (n) {
        size_t c = len < n - 1 ? len : n - 1;
        memcpy(dst, src, c);
        dst[c] = '\0';
    }
    return len;
}

unsigned mm_edit_distance(const char *a, const char *b)
{
    size_t la = strnlen(a, 64), lb = strnlen(b, 64);
    /* optimal string alignment: a swap of two letters costs 1 */
    unsigned pp[65], prev[65], cur[65];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = pp[j] = (unsigned)j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = (unsigned)i;
        for (size_t j = 1; j <= lb; j++) {
            int ai = tolower((unsigned char)a[i - 1]), bj = tolower((unsigned char)b[j - 1]);
            unsigned cost = ai != bj;
            unsigned v = prev[j] + 1;
            if (cur[j - 1] + 1 < v)
                v = cur[j - 1] + 1;
            if (prev[j - 1] + cost < v)
                v = prev[j - 1] + cost;
            if (i > 1 && j > 1 && ai == tolower((unsigned char)b[j - 2]) &&
                tolower((unsigned char)a[i - 2]) == bj && pp[j - 2] + 1 < v)
                v = pp[j - 2] + 1;
            cur[j] = v;
        }
        memcpy(pp, prev, (lb + 1) * sizeof pp[0]);
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

const char *mm_suggest(const char *word, const char *const *candidates, size_t n)
{
    const char *best = NULL;
    unsigned bestd = ~0u;
    for (size_t i = 0; i < n; i++) {
        unsigned d = mm_edit_distance(word, candidates[i]);
        if (d < bestd) {
            bestd = d;
            best = candidates[i];
        }
    }
    size_t len = strlen(word);
    unsigned limit = len <= 4 ? 1 : len <= 8 ? 2 : 3;
    if (bestd <= limit)
        return best;
    /* a truncated key ("micro_batch" for "micro_batch_size") */
    for (size_t i = 0; len >= 4 && i < n; i++)
        if (strncmp(candidates[i], word, len) == 0)
            return candidates[i];
    return NULL;
}

/* ---- sizes ------------------------------------------------------------------ */

struct unit {
    const char *name;
    uint64_t mult;
};
static const struct unit units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1000ull},
    {"kb", 1000ull},
    {"m", 1000000ull},
    {"mb", 1000000ull},
    {"g", 1000000000ull},
    {"gb", 1000000000ull},
    {"t", 1000000000000ull},
    {"tb", 1000000000000ull},
    {"kib", 1ull << 10},
    {"mib", 1ull << 20},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
};

int mm_parse_size(const char *s, uint64_t *out, mm_error *err)
{
    if (!s || !*s) {
        mm_err(err, "empty size");
        return -1;
    }
    const char *p = s;
    while (isspace((unsigned char)*p))
        p++;
    if (!isdigit((unsigned char)*p)) {
        mm_err(err, "'%s' is not a size (expected e.g. 80GiB, 81559MiB, 80GB)", s);
        return -1;
    }
    /* integer part, then optional fraction, parsed exactly in integers */
    uint64_t ip = 0;
    while (isdigit((unsigned char)*p)) {
        if (mm_mul(ip, 10, &ip) || mm_add(ip, (uint64_t)(*p - '0'), &ip)) {
            mm_err(err, "size '%s' is too large", s);
            return -1;
        }
        p++;
    }
    uint64_t frac = 0, fden = 1;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p)) {
            mm_err(err, "'%s' is not a size (digits expected after '.')", s);
            return -1;
        }
        while (isdigit((unsigned char)*p)) {
            if (fden < 1000000000ull) {
                frac = frac * 10 + (uint64_t)(*p - '0');
                fden *= 10;
            }
            p++;
        }
    }
    while (isspace((unsigned char)*p))
        p++;
    char unit[8];
    size_t ul = 0;
    while (*p && !isspace((unsigned char)*p) && ul < sizeof unit - 1)
        unit[ul++] = (char)tolower((unsigned char)*p++);
    unit[ul] = '\0';
    while (isspace((unsigned char)*p))
        p++;
    if (*p) {
        mm_err(err, "'%s' is not a size (trailing characters)", s);
        return -1;
    }
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(unit, units[i].name) != 0)
            continue;
        uint64_t v, f;
        if (mm_mul(ip, units[i].mult, &v)) {
            mm_err(err, "size '%s' overflows 64 bits", s);
            return -1;
        }
        /* fraction * mult / fden, without overflow for fden <= 1e9 */
        f = (units[i].mult / fden) * frac + ((units[i].mult % fden) * frac) / fden;
        if (mm_add(v, f, &v)) {
            mm_err(err, "size '%s' overflows 64 bits", s);
            return -1;
        }
        *out = v;
        return 0;
    }
    mm_err(err, "'%s': unknown unit '%s' (use B, KB/MB/GB/TB or KiB/MiB/GiB/TiB)", s, unit);
    return -1;
}

int mm_parse_margin(const char *s, mm_margin *out, mm_error *err)
{
    mm_margin m = {0, 0};
    if (!s || !*s) {
        mm_err(err, "empty margin");
        return -1;
    }
    size_t len = strlen(s);
    if (s[len - 1] == '%') {
        char buf[64];
        if (len >= sizeof buf) {
            mm_err(err, "margin '%s' is too long", s);
            return -1;
        }
        memcpy(buf, s, len - 1);
        buf[len - 1] = '\0';
        char *end;
        errno = 0;
        double v = strtod(buf, &end);
        if (end == buf || *end || errno || !isfinite(v) || v < 0 || v >= 100 ||
            !isdigit((unsigned char)buf[0])) {
            mm_err(err, "margin '%s' must be a percentage in [0, 100)", s);
            return -1;
        }
        m.percent = v;
    } else {
        if (mm_parse_size(s, &m.bytes, err) != 0) {
            char inner[sizeof err->msg];
            mm_strlcpy(inner, err ? err->msg : "", sizeof inner);
            mm_err(err, "margin: %s (use a percentage like 10%% or a size like 4GiB)", inner);
            return -1;
        }
    }
    *out = m;
    return 0;
}

uint64_t mm_usable_bytes(uint64_t gpu_mem, const mm_margin *m)
{
    if (!m)
        return gpu_mem;
    long double pct = (long double)gpu_mem * (long double)m->percent / 100.0L;
    uint64_t cut = pct >= (long double)gpu_mem ? gpu_mem : (uint64_t)ceill(pct);
    uint64_t left = gpu_mem - cut;
    return left > m->bytes ? left - m->bytes : 0;
}

void mm_format_bytes(uint64_t bytes, char *buf, size_t n)
{
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, n, "%llu B", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 6) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, n, "%.1f %s", v, names[u]);
}

/* ---- SHA-256 (FIPS 180-4) -------------------------------------------------- */

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

/* One 64-byte block.  Unrolled (the eight working variables rotate by
 * renaming instead of seven moves a round) with the usual reduced forms of
 * Ch and Maj (FIPS 180-4 4.1.2; equal bit for bit): 2.9 k instead of 3.9 k
 * instructions a block, a spec's sha256 being a quarter of loading it. */
#define SHA_ROUND(a, b, c, d, e, f, g, h, i)                                           \
    do {                                                                               \
        uint32_t t1_ = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + (g ^ (e & (f ^ g))) + \
                       K256[i] + w[i];                                                 \
        uint32_t t2_ = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) | (c & (a | b))); \
        d += t1_;                                                                      \
        h = t1_ + t2_;                                                                 \
    } while (0)

static void sha256_block(uint32_t h[8], const unsigned char *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; i += 8) {
        SHA_ROUND(a, b, c, d, e, f, g, hh, i);
        SHA_ROUND(hh, a, b, c, d, e, f, g, i + 1);
        SHA_ROUND(g, hh, a, b, c, d, e, f, i + 2);
        SHA_ROUND(f, g, hh, a, b, c, d, e, i + 3);
        SHA_ROUND(e, f, g, hh, a, b, c, d, i + 4);
        SHA_ROUND(d, e, f, g, hh, a, b, c, i + 5);
        SHA_ROUND(c, d, e, f, g, hh, a, b, i + 6);
        SHA_ROUND(b, c, d, e, f, g, hh, a, i + 7);
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += hh;
}

void mm_sha256_hex(const void *data, size_t len, char out[65])
{
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    const unsigned char *p = data;
    size_t left = len;
    while (left >= 64) {
        sha256_block(h, p);
        p += 64;
        left -= 64;
    }
    unsigned char tail[128] = {0};
    memcpy(tail, p, left);
    tail[left] = 0x80;
    size_t tl = left + 1 + 8 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++)
        tail[tl - 1 - i] = (unsigned char)(bits >> (8 * i));
    sha256_block(h, tail);
    if (tl == 128)
        sha256_block(h, tail + 64);
    static const char hex[] = "0123456789abcdef"; /* "%08x" each, without printf */
    for (int i = 0; i < 64; i++)
        out[i] = hex[(h[i / 8] >> (28 - 4 * (i % 8))) & 15];
    out[64] = '\0';
}
