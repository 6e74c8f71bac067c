/* main.c - the mmguard command line: predict, check, fit, bench (and report).
 * Exit codes: 0 ok / fits, 1 does not fit, 2 bad input or usage. */
#include "mmguard.h"
#include "cli.h"
#include "cli_html.h"
#include "cli_fit.h"
#include "cli_verdict.h"
#include "import.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_SETS 64

typedef struct opts {
    const char *spec;
    const char *sets[MAX_SETS];
    int nsets;
    int json, pretty, layers;
    const char *gpu_mem, *margin, *html;
    long iterations;
} opts;

static void usage_main(FILE *f)
{
    fprintf(f,
            "usage: mmguard <command> [options]\n"
            "\n"
            "Predict the peak GPU memory of one training step of a (multimodal) model.\n"
            "\n"
            "commands:\n"
            "  predict SPEC [--set KEY=VALUE]... [--json] [--layers] [--html FILE [--gpu-mem SIZE]]\n"
            "  check   SPEC --gpu-mem SIZE [--margin 10%%|4GiB] [--set KEY=VALUE]...\n"
            "  fit     SPEC --gpu-mem SIZE [--margin 10%%|4GiB] [--set KEY=VALUE]... [--json]\n"
            "  report  LOG... [--json]\n"
            "  bench   SPEC [--iterations N]\n"
            "  alloc-replay TRACE [--alloc-conf CONF] [--capacity SIZE] [--memory-fraction F]\n"
            "               [--stop-at-oom] [--json]\n"
            "  import  --hf DIR|config.json [--set SECTION.KEY=VALUE]... [-o SPEC]\n"
            "\n"
            "  mmguard <command> --help   details of a command\n"
            "  mmguard --version\n");
}

static void usage_cmd(const char *cmd, FILE *f)
{
    if (!strcmp(cmd, "predict"))
        fprintf(f,
                "usage: mmguard predict SPEC [--set KEY=VALUE]... [--json [--pretty]] [--layers]\n"
                "                       [--html FILE [--gpu-mem SIZE]]\n"
                "  Predict the per-GPU peak of one steady-state training step and show where it\n"
                "  comes from, by module and factor.\n"
                "  --set KEY=VALUE  override any dotted key of the spec; modules by name, e.g.\n"
                "                   --set training.micro_batch_size=8\n"
                "                   --set language_model.num_hidden_layers=40\n"
                "  --json           machine-readable output (schema in the README)\n"
                "  --layers         list every layer row in the table\n"
                "  --html FILE      also write the step as a picture (self-contained HTML/SVG):\n"
                "                   live bytes by factor and module, reserved, the peak;\n"
                "                   --gpu-mem SIZE adds the card's capacity line\n");
    else if (!strcmp(cmd, "check"))
        fprintf(f,
                "usage: mmguard check SPEC --gpu-mem SIZE [--margin PCT|SIZE] [--set KEY=VALUE]... [--json]\n"
                "  The step replayed through the caching allocator at the capacity the card\n"
                "  leaves it (SIZE minus the margin, the CUDA context and NCCL): fits, fits with\n"
                "  cache flushes (cudaMalloc retries: slower), or out of memory (the request that\n"
                "  fails).  Exit 0 if it runs, 1 if out of memory (with the reason), 2 for bad\n"
                "  input.  SIZE: 80GiB, 80GB, 81559MiB, ... (docs/allocator.md)\n");
    else if (!strcmp(cmd, "fit"))
        fprintf(f,
                "usage: mmguard fit SPEC --gpu-mem SIZE [--margin PCT|SIZE] [--set KEY=VALUE]... [--json]\n"
                "  What fits on the card: the largest micro-batch (that runs, and that runs\n"
                "  without cache flushes), and whether expandable segments, gradient\n"
                "  checkpointing, a ZeRO stage or more GPUs make the job run.  Each answer is\n"
                "  `mmguard check`'s verdict of that configuration on the card: fits, fits with\n"
                "  cache flushes, or out of memory.  Exit 0 if the spec runs, 1 if not, 2 for\n"
                "  bad input.\n");
    else if (!strcmp(cmd, "bench"))
        fprintf(f,
                "usage: mmguard bench SPEC [--iterations N]\n"
                "  Time in-process predictions (predictions per second, microseconds each)\n"
                "  and whole `mmguard predict` processes.\n");
    else
        usage_main(f);
}

static int parse_opts(int argc, char **argv, opts *o, const char *cmd)
{
    memset(o, 0, sizeof *o);
    o->iterations = 20000;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
#define TAKE(name)                                                                           \
    (!strcmp(a, name) ? (i + 1 < argc ? (val = argv[++i], 1) : -1)                            \
                      : (!strncmp(a, name "=", strlen(name) + 1) ? (val = a + strlen(name) + 1, 1) : 0))
        int r;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage_cmd(cmd, stdout);
            exit(0);
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--pretty")) {
            o->pretty = 1;
        } else if (!strcmp(a, "--layers")) {
            o->layers = 1;
        } else if ((r = TAKE("--set")) != 0) {
            if (r < 0)
                goto missing;
            if (o->nsets >= MAX_SETS) {
                fprintf(stderr, "mmguard %s: at most %d --set options\n", cmd, MAX_SETS);
                return -1;
            }
            o->sets[o->nsets++] = val;
        } else if ((r = TAKE("--gpu-mem")) != 0) {
            if (r < 0)
                goto missing;
            o->gpu_mem = val;
        } else if ((r = TAKE("--html")) != 0) {
            if (r < 0)
                goto missing;
            o->html = val;
        } else if ((r = TAKE("--margin")) != 0) {
            if (r < 0)
                goto missing;
            o->margin = val;
        } else if ((r = TAKE("--iterations")) != 0) {
            if (r < 0)
                goto missing;
            char *end;
            errno = 0;
            o->iterations = strtol(val, &end, 10);
            if (errno || *end || o->iterations < 1 || o->iterations > 100000000) {
                fprintf(stderr, "mmguard %s: --iterations: '%s' is not a count\n", cmd, val);
                return -1;
            }
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "mmguard %s: unknown option '%s' (see mmguard %s --help)\n", cmd, a,
                    cmd);
            return -1;
        } else if (!o->spec) {
            o->spec = a;
        } else {
            fprintf(stderr, "mmguard %s: unexpected argument '%s'\n", cmd, a);
            return -1;
        }
        continue;
    missing:
        fprintf(stderr, "mmguard %s: %s needs a value\n", cmd, a);
        return -1;
#undef TAKE
    }
    if (!o->spec) {
        fprintf(stderr, "mmguard %s: missing SPEC (see mmguard %s --help)\n", cmd, cmd);
        return -1;
    }
    return 0;
}

static mm_spec *load(const opts *o, const char *cmd)
{
    mm_error err;
    mm_spec *s = mm_spec_load_file(o->spec, &err);
    if (!s) {
        fprintf(stderr, "mmguard %s: %s\n", cmd, err.msg);
        return NULL;
    }
    for (int i = 0; i < o->nsets; i++) {
        if (mm_spec_set(s, o->sets[i], &err)) {
            fprintf(stderr, "mmguard %s: %s\n", cmd, err.msg);
            mm_spec_free(s);
            return NULL;
        }
    }
    return s;
}

static int usable_from(const opts *o, const char *cmd, uint64_t *gpu, uint64_t *usable,
                       mm_margin *m)
{
    mm_error err;
    if (!o->gpu_mem) {
        fprintf(stderr, "mmguard %s: --gpu-mem SIZE is required (e.g. --gpu-mem 80GiB)\n", cmd);
        return -1;
    }
    if (mm_parse_size(o->gpu_mem, gpu, &err)) {
        fprintf(stderr, "mmguard %s: --gpu-mem: %s\n", cmd, err.msg);
        return -1;
    }
    memset(m, 0, sizeof *m);
    if (o->margin && mm_parse_margin(o->margin, m, &err)) {
        fprintf(stderr, "mmguard %s: --margin: %s\n", cmd, err.msg);
        return -1;
    }
    *usable = mm_usable_bytes(*gpu, m);
    return 0;
}

static void fmt(uint64_t b, char *buf)
{
    mm_format_bytes(b, buf, 32);
}

static void print_factors_row(const char *name, const char *type, uint64_t params,
                              uint64_t trainable, const mm_factors *f)
{
    char a[32], b[32], c[32], d[32], e[32], t[32];
    fmt(f->parameters, a);
    fmt(f->gradients, b);
    fmt(f->optimizer_states, c);
    fmt(f->activations, d);
    fmt(f->temporaries, e);
    uint64_t tot = f->parameters + f->gradients + f->optimizer_states + f->activations +
                   f->temporaries;
    fmt(tot, t);
    char pc[32], tc[32];
    snprintf(pc, sizeof pc, "%.1f M", (double)params / 1e6);
    snprintf(tc, sizeof tc, "%.1f M", (double)trainable / 1e6);
    printf("  %-40.40s %-6s %11s %11s %11s %11s %11s %12s %11s %11s\n", name, type, pc, tc, a, b, c,
           d, e, t);
}

/* What the peak holds besides live tensors, by name: the caching allocator's
 * cache (reserved - allocated, from its replay), the CUDA context, NCCL's
 * buffers, a spec's extra slack and paged states - never one opaque number. */
static void print_outside(const mm_prediction *p)
{
    char sl[32], cx[32], nc[32], ex[32], pg[32];
    uint64_t extra = p->peak_bytes - p->allocated_peak_bytes - p->allocator_slack -
                     p->overheads.cuda_context - p->paged_bytes -
                     (p->data_parallel > 1 ? p->overheads.nccl : 0);
    fmt(p->allocator_slack, sl);
    fmt(p->overheads.cuda_context, cx);
    fmt(p->overheads.nccl, nc);
    fmt(extra, ex);
    fmt(p->paged_bytes, pg);
    printf("\n  outside live tensors: allocator cache %s (reserved - allocated, caching-allocator "
           "replay), CUDA context %s", sl, cx);
    if (p->data_parallel > 1)
        printf(", NCCL %s", nc);
    if (extra)
        printf(", extra slack %s (device.allocator_fixed/fraction)", ex);
    if (p->paged_bytes)
        printf(", paged optimizer states %s", pg);
    printf("\n");
}

static void print_prediction(const mm_spec *s, const mm_prediction *p, int layers)
{
    char pk[32], al[32], ov[32], f[32], b[32], o[32];
    fmt(p->peak_bytes, pk);
    fmt(p->allocated_peak_bytes, al);
    fmt(p->factors.overhead, ov);
    fmt(p->phase_peak[MM_PHASE_FORWARD], f);
    fmt(p->phase_peak[MM_PHASE_BACKWARD], b);
    fmt(p->phase_peak[MM_PHASE_OPTIMIZER], o);
    printf("%s  (%s)\n", p->name, mm_spec_path(s));
    printf("  micro-batch %u, seq %u, data-parallel %u, ZeRO-%d, checkpointing %s\n",
           p->micro_batch_size, p->seq_len, p->data_parallel, mm_spec_zero_stage(s),
           mm_spec_checkpointing(s) ? "on" : "off");
    printf("  peak per GPU   %s  (allocated %s + %s outside live tensors)\n", pk, al, ov);
    printf("  peak at        %s\n", p->peak_event);
    if (p->bound[0])
        printf("  a bound        %s\n", p->bound);
    printf("  phase peaks    forward %s | backward %s | optimizer %s (allocated)\n", f, b, o);
    printf("  parameters     %.3f B total, %.3f B trainable\n\n",
           (double)p->parameters_count / 1e9, (double)p->trainable_count / 1e9);
    printf("  %-40s %-6s %11s %11s %11s %11s %11s %12s %11s %11s\n", "at the peak", "type",
           "params", "trainable", "parameters", "gradients", "optimizer", "activations",
           "temporaries", "total");
    for (size_t i = 0; i < p->n_modules; i++) {
        const mm_module_result *M = &p->modules[i];
        print_factors_row(M->name, M->type, M->parameters_count, M->trainable_count, &M->factors);
        for (size_t k = 0; layers && k < M->n_layers; k++) {
            const mm_layer_result *L = &M->layers[k];
            char nm[96];
            if (L->count > 1)
                snprintf(nm, sizeof nm, "  %s x%u", L->name, L->count);
            else
                snprintf(nm, sizeof nm, "  %s", L->name);
            print_factors_row(nm, "", L->parameters_count, L->trainable_count, &L->factors);
        }
    }
    mm_factors tot = p->factors;
    print_factors_row("total", "", p->parameters_count, p->trainable_count, &tot);
    print_outside(p);
    if (p->host_peak_bytes || p->paged_bytes) {
        char hb[32], pb[32];
        fmt(p->host_peak_bytes, hb);
        fmt(p->paged_bytes, pb);
        printf("  host memory per GPU process %s (offloaded states and activations)%s%s%s\n", hb,
               p->paged_bytes ? "; paged optimizer " : "", p->paged_bytes ? pb : "",
               p->paged_bytes ? " outside the caching allocator" : "");
    }
}

static int cmd_predict(int argc, char **argv)
{
    opts o;
    if (parse_opts(argc, argv, &o, "predict"))
        return 2;
    mm_spec *s = load(&o, "predict");
    if (!s)
        return 2;
    mm_prediction p;
    mm_error err;
    if (mm_predict(s, &p, &err)) {
        fprintf(stderr, "mmguard predict: %s\n", err.msg);
        mm_spec_free(s);
        return 2;
    }
    int rc = o.html ? mm_cli_predict_html(s, &p, o.html, o.gpu_mem) : 0;
    if (o.json) {
        char *j = mm_prediction_json(&p, o.pretty);
        if (j)
            puts(j);
        free(j);
    } else {
        print_prediction(s, &p, o.layers);
    }
    mm_prediction_free(&p);
    mm_spec_free(s);
    return rc;
}

static int cmd_check(int argc, char **argv)
{
    opts o;
    if (parse_opts(argc, argv, &o, "check"))
        return 2;
    uint64_t gpu, usable;
    mm_margin m;
    if (usable_from(&o, "check", &gpu, &usable, &m))
        return 2;
    mm_spec *s = load(&o, "check");
    if (!s)
        return 2;
    int rc = mm_cli_check(s, gpu, usable, o.margin, o.json);
    mm_spec_free(s);
    return rc;
}

static int cmd_fit(int argc, char **argv)
{
    opts o;
    if (parse_opts(argc, argv, &o, "fit"))
        return 2;
    uint64_t gpu, usable;
    mm_margin m;
    if (usable_from(&o, "fit", &gpu, &usable, &m))
        return 2;
    mm_spec *s = load(&o, "fit");
    if (!s)
        return 2;
    int rc = mm_cli_fit(s, gpu, usable, o.json);
    mm_spec_free(s);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmd_bench(int argc, char **argv)
{
    opts o;
    if (parse_opts(argc, argv, &o, "bench"))
        return 2;
    mm_spec *s = load(&o, "bench");
    if (!s)
        return 2;
    mm_prediction p;
    mm_error err;
    /* warm up */
    for (int i = 0; i < 10; i++) {
        if (mm_predict(s, &p, &err)) {
            fprintf(stderr, "mmguard bench: %s\n", err.msg);
            mm_spec_free(s);
            return 2;
        }
        mm_prediction_free(&p);
    }
    double t0 = now_s();
    long n = o.iterations;
    for (long i = 0; i < n; i++) {
        mm_predict(s, &p, &err);
        mm_prediction_free(&p);
    }
    double dt = now_s() - t0;
    printf("in-process: %ld predictions in %.3f s: %.0f predictions/s, %.1f us each\n", n, dt,
           (double)n / dt, dt / (double)n * 1e6);
    /* whole processes: fork + exec of this binary's `predict` */
    char self[4096];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    if (l > 0) {
        self[l] = '\0';
        int runs = 200;
        double t1 = now_s();
        for (int i = 0; i < runs; i++) {
            pid_t pid = fork();
            if (pid == 0) {
                int fd = open("/dev/null", O_WRONLY);
                if (fd >= 0) {
                    dup2(fd, 1);
                    close(fd);
                }
                execl(self, self, "predict", o.spec, "--json", (char *)NULL);
                _exit(127);
            }
            int st;
            if (pid < 0 || waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                fprintf(stderr, "mmguard bench: predict process failed\n");
                mm_spec_free(s);
                return 2;
            }
        }
        double dt1 = now_s() - t1;
        printf("per process: %d runs of `mmguard predict --json` in %.3f s: %.2f ms each\n", runs,
               dt1, dt1 / runs * 1e3);
    }
    mm_spec_free(s);
    return 0;
}

/* the uninstalled build/mmguard finds its source tree's catalog from any directory */
static void catalog_beside_program(void)
{
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return;
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash || slash == exe)
        return;
    *slash = 0;
    imp_catalog_beside(exe);
}

int main(int argc, char **argv)
{
    catalog_beside_program();
    if (argc < 2) {
        usage_main(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("mmguard %s\n", MM_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage_main(stdout);
        return 0;
    }
    if (!strcmp(cmd, "predict"))
        return cmd_predict(argc, argv);
    if (!strcmp(cmd, "check"))
        return cmd_check(argc, argv);
    if (!strcmp(cmd, "fit"))
        return cmd_fit(argc, argv);
    if (!strcmp(cmd, "bench"))
        return cmd_bench(argc, argv);
    if (!strcmp(cmd, "report"))
        return mm_cli_report_entry(argc, argv);
    if (!strcmp(cmd, "alloc-replay"))
        return mm_cli_alloc_replay(argc - 1, argv + 1);
    if (!strcmp(cmd, "import"))
        return mm_cli_import(argc - 1, argv + 1);
    fprintf(stderr, "mmguard: unknown command '%s'\n", cmd);
    usage_main(stderr);
    return 2;
}
