/* prog_module.c - the program entering a module: the geometry it runs at
 * (tiles and patches of the worst-case image, packed or batched, Qwen2.5-VL's
 * windows) and whether its tower's input needs a gradient.  The module runners
 * (vision.c, mllama.c, connector.c) and the program (prog.c) use it; it sits
 * below them all, so a runner never calls back into the program. */
#include "ops.h"
#include "util.h"

/* Qwen2.5-VL windows per image: window_size pixels, in patches per side */
static uint64_t windows_per_image(const lctx *c)
{
    const module_spec *m = c->m;
    if (!m->window_size || !m->patch_size)
        return 1;
    uint64_t w = m->window_size / m->patch_size;
    uint64_t a = (c->vt.grid_h + w - 1) / w, b = (c->vt.grid_w + w - 1) / w;
    return a && b ? a * b : 1;
}

void prog_enter_module(lctx *c, uint32_t mi)
{
    const training_spec *t = &c->rm->training;
    c->mi = mi;
    c->m = c->rm->modules[mi].spec;
    c->cur_row = UINT32_MAX; /* no row yet: the module's first rows (its embeddings) */
    c->attn = c->m->attention == ATT_INHERIT ? t->attention : c->m->attention;
    c->chunks = c->win_chunks = 0;
    const resolved_module *v = c->rm->vision >= 0 ? &c->rm->modules[c->rm->vision] : NULL;
    if (c->m->kind == MOD_VISION) {
        if (c->m->img.kind == IMG_PIXTRAL) { /* one sequence, a block mask (vision_pixtral.c) */
            c->B = 1;
            c->S = sim_mul(c->s, c->images, c->vt.patches);
        } else if (c->m->packed) { /* one sequence of every patch, attention per image */
            c->B = c->images;
            c->S = c->vt.patches;
            c->chunks = c->images;
            c->win_chunks = sim_mul(c->s, c->images, windows_per_image(c));
        } else {
            c->B = sim_mul(c->s, c->images, c->vt.tiles);
            c->S = c->vt.seq;
        }
    } else if (c->m->kind == MOD_CONNECTOR) {
        uint64_t per = c->vt.grid_h * c->vt.grid_w + (v && v->feature_cls ? 1 : 0);
        c->B = v && v->packed ? c->images : sim_mul(c->s, c->images, c->vt.tiles);
        c->S = v && v->packed ? c->vt.patches : per;
    } else {
        c->B = t->micro_batch_size;
        c->S = t->seq_len;
    }
    c->T = sim_mul(c->s, c->B, c->S);
}

int tower_input_grads(const lctx *c)
{
    return c->input_grads && c->rm->framework.tf_major >= 5 && !c->m->no_input_hook;
}
