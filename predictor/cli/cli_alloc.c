/* cli_alloc.c - `mmguard alloc-replay [--alloc-conf S] [--capacity SIZE]
 * [--memory-fraction F] [--stop-at-oom] [--json] TRACE|-`: what the allocator model reserves for a recorded sequence of
 * allocations, next to what the real allocator reserved (alloc_trace.c). */
#include "cli_alloc.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"

static void usage(FILE *f)
{
    fputs("usage: mmguard alloc-replay [--alloc-conf CONF] [--capacity SIZE]\n"
          "                            [--memory-fraction F] [--stop-at-oom] [--json] TRACE\n"
          "  Replay an allocator trace (mmguard-alloc-trace/1, plain text; '-' reads\n"
          "  standard input, e.g. `gzip -dc t.trace.gz | mmguard alloc-replay -`) through\n"
          "  mmguard's model of PyTorch's CUDA caching allocator and print the model's\n"
          "  reserved and allocated peaks next to the real ones from the trace.\n"
          "  --alloc-conf CONF  PYTORCH_CUDA_ALLOC_CONF to model (default: the trace's own)\n"
          "  --capacity SIZE    device bytes the allocator may hold (default: unlimited)\n"
          "  --memory-fraction F  torch.cuda.set_per_process_memory_fraction(F): the\n"
          "                     allocator may reserve F x the trace's gpu_total_bytes\n"
          "  --stop-at-oom      end at the first out-of-memory, where the program raised\n"
          "  --invent-addresses new segments at addresses the model picks, as in a\n"
          "                     prediction (default: the trace's, which decide ties\n"
          "                     between equal-sized free blocks as on the GPU)\n"
          "  --json             one JSON object\n",
          f);
}

static double pct(uint64_t model, uint64_t truth)
{
    return truth ? ((double)model - (double)truth) * 100.0 / (double)truth : 0.0;
}

static void print_result(const mm_replay_result *r, int json)
{
    const mm_alloc_stats *s = &r->stats;
    if (json) {
        printf("{\"id\":\"%s\",\"events\":%llu,\"reserved_peak_bytes\":%llu,"
               "\"truth_reserved_peak_bytes\":%llu,\"reserved_error_pct\":%.4f,"
               "\"allocated_peak_bytes\":%llu,\"requested_peak_bytes\":%llu,"
               "\"truth_requested_peak_bytes\":%llu,\"segments\":%llu,"
               "\"truth_segments\":%llu,\"segments_matched\":%llu,\"num_ooms\":%llu,\"num_alloc_retries\":%llu}\n",
               r->id, (unsigned long long)r->events, (unsigned long long)s->reserved_peak,
               (unsigned long long)r->truth_reserved_peak,
               pct(s->reserved_peak, r->truth_reserved_peak),
               (unsigned long long)s->allocated_peak, (unsigned long long)s->requested_peak,
               (unsigned long long)r->truth_allocated_peak,
               (unsigned long long)s->num_device_alloc, (unsigned long long)r->truth_segments,
               (unsigned long long)r->segments_matched, (unsigned long long)s->num_ooms,
               (unsigned long long)s->num_alloc_retries);
        return;
    }
    double g = 1024.0 * 1024.0 * 1024.0;
    printf("%s: %llu alloc/free events\n", r->id[0] ? r->id : "trace",
           (unsigned long long)r->events);
    printf("  reserved peak   model %.3f GiB  real %.3f GiB  (%+.3f%%)\n",
           (double)s->reserved_peak / g, (double)r->truth_reserved_peak / g,
           pct(s->reserved_peak, r->truth_reserved_peak));
    printf("  requested peak  model %.3f GiB  real %.3f GiB  (allocated, rounded: %.3f GiB)\n",
           (double)s->requested_peak / g, (double)r->truth_allocated_peak / g,
           (double)s->allocated_peak / g);
    printf("  segments        model %llu  real %llu  (first %llu identical)\n",
           (unsigned long long)s->num_device_alloc, (unsigned long long)r->truth_segments,
           (unsigned long long)r->segments_matched);
}

int mm_cli_alloc_replay(int argc, char **argv)
{
    const char *path = NULL, *conf_s = NULL, *cap_s = NULL, *frac_s = NULL;
    int json = 0;
    unsigned flags = MM_REPLAY_TRACE_ADDRESSES;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--invent-addresses")) {
            flags &= ~MM_REPLAY_TRACE_ADDRESSES;
        } else if (!strcmp(a, "--stop-at-oom")) {
            flags |= MM_REPLAY_STOP_AT_OOM;
        } else if (!strcmp(a, "--memory-fraction") && i + 1 < argc) {
            frac_s = argv[++i];
        } else if ((!strcmp(a, "--alloc-conf") || !strcmp(a, "--capacity")) && i + 1 < argc) {
            *(a[2] == 'a' ? &conf_s : &cap_s) = argv[++i];
        } else if ((a[0] != '-' || !strcmp(a, "-")) && !path) {
            path = a;
        } else {
            fprintf(stderr, "mmguard alloc-replay: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    mm_alloc_conf conf;
    mm_error err;
    uint64_t cap = 0;
    mm_alloc_conf_default(&conf);
    if ((conf_s && mm_alloc_conf_parse(&conf, conf_s, &err) < 0) ||
        (cap_s && mm_parse_size(cap_s, &cap, &err) < 0)) {
        fprintf(stderr, "mmguard alloc-replay: %s: %s\n", conf_s && !cap ? "--alloc-conf"
                                                                         : "--capacity", err.msg);
        return 2;
    }
    if (frac_s) {
        char *end;
        errno = 0;
        conf.memory_fraction = strtod(frac_s, &end);
        if (errno || end == frac_s || *end || !(conf.memory_fraction > 0) ||
            conf.memory_fraction > 1) {
            fprintf(stderr, "mmguard alloc-replay: --memory-fraction: '%s' is not a number in "
                    "(0, 1]\n", frac_s);
            return 2;
        }
    }
    mm_replay_result r;
    if (mm_alloc_replay_file(path, &conf, flags | (conf_s ? 0 : MM_REPLAY_CONF_FROM_TRACE), cap, &r,
                             &err) < 0) {
        fprintf(stderr, "mmguard alloc-replay: %s\n", err.msg);
        return 2;
    }
    print_result(&r, json);
    return 0;
}
