/* outcome_rec.h - the job's record of what it really used (issue 25), as the
 * recorder (python/mmguard) writes it and slurmstepd reads it when a step
 * ends, and the outcome line appended to the decision log.
 *
 * The file is written by the job's user and read by root: it is opened
 * without following a symlink, must be a regular file owned by the job's
 * user, at most MMG_OUTCOME_MAX bytes, and is parsed strictly (known keys,
 * types, ranges, enumerations; docs/outcome.md).  Slurm-free: unit-tested
 * (tests/unit/test_outcome.c) and fuzzed (tests/fuzz/fuzz_outcome.c).
 */
#ifndef MMG_OUTCOME_REC_H
#define MMG_OUTCOME_REC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "record.h"

#define MMG_OUTCOME_MAX 16384       /* longest record file accepted */
#define MMG_OUTCOME_TEXT 256        /* longest string value + 1 */
#define MMG_OUTCOME_ABSENT 8        /* most "absent" notes */

struct mmg_outcome_rec {
    char status[16];                /* running | done | oom | error */
    char phase[16];                 /* setup forward backward optimizer step exit, "" = null */
    char time[32];
    uint64_t steps, rank, world_size;
    int has_micro_batch, has_max_seq_len;
    uint64_t micro_batch, max_seq_len;
    uint64_t host_peak_rss;
    int cuda;                       /* the job saw a CUDA device */
    char device[MMG_OUTCOME_TEXT];
    int has_cuda;                   /* the four CUDA counters */
    uint64_t max_allocated, max_reserved, alloc_retries, ooms;
    int has_nvml_peak, has_nvml_total;
    uint64_t nvml_peak_used, nvml_total;
    int has_oom;
    char oom_phase[16], oom_kind[8], oom_message[MMG_OUTCOME_TEXT];
    size_t n_absent;
    char absent[MMG_OUTCOME_ABSENT][MMG_OUTCOME_TEXT];
};

/* Parse the record text (len bytes, NUL not required).  0 ok; -1 with a
 * message naming the key. */
int mmg_outcome_parse(const char *text, size_t len, struct mmg_outcome_rec *r,
                      char *err, size_t errlen);

/* Read the record file at path into buf (cap bytes, NUL-terminated, *len
 * set): no symlink (O_NOFOLLOW, lstat), a regular file with one link owned by
 * `owner`, the same file before and after open, at most MMG_OUTCOME_MAX
 * bytes, never blocking.  0 ok; -1 with err; 1 when there is no file. */
int mmg_outcome_read(const char *path, uid_t owner, char *buf, size_t cap, size_t *len,
                     char *err, size_t errlen);

/* What the outcome line says besides the record. */
struct mmg_outcome_job {
    uint32_t job_id;
    char step[16];                  /* "batch" or the step number */
    uint32_t uid;
    const char *record_path;
    const char *record_state;       /* "ok" | "missing" | "invalid" */
    const char *record_error;       /* NULL unless invalid */
    const struct mmg_outcome_rec *rec;   /* NULL unless ok */
    const struct mmg_record *pred;  /* the job's published decision, NULL if none */
};

/* The outcome line (JSON, no newline, malloc'd); NULL on OOM. */
char *mmg_outcome_line(const struct mmg_outcome_job *j);

/* "${TMPDIR:-/tmp}/mmguard-record.JOB.STEP.json" into out; -1 when tmpdir is
 * not absolute or it does not fit. */
int mmg_outcome_path(const char *tmpdir, uint32_t job_id, const char *step, char *out, size_t n);

#endif
