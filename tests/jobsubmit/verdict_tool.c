/* verdict_tool.c - the C side of `make check-dp-verdict`: the cards= part of
 * the MMGUARD record the plugin publishes (record.c mmg_cards_add, as
 * check.c's publish_cards calls it), for a spec on some cards at some counts.
 *
 *   verdict_tool SPEC FROM-TO TYPE=BYTES:USABLE... [KEY=VALUE...] [mmb=N:FLUSH]
 *
 * KEY=VALUE items (no colon after '=') are spec settings; TYPE=BYTES:USABLE
 * the cards.  mmb=N:FLUSH also publishes what the plugin publishes after
 * judging the job at N GPUs of the first type under flush=FLUSH: gpu=,
 * usable=, dp= and the largest micro-batch mmb= (check.c: mm_max_micro_batch,
 * or mm_fit's for a misfit - the same answer), which job_submit.lua names in
 * a rejection.  Prints one "v=4 ..." record line; tests/jobsubmit/
 * verdict_check.py holds job_submit.lua's verdict of it against `mmguard
 * check --json`. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mmguard.h"
#include "record.h"

#define MAX_TYPES 8

static struct mmg_record rec;

/* the plugin's gpu=, usable=, dp= and mmb= for a job judged at n GPUs */
static int publish_mmb(const mm_spec *spec, uint32_t n, const char *gpu, uint64_t mem,
                       uint64_t usable, int no_flush)
{
    char kv[64];
    mm_error e;
    mm_spec *c = mm_spec_clone(spec);
    snprintf(kv, sizeof(kv), "training.data_parallel=%" PRIu32, n);
    if (!c || mm_spec_set(c, kv, &e) != 0) {
        fprintf(stderr, "verdict_tool: %s\n", c ? e.msg : "out of memory");
        mm_spec_free(c);
        return -1;
    }
    snprintf(rec.gpu, sizeof(rec.gpu), "%s", gpu);
    rec.gpu_mem = mem;
    rec.usable = usable;
    rec.dp = n;
    rec.has_mmb = 1;
    rec.mmb = mm_max_micro_batch(c, mem, usable, no_flush, NULL);
    mm_spec_free(c);
    return 0;
}

int main(int argc, char **argv)
{
    const char *names[MAX_TYPES];
    char namebuf[MAX_TYPES][32], text[MMG_RECORD_MAX + 1];
    uint64_t mem[MAX_TYPES], usable[MAX_TYPES];
    uint32_t counts[MMG_RECORD_CARDS], from, to;
    size_t nt = 0, nc = 0;
    mm_error e;
    mm_spec *spec;
    if (argc < 4 || sscanf(argv[2], "%" SCNu32 "-%" SCNu32, &from, &to) != 2 || from < 1 ||
        to < from || to - from >= MMG_RECORD_CARDS) {
        fprintf(stderr, "usage: verdict_tool SPEC FROM-TO TYPE=BYTES:USABLE... [KEY=VALUE...]\n");
        return 2;
    }
    if (!(spec = mm_spec_load_file(argv[1], &e))) {
        fprintf(stderr, "verdict_tool: %s: %s\n", argv[1], e.msg);
        return 2;
    }
    uint32_t mmb_n = 0;
    char flush[16] = "";
    for (int i = 3; i < argc; i++) {
        const char *eq = strchr(argv[i], '=');
        if (!strncmp(argv[i], "mmb=", 4) &&
            sscanf(argv[i] + 4, "%" SCNu32 ":%15s", &mmb_n, flush) == 2) {
            continue;
        } else if (eq && strchr(eq, ':') && nt < MAX_TYPES &&
            sscanf(eq + 1, "%" SCNu64 ":%" SCNu64, &mem[nt], &usable[nt]) == 2) {
            snprintf(namebuf[nt], sizeof(namebuf[nt]), "%.*s", (int)(eq - argv[i]), argv[i]);
            names[nt] = namebuf[nt];
            nt++;
        } else if (mm_spec_set(spec, argv[i], &e) != 0) {
            fprintf(stderr, "verdict_tool: %s: %s\n", argv[i], e.msg);
            return 2;
        }
    }
    for (uint32_t n = from; n <= to; n++)
        counts[nc++] = n;
    snprintf(rec.decision, sizeof(rec.decision), "accept");
    if (mmb_n && nt && publish_mmb(spec, mmb_n, names[0], mem[0], usable[0],
                                   !strcmp(flush, "reject")))
        return 2;
    if (mmg_cards_add(rec.cards, &rec.n_cards, spec, nt, names, mem, usable, nc, counts, &e) ||
        mmg_record_format(&rec, text, sizeof(text))) {
        fprintf(stderr, "verdict_tool: %s\n", e.msg);
        return 1;
    }
    printf("%s\n", text);
    mm_spec_free(spec);
    return 0;
}
