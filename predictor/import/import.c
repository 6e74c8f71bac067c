/* import.c - the intermediate form the readers fill (see import.h) and
 * reading input files with the same limits as specs. */
#include "import.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void imp_init(imp_spec *s)
{
    memset(s, 0, sizeof *s);
    imp_init_zeroed(s);
}

void imp_init_zeroed(imp_spec *s)
{
    mm_strlcpy(s->training.name, "training", sizeof s->training.name);
    mm_strlcpy(s->deepspeed.name, "deepspeed", sizeof s->deepspeed.name);
    mm_strlcpy(s->fsdp.name, "fsdp", sizeof s->fsdp.name);
    mm_strlcpy(s->ddp.name, "ddp", sizeof s->ddp.name);
    mm_strlcpy(s->framework.name, "framework", sizeof s->framework.name);
}

void imp_set(imp_section *sec, const char *key, const char *from, const char *fmt, ...)
{
    size_t i;
    for (i = 0; i < sec->n; i++)
        if (strcmp(sec->kv[i].key, key) == 0)
            break;
    if (i == sec->n) {
        if (sec->n == IMP_MAX_KV)
            return;
        sec->n++;
    }
    imp_kv *kv = &sec->kv[i];
    mm_strlcpy(kv->key, key, sizeof kv->key);
    mm_strlcpy(kv->from, from ? from : "", sizeof kv->from);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv->val, sizeof kv->val, fmt, ap);
    va_end(ap);
}

const char *imp_get(const imp_section *sec, const char *key)
{
    for (size_t i = 0; i < sec->n; i++)
        if (strcmp(sec->kv[i].key, key) == 0)
            return sec->kv[i].val;
    return NULL;
}

imp_section *imp_module(imp_spec *s, const char *type)
{
    for (size_t i = 0; i < s->nmod; i++)
        if (strcmp(s->mod[i].type, type) == 0)
            return &s->mod[i];
    if (s->nmod == MM_MAX_MODULES)
        return &s->mod[s->nmod - 1];
    /* a slot past nmod is still as imp_init left it, zero: nmod only grows
     * (clearing its 175 KB again was 0.18 M instructions per module) */
    imp_section *m = &s->mod[s->nmod++];
    mm_strlcpy(m->type, type, sizeof m->type);
    static const char *const names[][2] = {{"vision", "vision_tower"},
                                           {"connector", "projector"},
                                           {"decoder", "language_model"}};
    for (size_t k = 0; k < 3; k++)
        if (strcmp(type, names[k][0]) == 0)
            mm_strlcpy(m->name, names[k][1], sizeof m->name);
    return m;
}

void imp_note(imp_spec *s, const char *fmt, ...)
{
    if (s->nnotes == IMP_MAX_NOTES)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->notes[s->nnotes++], sizeof s->notes[0], fmt, ap);
    va_end(ap);
}

void imp_source(imp_spec *s, const char *path, const char *buf, size_t len)
{
    if (s->nsources == 8)
        return;
    char hex[65];
    mm_sha256_hex(buf, len, hex);
    snprintf(s->sources[s->nsources++], sizeof s->sources[0], "%s (sha256 %s)", path, hex);
}

char *imp_read_file(const char *path, size_t *len, mm_error *err)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        mm_err(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        mm_err(err, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size > (off_t)MM_MAX_SPEC_BYTES) {
        mm_err(err, "%s: %lld bytes, larger than the %u-byte limit", path,
               (long long)st.st_size, MM_MAX_SPEC_BYTES);
        close(fd);
        return NULL;
    }
    char *buf = malloc((size_t)st.st_size + 1);
    size_t n = 0;
    if (!buf) {
        mm_err(err, "%s: out of memory", path);
        close(fd);
        return NULL;
    }
    while (n <= (size_t)st.st_size) {
        ssize_t r = read(fd, buf + n, (size_t)st.st_size + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            mm_err(err, "%s: read error: %s", path, strerror(errno));
            free(buf);
            close(fd);
            return NULL;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (n > (size_t)st.st_size) { /* grew while reading */
        mm_err(err, "%s: changed while being read", path);
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n)) {
        mm_err(err, "%s: contains a NUL byte (binary file?)", path);
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

void imp_training_defaults(imp_spec *s, int dynamic_size)
{
    imp_section *t = &s->training;
    int vlm = 0;
    for (size_t i = 0; i < s->nmod; i++)
        vlm |= !strcmp(s->mod[i].type, "vision") && s->mod[i].n;
    if (!imp_get(t, "micro_batch_size"))
        imp_set(t, "micro_batch_size", "assumed (no trainer arguments)", "1");
    const char *ip = NULL;
    for (size_t i = 0; i < s->nmod; i++)
        if (!strcmp(s->mod[i].type, "vision"))
            ip = imp_get(&s->mod[i], "image_processor");
    /* anyres images reach ~7.4k tokens at the largest grid (LLaVA-OneVision), a
     * 1024-px Pixtral image 4160 ([IMG] + [IMG_BREAK] / [IMG_END]) */
    if (!imp_get(t, "seq_len"))
        imp_set(t, "seq_len", "assumed (no sequence length given): the longest sample, images included",
                "%s", !vlm ? "2048" : ip && (strstr(ip, "anyres") || strstr(ip, "pixtral"))
                                          ? "8192" : "4096");
    if (vlm && !imp_get(t, "images_per_sample"))
        imp_set(t, "images_per_sample", "assumed: one image per sample", "1");
    if (dynamic_size && vlm && ip && strstr(ip, "dynamic") && !imp_get(t, "image_size"))
        imp_set(t, "image_size", "assumed: LLaMA-Factory's image_max_pixels default (768 x 768)",
                "[768, 768]");
    if (!imp_get(t, "precision"))
        imp_set(t, "precision", "assumed: bf16", "bf16");
}
