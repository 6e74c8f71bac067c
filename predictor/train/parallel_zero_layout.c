/* parallel_zero_layout.c - DeepSpeed ZeRO's partitions of the busiest rank
 * (see parallel.h, docs/parallel.md; DeepSpeed 0.19.8 runtime/zero/).
 *
 * The optimizer's parameter groups (the Trainer's decay and no-decay groups)
 * are each flattened, padded to 2N elements and cut into N equal partitions
 * (stage_1_and_2.py flatten_dense_tensors_aligned; stage 2 first reorders
 * the tensors round-robin over the ranks, _round_robin_reorder).  A rank's
 * gradient partition buffer holds every parameter that overlaps its
 * partition whole (copy_grads_in_partition: grads_in_partition), so the
 * busiest rank is the one whose boundaries cut the largest tensors.  Stage 3
 * partitions each tensor on its own.  Used by stages 1-2 (parallel_zero.c)
 * and 3 (parallel_zero3.c), below both. */
#include "parallel.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct pieces {
    sim *s;
    uint64_t *v;
    size_t n, cap;
} pieces;

static void add_piece(void *ctx, uint32_t row, uint64_t n)
{
    pieces *p = ctx;
    (void)row;
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 256;
        uint64_t *v = realloc(p->v, cap * sizeof *v);
        if (!v) {
            p->s->oom = 1;
            return;
        }
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = n;
}

static int in_layers(const sim_row *R)
{
    return strstr(R->name, "layers.") != NULL;
}

/* a linear row's bias elements per instance: what its parameters hold
 * beyond the out x in weight (0 when the row does not add up to one) */
static uint64_t linear_bias(const sim_row *R)
{
    uint64_t w = R->mat_rows * R->mat_cols, per = R->count ? R->params / R->count : 0;
    if (strcmp(R->kind, "linear") || !w || per <= w)
        return 0;
    return per - w == R->mat_rows ? per - w : 0;
}

/* what group_pieces reads of a row, found once per row (not per layer) */
typedef struct row_facts {
    uint64_t n;      /* requires_grad parameters */
    uint64_t bias;   /* linear_bias */
    uint32_t c;      /* instances they are split over */
    uint8_t lay, norm;
} row_facts;

/* one row's requires_grad tensors (its instances) in one group: the norms
 * and the linears' biases are the no-decay group's, the rest the decay
 * group's */
static void row_pieces(const row_facts *F, uint32_t k, int nodecay, pieces *out)
{
    uint32_t c = F->c ? F->c : 1;
    if (k >= c)
        return;
    uint64_t piece = F->n / c + (k == 0 ? F->n % c : 0), b = F->bias;
    b = b < piece ? b : 0;
    if (F->norm)
        piece = nodecay ? piece : 0;
    else
        piece = nodecay ? b : piece - b;
    if (piece)
        add_piece(out, 0, piece);
}

static void row_facts_of(const par_state *ps, const sim_row *R, row_facts *F)
{
    F->lay = (uint8_t)in_layers(R);
    F->n = par_requires_grad(ps, R);
    F->c = F->n == R->trainable ? R->trainable_count : R->count;
    F->bias = linear_bias(R);
    F->norm = strstr(R->kind, "norm") != NULL;
}

/* The trainable tensors of one group in the order DeepSpeed flattens them:
 * model.parameters() order - per module the rows before its layers, the
 * layers one after another, the rows after.  The Trainer's no-decay group
 * holds the LayerNorm modules' parameters and every name matching "bias",
 * "layernorm", "rmsnorm", "norm" (transformers 5.17 trainer.py:1374-1375
 * get_decay_parameter_names): the norms and the biases. */
static int group_pieces(const par_state *ps, int nodecay, pieces *out)
{
    sim *s = ps->c->s;
    /* each row's facts, read once (not per module and layer): the rows of one
     * module that require grad, in row order */
    uint32_t *mine = malloc((s->nrows + 1) * sizeof *mine);
    row_facts *F = malloc((s->nrows + 1) * sizeof *F);
    if (!mine || !F) {
        free(mine);
        free(F);
        s->oom = 1;
        return -1;
    }
    for (size_t r = 0; r < s->nrows; r++)
        row_facts_of(ps, &s->rows[r], &F[r]);
    for (uint32_t m = 0; m < MM_MAX_MODULES; m++) {
        size_t first = s->nrows, nm = 0;
        uint32_t most = 0;
        for (size_t r = 0; r < s->nrows; r++) {
            if (s->rows[r].module != m)
                continue;
            if (F[r].lay) {
                first = r < first ? r : first;
                most = s->rows[r].count > most ? s->rows[r].count : most;
            }
            if (F[r].n)
                mine[nm++] = (uint32_t)r;
        }
        for (int part = 0; part < 3; part++)
            for (uint32_t k = 0; k < (part == 1 ? most : 1); k++)
                for (size_t j = 0; j < nm; j++) {
                    size_t r = mine[j];
                    int want = part == 1 ? F[r].lay : !F[r].lay && (part == 0) == (r < first);
                    if (want)
                        row_pieces(&F[r], k, nodecay, out);
                }
    }
    free(mine);
    free(F);
    return s->oom ? -1 : 0;
}

/* _round_robin_reorder: tensor i goes to rank i % N, ranks' lists concatenated */
static int round_robin(pieces *p, uint64_t N)
{
    uint64_t *v = malloc((p->n + 1) * sizeof *v);
    size_t k = 0;
    if (!v)
        return -1;
    for (uint64_t r = 0; r < N; r++)
        for (size_t i = (size_t)r; i < p->n; i += (size_t)N)
            v[k++] = p->v[i];
    free(p->v);
    p->v = v;
    p->cap = p->n;
    return 0;
}

/* the busiest rank of one group: whole tensors overlapping its partition */
static void busiest(const pieces *p, uint64_t N, zlayout *z, zlayout *g)
{
    uint64_t total = 0;
    for (size_t i = 0; i < p->n; i++)
        total += p->v[i];
    uint64_t padded = mm_ceil_div(total, 2 * N) * 2 * N;
    g->S = padded / N;
    g->gip = g->piece = 0;
    g->pieces = 0;
    for (uint64_t r = 0; r < N && g->S; r++) {
        uint64_t lo = r * g->S, hi = lo + g->S, off = 0, whole = 0, big = 0;
        int n = 0;
        for (size_t i = 0; i < p->n; off += p->v[i], i++) {
            if (off + p->v[i] <= lo || off >= hi || !p->v[i])
                continue;
            uint64_t a = off > lo ? off : lo, b = off + p->v[i] < hi ? off + p->v[i] : hi;
            whole += p->v[i];
            big = b - a > big ? b - a : big;
            n++;
        }
        if (whole > g->gip) {
            g->gip = whole;
            g->piece = big;
            g->pieces = n;
        }
    }
    z->gip += g->gip;
    if (g->piece > z->piece)
        z->piece = g->piece;
    if (g->S > z->S) {
        z->S = g->S;
        z->pieces = g->pieces;
    }
}

int zero_layout(par_state *ps, int round_robin_order, zlayout *z)
{
    sim *s = ps->c->s;
    uint64_t N = s->dp ? s->dp : 1;
    memset(z, 0, sizeof *z);
    for (int g = 0; g < 2; g++) {
        pieces p = {.s = s};
        zlayout one;
        if (group_pieces(ps, g, &p) || (round_robin_order && round_robin(&p, N))) {
            free(p.v);
            s->oom = 1;
            return -1;
        }
        busiest(&p, N, z, &one);
        free(p.v);
    }
    return 0;
}

/* Stage 3 partitions every tensor on its own (partition_parameters.py
 * _partition_param: ceil(numel / N) per rank) and steps the optimizer one
 * sub-group at a time: a run of tensors closed once their partitions reach
 * sub_group_size (stage3.py _create_fp16_sub_groups).  S is the largest
 * sub-group, piece the largest tensor partition. */
int zero3_layout(par_state *ps, zlayout *z)
{
    sim *s = ps->c->s;
    uint64_t N = s->dp ? s->dp : 1, cap = ps->rm->deepspeed.sub_group_size;
    memset(z, 0, sizeof *z);
    z->pieces = 2;
    for (int g = 0; g < 2; g++) {
        pieces p = {.s = s};
        if (group_pieces(ps, g, &p)) {
            free(p.v);
            s->oom = 1;
            return -1;
        }
        uint64_t run = 0;
        for (size_t i = 0; i < p.n; i++) {
            uint64_t part = mm_ceil_div(p.v[i], N);
            run = sim_add(s, run, part);
            z->piece = part > z->piece ? part : z->piece;
            z->S = run > z->S ? run : z->S;
            if (run >= cap)
                run = 0;
        }
        free(p.v);
    }
    return 0;
}
