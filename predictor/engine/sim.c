/* sim.c - the timeline engine (see sim.h).  Pure bookkeeping: no formulas here. */
#include "sim.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

static void maybe_free(sim *s, int32_t id);
static void unsave(sim *s, int32_t id);

/* one change of the live bytes (account), kept while track_peak is on */
struct sim_undo {
    uint64_t bytes;
    uint32_t row;
    uint8_t f, sharded;
    int8_t sign;
};

void sim_init(sim *s, uint64_t dp, int symbolic)
{
    memset(s, 0, sizeof *s);
    s->dp = dp ? dp : 1;
    s->symbolic = symbolic;
    s->ckpt_extra = -1;
}

void sim_free(sim *s)
{
    free(s->t);
    free(s->tape);
    free(s->terms);
    free(s->rows);
    free(s->snap_row_fact);
    free(s->undo);
    free(s->ev);
    if (!s->tables_borrowed) {
        free(s->layer_tp);
        free(s->layer_gb);
        free(s->layer_p);
    }
    memset(s, 0, sizeof *s);
}

uint64_t sim_mul(sim *s, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (mm_mul(a, b, &r)) {
        s->overflow = 1;
        return 0;
    }
    return r;
}

uint64_t sim_mul3(sim *s, uint64_t a, uint64_t b, uint64_t c)
{
    return sim_mul(s, sim_mul(s, a, b), c);
}

uint64_t sim_add(sim *s, uint64_t a, uint64_t b)
{
    uint64_t r;
    if (mm_add(a, b, &r)) {
        s->overflow = 1;
        return 0;
    }
    return r;
}

static uint32_t row_find_or_add(sim *s, uint32_t module, const char *name, const char *kind)
{
    for (size_t i = s->nrows; i-- > 0;)
        if (s->rows[i].module == module && strcmp(s->rows[i].name, name) == 0)
            return (uint32_t)i;
    if (s->nrows == s->caprows) {
        size_t cap = s->caprows ? s->caprows * 2 : 64;
        sim_row *r = realloc(s->rows, cap * sizeof *r);
        if (!r) {
            s->oom = 1;
            return 0;
        }
        s->rows = r;
        s->caprows = cap;
    }
    sim_row *r = &s->rows[s->nrows];
    memset(r, 0, sizeof *r);
    mm_strlcpy(r->name, name, sizeof r->name);
    mm_strlcpy(r->kind, kind, sizeof r->kind);
    r->module = module;
    return (uint32_t)s->nrows++;
}

uint32_t sim_row_get_tmp(sim *s, uint32_t module, const char *name, const char *kind)
{
    return row_find_or_add(s, module, name, kind);
}

uint32_t sim_row_get(sim *s, uint32_t module, const char *name, const char *kind)
{
    uintptr_t a = (uintptr_t)name;
    size_t h = ((a >> 3) ^ (a >> 12) ^ module * 2654435761u) & 511u;
    if (s->rcache[h].name == name && s->rcache[h].module == module && s->rcache[h].row < s->nrows)
        return s->rcache[h].row; /* static name: the address identifies it */
    uint32_t r = row_find_or_add(s, module, name, kind);
    s->rcache[h].name = name;
    s->rcache[h].module = module;
    s->rcache[h].row = r;
    return r;
}

uint64_t sim_live_fixed(const sim *s)
{
    return s->live_fixed;
}

static inline uint64_t live_now(const sim *s)
{
    return s->live_fixed + (s->dp > 1 ? s->live_multi : 0) + mm_ceil_div(s->live_sharded, s->dp);
}

uint64_t sim_live(const sim *s)
{
    return live_now(s);
}

void sim_set_phase(sim *s, mm_phase p)
{
    s->phase = p;
    /* a phase that allocates nothing still holds what is live when it starts */
    uint64_t live = sim_live(s);
    if (live > s->phase_peak[p])
        s->phase_peak[p] = live;
}

void sim_label(sim *s, const char *label, uint32_t row)
{
    s->event_label = label;
    s->event_row = row;
}

static void add_term(sim *s, uint64_t f, uint64_t sh)
{
    /* fast path: same sharded level as the newest term (the common case) */
    if (s->nterms && s->terms[s->nterms - 1].sharded == sh && s->terms[s->nterms - 1].fixed >= f)
        return;
    /* keep the pareto set of (fixed, sharded): drop dominated points */
    for (size_t i = 0; i < s->nterms; i++)
        if (s->terms[i].fixed >= f && s->terms[i].sharded >= sh)
            return;
    size_t w = 0;
    for (size_t i = 0; i < s->nterms; i++)
        if (!(f >= s->terms[i].fixed && sh >= s->terms[i].sharded))
            s->terms[w++] = s->terms[i];
    s->nterms = w;
    if (s->nterms == s->capterms) {
        size_t cap = s->capterms ? s->capterms * 2 : 16;
        mm_dp_term *t = realloc(s->terms, cap * sizeof *t);
        if (!t) {
            s->oom = 1;
            return;
        }
        s->terms = t;
        s->capterms = cap;
    }
    s->terms[s->nterms].fixed = f;
    s->terms[s->nterms].sharded = sh;
    s->nterms++;
}

/* the factors of a snapshot from the live bytes per factor: the sharded
 * bytes are rounded once, as the peak is; each factor gets its floor and the
 * last sharded one the remainder, so the factors add up */
static void snap_factors(sim *s, const uint64_t *fx, const uint64_t *fsh, const uint64_t *fm,
                         uint64_t live_sharded)
{
    uint64_t acc = 0;
    int last = -1;
    for (int f = 0; f < F_NFACT; f++) {
        uint64_t sh = fsh[f] / s->dp;
        acc += sh;
        if (fsh[f])
            last = f;
        s->snap_fact[f] = fx[f] + sh + (s->dp > 1 ? fm[f] : 0);
    }
    if (last >= 0)
        s->snap_fact[last] += mm_ceil_div(live_sharded, s->dp) - acc;
}

static int fact_of(const sim_tensor *t)
{
    return t->cls == F_TEMP && (t->refs || t->vrefs) ? F_ACT : t->cls;
}

/* bytes a tensor of `bytes` and sharding `sharded` takes on this rank */
static uint64_t rank_of(const sim *s, uint64_t bytes, int sharded)
{
    if (sharded == SIM_MULTI)
        return s->dp > 1 ? bytes : 0;
    return sharded == SIM_SHARDED ? mm_ceil_div(bytes, s->dp) : bytes;
}

/* the live tensors' bytes per (row, factor) into snap_row_fact */
static int snap_rows(sim *s)
{
    if (!s->snap_row_fact) {
        s->snap_row_fact = calloc(s->nrows * F_NFACT + 1, sizeof *s->snap_row_fact);
        s->snap_nrows = s->nrows;
    }
    if (!s->snap_row_fact) {
        s->oom = 1;
        return -1;
    }
    for (size_t i = 0; i < s->nt; i++) {
        const sim_tensor *t = &s->t[i];
        if (!t->alive || t->row >= s->snap_nrows)
            continue;
        s->snap_row_fact[t->row * F_NFACT + (size_t)fact_of(t)] += rank_of(s, t->bytes, t->sharded);
    }
    return 0;
}

static void snapshot(sim *s)
{
    s->snapped = 1;
    s->stopped = 1; /* a replay only exists for this snapshot: stop here */
    snap_factors(s, s->fact_fixed, s->fact_sharded, s->fact_multi, s->live_sharded);
    snap_rows(s);
}

int sim_peak_snapshot(sim *s)
{
    if (!s->track_peak || !s->peak_event || s->oom)
        return -1;
    uint64_t fx[F_NFACT], fsh[F_NFACT], fm[F_NFACT], lsh = s->live_sharded;
    memcpy(fx, s->fact_fixed, sizeof fx);
    memcpy(fsh, s->fact_sharded, sizeof fsh);
    memcpy(fm, s->fact_multi, sizeof fm);
    free(s->snap_row_fact);
    s->snap_row_fact = NULL;
    if (snap_rows(s)) /* the end state, then every change since the peak undone */
        return -1;
    for (size_t i = s->nundo; i-- > 0;) {
        const struct sim_undo *u = &s->undo[i];
        uint64_t b = u->bytes, r = rank_of(s, b, u->sharded);
        uint64_t *slot = &s->snap_row_fact[u->row * F_NFACT + u->f];
        uint64_t *fact = u->sharded == SIM_MULTI ? &fm[u->f] : u->sharded ? &fsh[u->f] : &fx[u->f];
        if (u->sign > 0) {
            *slot -= r;
            *fact -= b;
            lsh -= u->sharded == SIM_SHARDED ? b : 0;
        } else {
            *slot += r;
            *fact += b;
            lsh += u->sharded == SIM_SHARDED ? b : 0;
        }
    }
    snap_factors(s, fx, fsh, fm, lsh);
    s->snapped = 1;
    return 0;
}

/* called after every allocation: the only moments a new peak can appear */
static void event(sim *s)
{
    s->nevents++;
    uint64_t live = live_now(s);
    if (live > s->phase_peak[s->phase]) {
        s->phase_peak[s->phase] = live;
        s->phase_peak_event[s->phase] = s->nevents;
    }
    if (live > s->peak) {
        s->nundo = 0; /* the breakdown at this peak is the state now */
        s->peak = live;
        s->peak_event = s->nevents;
        s->peak_phase = s->phase;
        s->peak_label = s->event_label;
        s->peak_row = s->event_row;
    }
    uint64_t dp1 = s->live_fixed + s->live_sharded;
    if (dp1 > s->peak_dp1)
        s->peak_dp1 = dp1;
    if (s->symbolic)
        add_term(s, s->live_fixed + s->live_multi, s->live_sharded);
    if (s->snap_at && s->nevents == s->snap_at)
        snapshot(s);
}

static void undo_push(sim *s, const sim_tensor *t, int f, int sign)
{
    if (s->nundo == s->capundo) {
        size_t cap = s->capundo ? s->capundo * 2 : 4096;
        struct sim_undo *u = realloc(s->undo, cap * sizeof *u);
        if (!u) {
            s->oom = 1;
            return;
        }
        s->undo = u;
        s->capundo = cap;
    }
    s->undo[s->nundo++] = (struct sim_undo){.bytes = t->bytes, .row = t->row, .f = (uint8_t)f,
                                            .sharded = t->sharded, .sign = (int8_t)sign};
}

static inline void account(sim *s, const sim_tensor *t, int sign)
{
    int f = fact_of(t);
    if (s->track_peak)
        undo_push(s, t, f, sign);
    uint64_t *live, *fact;
    if (t->sharded == SIM_MULTI) {
        live = &s->live_multi;
        fact = &s->fact_multi[f];
    } else if (t->sharded) {
        live = &s->live_sharded;
        fact = &s->fact_sharded[f];
    } else {
        live = &s->live_fixed;
        fact = &s->fact_fixed[f];
    }
    if (sign < 0) {
        *live -= t->bytes;
        *fact -= t->bytes;
        return;
    }
    *live = mm_sat_add(*live, t->bytes);
    *fact = mm_sat_add(*fact, t->bytes);
    if (*live == UINT64_MAX)
        s->overflow = 1;
}

/* bytes a tensor takes on this rank */
static uint64_t rank_bytes(const sim *s, const sim_tensor *t)
{
    return rank_of(s, t->bytes, t->sharded);
}

/* room for `cap` tensors / events: 0, or -1 (oom set).  A new array with the
 * used part copied, not realloc, which copies the whole old capacity */
static void *regrow(sim *s, void *old, size_t used, size_t cap, size_t size)
{
    void *p = malloc(cap * size);
    if (!p) {
        s->oom = 1;
        return NULL;
    }
    if (used)
        memcpy(p, old, used * size);
    free(old);
    return p;
}

static int grow_tensors(sim *s, size_t cap)
{
    sim_tensor *t = regrow(s, s->t, s->nt, cap, sizeof *t);
    if (!t)
        return -1;
    s->t = t;
    s->capt = cap;
    return 0;
}

static int grow_events(sim *s, size_t cap)
{
    sim_ev *e = regrow(s, s->ev, s->nev, cap, sizeof *e);
    if (!e)
        return -1;
    s->ev = e;
    s->capev = cap;
    return 0;
}

void sim_reserve(sim *s, size_t tensors)
{
    if (tensors > s->capt && !grow_tensors(s, tensors) && s->log && 2 * tensors > s->capev)
        grow_events(s, 2 * tensors); /* an allocation and a free per tensor at most */
}

static inline void log_event(sim *s, int32_t id, int is_free)
{
    const sim_tensor *t = &s->t[id];
    uint64_t b = rank_bytes(s, t);
    if (!b)
        return;
    if (s->nev == s->capev && grow_events(s, s->capev ? s->capev * 2 : 4096))
        return;
    s->ev[s->nev++] = (sim_ev){.bytes = b, .id = id, .row = t->row, .is_free = (uint8_t)is_free,
                               .phase = (uint8_t)s->phase, .cls = t->cls};
}

/* a tensor record that is not on the device (alive 0) */
static int32_t sim_alloc_quiet(sim *s, uint32_t row, uint64_t bytes)
{
    if (s->nt == s->capt && grow_tensors(s, s->capt ? s->capt * 2 : 1024))
        return -1;
    int32_t id = (int32_t)s->nt++;
    s->t[id] = (sim_tensor){.bytes = bytes, .vbytes = bytes, .base = -1, .row = row,
                            .cls = F_TEMP, .grad = -1};
    return id;
}

int32_t sim_alloc(sim *s, uint32_t row, uint64_t bytes, int cls, int sharded)
{
    if (s->stopped)
        return -1;
    if (s->nt == s->capt && grow_tensors(s, s->capt ? s->capt * 2 : 1024))
        return -1;
    int32_t id = (int32_t)s->nt++;
    sim_tensor *t = &s->t[id];
    *t = (sim_tensor){.bytes = bytes, .vbytes = bytes, .base = -1, .row = row,
                      .cls = (uint8_t)cls, .sharded = (uint8_t)sharded, .alive = 1, .holds = 1,
                      .grad = -1};
    account(s, t, +1);
    if (s->log)
        log_event(s, id, 0);
    event(s);
    return id;
}

/* a tensor that exists only as a host copy (never on the device) */
int32_t sim_host_tensor(sim *s, uint32_t row, uint64_t bytes)
{
    int32_t id = s->stopped || !bytes ? -1 : sim_alloc_quiet(s, row, bytes);
    return id;
}

static void maybe_free(sim *s, int32_t id)
{
    sim_tensor *t = &s->t[id];
    if (t->alive && !t->holds && !t->refs) {
        t->alive = 0;
        if (t->base >= 0) { /* a view: release its base */
            sim_drop(s, t->base);
            return;
        }
        account(s, t, -1);
        if (s->log)
            log_event(s, id, 1);
    }
}

int32_t sim_view(sim *s, uint32_t row, int32_t base, uint64_t vbytes)
{
    if (s->stopped || base < 0)
        return -1;
    if (s->nt == s->capt && grow_tensors(s, s->capt ? s->capt * 2 : 1024))
        return -1;
    while (s->t[base].base >= 0) /* a view of a view shares the first base */
        base = s->t[base].base;
    int32_t id = (int32_t)s->nt++;
    s->t[id] = (sim_tensor){.bytes = 0, .vbytes = vbytes, .base = base, .row = row,
                            .cls = s->t[base].cls, .alive = 1, .holds = 1, .grad = -1,
                            .esz = s->t[base].esz, .rg = s->t[base].rg};
    s->t[base].holds++;
    return id;
}

uint64_t sim_grad_bytes(const sim *s, int32_t id)
{
    return s->t[id].base >= 0 ? s->t[id].vbytes : s->t[id].bytes;
}

void sim_node_out(sim *s, sim_node *n, int32_t out)
{
    if (!n || out < 0 || n->nouts >= SIM_MAX_OUT - 1)
        return;
    n->outs[n->nouts++] = out;
    s->t[out].rg = 1;
}

void sim_hold(sim *s, int32_t id)
{
    if (id >= 0)
        s->t[id].holds++;
}

void sim_drop(sim *s, int32_t id)
{
    if (id < 0)
        return;
    sim_tensor *t = &s->t[id];
    if (t->holds)
        t->holds--;
    maybe_free(s, id);
}

sim_node *sim_node_new(sim *s, uint32_t row, int32_t out)
{
    if (s->stopped)
        return NULL;
    if (s->ntape == s->captape) {
        size_t cap = s->captape ? s->captape * 2 : 1024;
        sim_node *n = realloc(s->tape, cap * sizeof *n);
        if (!n) {
            s->oom = 1;
            return NULL;
        }
        s->tape = n;
        s->captape = cap;
    }
    sim_node *n = &s->tape[s->ntape++];
    memset(n, 0, sizeof *n);
    n->row = row;
    n->out = out;
    n->wgrad_row = row;
    if (out >= 0)
        s->t[out].rg = 1;
    return n;
}

/* a saved view makes its base count as an activation (refs), without a hold */
static void sim_save_storage(sim *s, int32_t base, int sign)
{
    sim_tensor *t = &s->t[base];
    if (t->alive)
        account(s, t, -1);
    if (sign > 0)
        t->vrefs++;
    else if (t->vrefs)
        t->vrefs--;
    if (t->alive)
        account(s, t, +1);
}

/* torchtune OffloadActivations (training/_activation_offloading.py, which TRL's
 * activation_offloading uses): pack_tensor copies a saved tensor of at least
 * min_offload_size (1024) bytes to pinned host memory, once per tensor, in the
 * forward only; unpack_tensor brings it back for the backward that needs it */
static void host_ref(sim *s, sim_tensor *t, int sign)
{
    if (sign > 0 && t->hrefs++ == 0) {
        s->host_act = sim_add(s, s->host_act, t->bytes);
        if (s->host_act > s->host_act_peak)
            s->host_act_peak = s->host_act;
    } else if (sign < 0 && t->hrefs && --t->hrefs == 0) {
        s->host_act -= t->bytes;
    }
}

void sim_save_host(sim *s, sim_node *n, int32_t id)
{
    if (!n || id < 0 || n->nsaved >= SIM_MAX_SAVED)
        return;
    sim_tensor *t = &s->t[id];
    if (t->base >= 0) { /* a view stays on the device with its base */
        sim_save(s, n, id);
        return;
    }
    n->host_saved |= (uint8_t)(1u << n->nsaved);
    n->saved[n->nsaved++] = id;
    host_ref(s, t, +1);
}

void sim_save(sim *s, sim_node *n, int32_t id)
{
    if (!n || id < 0)
        return;
    for (int i = 0; i < n->nsaved; i++)
        if (n->saved[i] == id)
            return; /* the same tensor saved twice costs nothing more */
    if (n->nsaved >= SIM_MAX_SAVED)
        return;
    sim_tensor *t = &s->t[id];
    if (s->offload_acts && s->phase == MM_PHASE_FORWARD && t->base < 0 && t->cls == F_TEMP &&
        t->bytes >= 1024) {
        sim_save_host(s, n, id);
        return;
    }
    n->saved[n->nsaved++] = id;
    if (t->base >= 0) { /* a saved view keeps its base: the base becomes an activation */
        t->refs++;
        sim_save_storage(s, t->base, +1);
        return;
    }
    if (t->alive && t->refs == 0 && t->cls == F_TEMP) {
        /* moves from temporaries to activations */
        account(s, t, -1);
        t->refs++;
        account(s, t, +1);
    } else {
        t->refs++;
    }
}

/* release saved slot i of n */
static void unsave_slot(sim *s, const sim_node *n, int i)
{
    if (n->host_saved & (1u << i))
        host_ref(s, &s->t[n->saved[i]], -1);
    else
        unsave(s, n->saved[i]);
}

static void unsave(sim *s, int32_t id)
{
    sim_tensor *t = &s->t[id];
    if (!t->refs)
        return;
    if (t->base >= 0) {
        t->refs--;
        sim_save_storage(s, t->base, -1);
        maybe_free(s, id);
        return;
    }
    if (t->alive && t->refs == 1 && t->cls == F_TEMP) {
        account(s, t, -1);
        t->refs--;
        account(s, t, +1);
    } else {
        t->refs--;
    }
    maybe_free(s, id);
}

/* allocated and freed at once: sim_drop's work on a tensor it knows to be
 * fresh (one hold, no saved references, storage of its own) */
static void transient(sim *s, uint32_t row, uint64_t bytes, int sharded)
{
    int32_t id = sim_alloc(s, row, bytes, F_TEMP, sharded);
    if (id < 0)
        return;
    sim_tensor *t = &s->t[id];
    t->holds = 0;
    t->alive = 0;
    account(s, t, -1);
    if (s->log)
        log_event(s, id, 1);
}

void sim_transient(sim *s, uint32_t row, uint64_t bytes)
{
    if (bytes)
        transient(s, row, bytes, SIM_FIXED);
}

void sim_transient_sharded(sim *s, uint32_t row, uint64_t bytes)
{
    if (bytes)
        transient(s, row, bytes, SIM_SHARDED);
}

/* tensor x's gradient is g (-1 none), counted in ngrads */
static void set_grad(sim *s, int32_t x, int32_t g)
{
    s->ngrads += (size_t)(g >= 0) - (size_t)(s->t[x].grad >= 0);
    s->t[x].grad = g;
}

/* gradient of tensor `x` arrives: a new tensor, or accumulated into the
 * existing one (autograd's InputBuffer: old + new, a temporary of that size) */
static void grad_arrives(sim *s, int32_t x, uint32_t row)
{
    sim_tensor *t = &s->t[x];
    if (t->grad < 0) {
        int32_t g = sim_alloc(s, row, sim_grad_bytes(s, x), F_TEMP, 0);
        set_grad(s, x, g);
    } else {
        sim_transient(s, row, sim_grad_bytes(s, x));
    }
}

/* the gradient of x is (a view of) g: no new storage unless one is there */
static void grad_alias(sim *s, int32_t x, int32_t g, uint32_t row)
{
    if (s->t[x].grad < 0) {
        sim_hold(s, g);
        set_grad(s, x, g);
    } else {
        sim_transient(s, row, sim_grad_bytes(s, x));
    }
}

static void drop_grad(sim *s, int32_t x)
{
    if (x >= 0 && s->t[x].grad >= 0) {
        int32_t g = s->t[x].grad;
        set_grad(s, x, -1);
        sim_drop(s, g);
    }
}

/* a checkpointed layer: re-run it with grad enabled, then backward through it
 * (reentrant: the whole layer, output included; non-reentrant: the layer
 * program stops at its last saved tensor - both re-create the saved set) */
static void ckpt_backward(sim *s, const sim_node *n, sim_recompute_fn fn, void *ctx)
{
    size_t start = s->ntape;
    int32_t o2 = fn(s, n, ctx);
    if (o2 >= 0 && n->out >= 0) {
        set_grad(s, o2, s->t[n->out].grad);
        set_grad(s, n->out, -1);
    }
    int32_t extra = s->ckpt_extra;
    s->ckpt_extra = -1;
    size_t end = s->ntape;
    sim_backward(s, start, end, fn, ctx);
    s->ntape = start;
    drop_grad(s, o2);
    sim_drop(s, o2);
    if (extra >= 0) { /* the host copy's device twin and its gradient */
        drop_grad(s, extra);
        sim_drop(s, extra);
    }
    for (int i = 0; i < n->nsaved; i++)
        unsave_slot(s, n, i);
}

/* unpack_tensor: the host copies come back to the device for this backward */
static void unpack(sim *s, const sim_node *n, int32_t *dev)
{
    for (int i = 0; i < n->nsaved; i++)
        dev[i] = n->host_saved & (1u << i) && !n->free_first
                     ? sim_alloc(s, n->row, s->t[n->saved[i]].bytes, F_TEMP, 0) : -1;
}

static void node_backward(sim *s, const sim_node *n)
{
    int32_t dev[SIM_MAX_SAVED];
    int host = n->host_saved && !n->free_first; /* copies come back (unpack) */
    if (host)
        unpack(s, n, dev);
    if (n->free_first)
        for (int i = 0; i < n->nsaved; i++)
            unsave_slot(s, n, i);
    int32_t og = n->out >= 0 ? s->t[n->out].grad : -1;
    for (int i = 0; i < n->nin; i++) {
        if (n->grad_views && og >= 0)
            grad_alias(s, n->in[i], og, n->row);
        else
            grad_arrives(s, n->in[i], n->row);
    }
    if (n->wgrad_bytes) {
        /* AccumulateGrad: the first gradient becomes .grad (kept until
         * zero_grad); a second contribution (tied weights) is added */
        int32_t g = sim_alloc(s, n->wgrad_row, n->wgrad_bytes, F_GRAD, n->wgrad_sharded);
        if (s->on_wgrad && g >= 0)
            s->on_wgrad(s, g, s->on_wgrad_ctx);
        if (n->wgrad_transient)
            sim_drop(s, g); /* copied into the reduce bucket / partition */
        /* else stays alive: held until the optimizer's zero_grad */
    }
    sim_transient(s, n->row, n->bwd_tmp);
    for (int i = 0; host && i < n->nsaved; i++)
        sim_drop(s, dev[i]);
    for (int i = 0; !n->free_first && i < n->nsaved; i++)
        unsave_slot(s, n, i);
    drop_grad(s, n->out);
    for (int i = 0; i < n->nouts; i++)
        drop_grad(s, n->outs[i]);
}

uint64_t sim_alive_temp(const sim *s)
{
    /* account() keeps every alive tensor's bytes in its factor: a temporary's
     * in F_TEMP, or F_ACT while saved (fact_of) */
    uint64_t n = 0;
    for (int f = F_ACT; f <= F_TEMP; f++)
        n += s->fact_fixed[f] + s->fact_sharded[f] + s->fact_multi[f];
    return n;
}

/* the graph is freed: a gradient no node consumed (of a leaf activation that was
 * made to require grad, e.g. enable_input_require_grads' embedding output) dies
 * with its tensor */
void sim_release_grads(sim *s)
{
    for (size_t i = 0; i < s->nt && s->ngrads; i++) /* none left: none to look for */
        drop_grad(s, (int32_t)i);
}

void sim_backward(sim *s, size_t from, size_t to, sim_recompute_fn fn, void *ctx)
{
    for (size_t k = to; k-- > from;) {
        if (s->oom || s->stopped)
            return;
        const sim_node *p = &s->tape[k];
        sim_label(s, NULL, p->row);
        if (!p->marker && !p->ckpt) {
            node_backward(s, p); /* makes no node: the tape stays where it is */
            continue;
        }
        sim_node n = *p; /* copy: a marker or recompute may grow (realloc) the tape */
        if (n.marker)
            n.marker(s, &n, n.marker_ctx);
        else
            ckpt_backward(s, &n, fn, ctx);
    }
}

static uint32_t pieces_of(const sim_row *r, int use_trainable)
{
    uint32_t c = use_trainable && r->trainable_count ? r->trainable_count : r->count;
    return c ? c : 1;
}

void sim_each_piece(const sim *s, const uint64_t *row_bytes, int use_trainable, sim_piece_fn fn,
                    void *ctx)
{
    uint32_t nmod = 0;
    for (size_t r = 0; r < s->nrows; r++)
        if (s->rows[r].module + 1 > nmod)
            nmod = s->rows[r].module + 1;
    for (uint32_t m = 0; m < nmod; m++) {
        uint32_t most = 0;
        for (size_t r = 0; r < s->nrows; r++)
            if (s->rows[r].module == m && row_bytes[r] && pieces_of(&s->rows[r], use_trainable) > most)
                most = pieces_of(&s->rows[r], use_trainable);
        for (uint32_t k = 0; k < most; k++)
            for (size_t r = 0; r < s->nrows; r++) {
                uint32_t c = pieces_of(&s->rows[r], use_trainable);
                if (s->rows[r].module != m || !row_bytes[r] || k >= c)
                    continue;
                uint64_t per = row_bytes[r] / c;
                fn(ctx, (uint32_t)r, k == 0 ? per + row_bytes[r] % c : per);
            }
    }
}
