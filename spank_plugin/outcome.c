/* outcome.c - remote context (slurmstepd, root): close the loop (issue 25).
 *
 * user_init: tell the tasks of a checked job's step where to record what they used,
 * MMGUARD_RECORD=${TMPDIR:-/tmp}/mmguard-record.JOB.STEP.json (TMPDIR of the
 * job's environment).  exit: read that file (outcome_rec.c: no symlink, the
 * job user's regular file, bounded, strict) and append one "outcome" line to
 * the decision log (log= of mmguard.conf), joined by job id and carrying the
 * decision the job was published with.  A broken record is logged (slurmd's
 * log, and an outcome line with record_state "invalid"), a missing one in
 * slurmd's debug log only; nothing fails: every function here returns
 * nothing to Slurm. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <slurm/slurm.h>

#include "outcome_rec.h"
#include "plugin.h"

#define OUTCOME_PATH_MAX 640

/* The step's name: "batch", "extern", "interactive" or its number. */
static int step_name(spank_t sp, uint32_t *job_id, char *step, size_t n)
{
    uint32_t s;
    if (spank_get_item(sp, S_JOB_ID, job_id) != ESPANK_SUCCESS ||
        spank_get_item(sp, S_JOB_STEPID, &s) != ESPANK_SUCCESS)
        return -1;
    if (s == SLURM_BATCH_SCRIPT)
        snprintf(step, n, "batch");
    else if (s == SLURM_EXTERN_CONT)
        snprintf(step, n, "extern");
    else if (s == SLURM_INTERACTIVE_STEP)
        snprintf(step, n, "interactive");
    else
        snprintf(step, n, "%u", s);
    return 0;
}

static int record_path(spank_t sp, uint32_t *job_id, char *step, size_t sn, char *path, size_t n)
{
    char tmpdir[600];
    if (step_name(sp, job_id, step, sn) != 0)
        return -1;
    if (spank_getenv(sp, "TMPDIR", tmpdir, sizeof tmpdir) != ESPANK_SUCCESS)
        tmpdir[0] = '\0';
    return mmg_outcome_path(tmpdir, *job_id, step, path, n);
}

/* The decision the job was published with; 1 when there is one. */
static int job_decision(spank_t sp, struct mmg_record *r)
{
    static char text[MMG_RECORD_MAX + 2];
    char err[256];
    if (spank_getenv(sp, "SLURM_SPANK_" MMG_VAR, text, sizeof text) != ESPANK_SUCCESS &&
        spank_getenv(sp, "SPANK_" MMG_VAR, text, sizeof text) != ESPANK_SUCCESS)
        return 0;
    return mmg_record_parse(text, r, err, sizeof err) == 0;
}

/* Only a checked job (one with a published decision) is asked to record; any
 * other job loses an MMGUARD_RECORD inherited from where it was submitted. */
void mmg_outcome_user_init(spank_t sp)
{
    char path[OUTCOME_PATH_MAX], step[16];
    uint32_t job_id;
    struct mmg_record *r = calloc(1, sizeof(*r));
    int checked = r && job_decision(sp, r);
    free(r);
    if (!checked) {
        (void)spank_unsetenv(sp, "MMGUARD_RECORD");
        return;
    }
    if (record_path(sp, &job_id, step, sizeof step, path, sizeof path) != 0) {
        slurm_debug(MMG_PREFIX "no record path for this step (TMPDIR not absolute?)");
        return;
    }
    /* a record an earlier job of the same id and step left (ids restart with a
     * new cluster, or wrap) is not this step's: unlink never follows the link */
    if (unlink(path) == 0)
        slurm_info(MMG_PREFIX "job %u step %s: removed a stale record at %s", job_id, step, path);
    if (spank_setenv(sp, "MMGUARD_RECORD", path, 1) != ESPANK_SUCCESS)
        slurm_debug(MMG_PREFIX "cannot set MMGUARD_RECORD for the tasks");
}


/* Append line + newline to the log: never through a symlink, never blocking,
 * a regular file only, whole lines under flock (as log.c does). */
static int append_line(const char *log, char *line)
{
    struct stat st;
    size_t len = strlen(line);
    int fd, err = 0, locked = 0;
    ssize_t w;
    fd = open(log, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK, 0644);
    if (fd < 0)
        return errno;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return EINVAL;
    }
    for (int i = 0; i < 100 && !locked; i++) {
        locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
        if (!locked)
            (void)nanosleep(&(struct timespec){ .tv_sec = 0, .tv_nsec = 10 * 1000 * 1000 }, NULL);
    }
    line[len] = '\n';
    w = write(fd, line, len + 1);
    line[len] = '\0';
    if (w != (ssize_t)(len + 1))
        err = w < 0 ? errno : ENOSPC;
    if (locked)
        (void)flock(fd, LOCK_UN);
    close(fd);
    return err;
}

/* Read the step's record into rec; fills state and error of j. */
static void read_record(const char *path, uid_t uid, struct mmg_outcome_rec *rec,
                        struct mmg_outcome_job *j, char *err, size_t errlen)
{
    static char buf[MMG_OUTCOME_MAX + 2];
    size_t len;
    int rc = mmg_outcome_read(path, uid, buf, sizeof buf, &len, err, errlen);
    if (rc == 0)
        rc = mmg_outcome_parse(buf, len, rec, err, errlen);
    j->record_state = rc == 0 ? "ok" : rc == 1 ? "missing" : "invalid";
    j->record_error = rc < 0 ? err : NULL;
    j->rec = rc == 0 ? rec : NULL;
}

static void collect(spank_t sp, const struct mmg_config *cfg, struct mmg_outcome_rec *rec,
                    struct mmg_record *pred)
{
    char path[OUTCOME_PATH_MAX], step[16], err[512], *line;
    struct mmg_outcome_job j = { 0 };
    uid_t uid;
    int rc;
    if (record_path(sp, &j.job_id, step, sizeof step, path, sizeof path) != 0 ||
        spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS)
        return;
    snprintf(j.step, sizeof j.step, "%s", step);
    j.uid = uid;
    j.record_path = path;
    j.pred = job_decision(sp, pred) ? pred : NULL;
    read_record(path, uid, rec, &j, err, sizeof err);
    if (j.rec || j.record_error)
        (void)unlink(path); /* read once: the next job of this id starts without it */
    if (j.record_error)
        slurm_info(MMG_PREFIX "job %u step %s: record %s: %s", j.job_id, step, path, err);
    /* no recorder ran (most steps): slurmd's debug log only, the decision
     * log keeps one line per decision and per record */
    if (!j.rec && !j.record_error) {
        slurm_debug(MMG_PREFIX "job %u step %s: no record at %s", j.job_id, step, path);
        return;
    }
    line = mmg_outcome_line(&j);
    if (!line)
        return;
    if ((rc = append_line(cfg->log_path, line)) != 0)
        slurm_error(MMG_PREFIX "log=%s: cannot append the outcome of job %u: %s",
                    cfg->log_path, j.job_id, rc == EINVAL ? "not a regular file"
                    : rc == ELOOP ? "it is a symbolic link (not followed)" : strerror(rc));
    free(line);
}

void mmg_outcome_exit(spank_t sp, int ac, char **av)
{
    struct mmg_config *cfg = calloc(1, sizeof(*cfg));
    struct mmg_outcome_rec *rec = calloc(1, sizeof(*rec));
    struct mmg_record *pred = calloc(1, sizeof(*pred));
    char err[1024];
    if (cfg && rec && pred && mmg_config_parse_args(cfg, ac, av, err, sizeof err) == 0 &&
        cfg->log_path[0])
        collect(sp, cfg, rec, pred);
    free(cfg);
    free(rec);
    free(pred);
}
