/* fuzz_config.c - libFuzzer: the plugin configuration parser
 * (spank_plugin/config.c, linked alone: it has no Slurm dependency).
 * First byte selects the entry point:
 *   even: the rest is a config file: written to a private temporary file and
 *         loaded with mmg_config_load_file, then mmg_config_finish;
 *   odd:  the rest is split at '\n' into plugstack.conf arguments for
 *         mmg_config_parse_args ("config=" arguments are pointed at the same
 *         temporary file holding the other half of the input).
 * Then the derived values are exercised (usable bytes, margin string, lookup). */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include "config.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char tmp_path[64];
static int tmp_fd = -1;

static void tmp_remove(void)
{
    if (tmp_fd >= 0)
        unlink(tmp_path);
}

static void tmp_write(const uint8_t *d, size_t n)
{
    if (tmp_fd < 0) {
        snprintf(tmp_path, sizeof tmp_path, "/tmp/mmguard-fuzz-conf-XXXXXX");
        tmp_fd = mkstemp(tmp_path);
        if (tmp_fd < 0)
            FUZZ_FAIL("contract at this line");
        atexit(tmp_remove);
    }
    if (ftruncate(tmp_fd, 0) != 0 || pwrite(tmp_fd, d, n, 0) != (ssize_t)n)
        FUZZ_FAIL("contract at this line");
}

static void exercise(const struct mmg_config *c)
{
    char buf[128];
    static const char *const names[] = {"h100", "H200", "a100-40g", "", "nope"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const struct mmg_gpu *g = mmg_config_gpu(c, names[i]);
        if (g && mmg_config_usable(c, g->bytes) > g->bytes)
            FUZZ_FAIL("contract at this line");
    }
    mmg_config_margin_str(c, buf, sizeof buf);
    mmg_config_margin_str(c, buf, 3);
    (void)mmg_action_name(c->action);
    if (c->n_gpus > MMG_MAX_GPU_TYPES)
        FUZZ_FAIL("contract at this line");
    for (size_t i = 0; i < c->n_gpus; i++)
        if (!memchr(c->gpus[i].name, '\0', sizeof c->gpus[i].name))
            FUZZ_FAIL("contract at this line");
    if (!memchr(c->default_gpu, '\0', sizeof c->default_gpu) ||
        !memchr(c->log_path, '\0', sizeof c->log_path) ||
        !memchr(c->ctld_log, '\0', sizeof c->ctld_log) ||
        !memchr(c->resize_types, '\0', sizeof c->resize_types))
        FUZZ_FAIL("contract at this line");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 2 * MMG_CONF_MAX_BYTES)
        return 0;
    struct mmg_config c;
    char err[512];
    err[0] = '\0';
    int mode = data[0] & 1;
    data++;
    size--;
    if (mode == 0) {
        tmp_write(data, size);
        mmg_config_defaults(&c);
        if (mmg_config_load_file(&c, tmp_path, err, sizeof err) == 0)
            (void)mmg_config_finish(&c, err, sizeof err);
        if (!memchr(err, '\0', sizeof err))
            FUZZ_FAIL("contract at this line");
        exercise(&c);
        return 0;
    }
    /* argv mode: arguments up to the first NUL; the bytes after it are the file */
    const uint8_t *nul = memchr(data, '\0', size);
    size_t alen = nul ? (size_t)(nul - data) : size;
    if (nul)
        tmp_write(nul + 1, size - alen - 1);
    else
        tmp_write((const uint8_t *)"", 0);
    char *args = malloc(alen + 1);
    char **av = malloc((alen + 1) * sizeof *av);
    if (!args || !av)
        FUZZ_FAIL("contract at this line");
    memcpy(args, data, alen);
    args[alen] = '\0';
    int ac = 0;
    char conf_arg[80];
    snprintf(conf_arg, sizeof conf_arg, "config=%s", tmp_path);
    for (char *a = args, *nl; a; a = nl) {
        nl = strchr(a, '\n');
        if (nl)
            *nl++ = '\0';
        av[ac++] = strncmp(a, "config=", 7) == 0 ? conf_arg : a;
    }
    (void)mmg_config_parse_args(&c, ac, av, err, sizeof err);
    if (!memchr(err, '\0', sizeof err))
        FUZZ_FAIL("contract at this line");
    exercise(&c);
    free(av);
    free(args);
    return 0;
}
