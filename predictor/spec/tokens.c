/* tokens.c - visual tokens per image (see tokens.h).  Each processor kind
 * follows the transformers 5.17 code named at it, including Python's rounding
 * (round() is half-to-even: rint in the default rounding mode). */
#include "tokens.h"
#include "util.h"

#include <math.h>
#include <string.h>

const module_spec *mm_spec_module(const mm_spec *s, mod_kind k)
{
    for (size_t i = 0; i < s->n_modules; i++)
        if (s->modules[i].kind == k)
            return &s->modules[i];
    return NULL;
}

/* Qwen2VLImageProcessor smart_resize (image_processing_qwen2_vl.py) */
static int smart_resize(uint64_t h, uint64_t w, uint64_t factor, uint64_t minp, uint64_t maxp,
                        uint64_t *oh, uint64_t *ow)
{
    double H = (double)h, W = (double)w, f = (double)factor;
    if ((H > W ? H / W : W / H) > 200)
        return -1;
    double hb = rint(H / f) * f, wb = rint(W / f) * f;
    if (hb * wb > (double)maxp) {
        double beta = sqrt(H * W / (double)maxp);
        hb = fmax(f, floor(H / beta / f) * f);
        wb = fmax(f, floor(W / beta / f) * f);
    } else if (hb * wb < (double)minp) {
        double beta = sqrt((double)minp / (H * W));
        hb = ceil(H * beta / f) * f;
        wb = ceil(W * beta / f) * f;
    }
    *oh = (uint64_t)hb;
    *ow = (uint64_t)wb;
    return 0;
}

/* GotOcr2 get_optimal_tiled_canvas (InternVL): (columns, rows) */
static void tiled_canvas(uint64_t h, uint64_t w, uint64_t tile, uint64_t lo, uint64_t hi,
                         uint64_t *cols, uint64_t *rows)
{
    double ar = (double)w / (double)h, area = (double)w * (double)h, best = INFINITY;
    *cols = *rows = 1;
    for (uint64_t n = lo; n <= hi; n++) /* sorted by tile count, then width */
        for (uint64_t c = 1; c <= n; c++) {
                if (n % c)
                    continue;
                uint64_t r = n / c;
                double d = fabs(ar - (double)c / (double)r);
                if (d < best) {
                    best = d;
                    *cols = c;
                    *rows = r;
                } else if (d == best && area > 0.5 * (double)(tile * tile * c * r)) {
                    *cols = c;
                    *rows = r;
                }
        }
}

/* image_processing_utils.select_best_resolution (LLaVA-NeXT / OneVision) */
static void best_resolution(const image_proc *ip, uint64_t h, uint64_t w, uint64_t *bh,
                            uint64_t *bw)
{
    uint64_t max_eff = 0;
    double min_waste = INFINITY;
    *bh = ip->pinpoints[0][0];
    *bw = ip->pinpoints[0][1];
    for (size_t i = 0; i < ip->n_pinpoints; i++) {
        double ph = (double)ip->pinpoints[i][0], pw = (double)ip->pinpoints[i][1];
        double scale = fmin(pw / (double)w, ph / (double)h);
        uint64_t dw = (uint64_t)((double)w * scale), dh = (uint64_t)((double)h * scale);
        uint64_t eff = dw * dh < w * h ? dw * dh : w * h;
        double waste = pw * ph - (double)eff;
        if (eff > max_eff || (eff == max_eff && waste < min_waste)) {
            max_eff = eff;
            min_waste = waste;
            *bh = ip->pinpoints[i][0];
            *bw = ip->pinpoints[i][1];
        }
    }
}

/* LlavaOnevisionProcessor._get_number_of_features / _get_unpadded_features */
static uint64_t anyres_features(const module_spec *v, uint64_t h, uint64_t w, uint64_t sh,
                                uint64_t sw, uint64_t g)
{
    uint64_t ch = g * sh, cw = g * sw;
    double oar = (double)w / (double)h, car = (double)cw / (double)ch;
    if (oar > car) {
        uint64_t nh = (uint64_t)(rint((double)h * ((double)cw / (double)w) * 1e7) / 1e7);
        ch -= ((ch - nh) / 2) * 2;
    } else {
        uint64_t nw = (uint64_t)(rint((double)w * ((double)ch / (double)h) * 1e7) / 1e7);
        cw -= ((cw - nw) / 2) * 2;
    }
    uint64_t unpadded = ch * cw, newline = v->img.newline ? ch : 0;
    uint64_t maxp = v->img.max_tiles ? v->img.max_tiles : 9;
    double ratio = sqrt((double)(ch * cw) / (double)(maxp * g * g));
    if (ratio > 1.1) {
        uint64_t rh = (uint64_t)floor((double)ch / ratio), rw = (uint64_t)floor((double)cw / ratio);
        unpadded = rh * rw;
        newline = v->img.newline ? rh : 0;
    }
    return unpadded + newline + g * g;
}

/* Idefics3ImageProcessor get_number_of_image_patches: tiles incl. the global one */
static uint64_t split_tiles(const module_spec *v, uint64_t h, uint64_t w)
{
    double H = (double)h, W = (double)w, ar = W / H, L = (double)v->img.longest_edge;
    if (W >= H) {
        W = L;
        H = floor(W / ar);
        if ((uint64_t)H % 2)
            H += 1;
    } else {
        H = L;
        W = floor(H * ar);
        if ((uint64_t)W % 2)
            W += 1;
    }
    H = fmax(H, 1);
    W = fmax(W, 1);
    ar = W / H;
    if (W >= H && W > 4096) { /* MAX_IMAGE_SIZE */
        W = 4096;
        H = floor(W / ar);
    } else if (H > W && H > 4096) {
        H = 4096;
        W = floor(H * ar);
    }
    double t = (double)v->image_size;
    double rh = ceil(fmax(H, 1) / t) * t, rw = ceil(fmax(W, 1) / t) * t;
    if (rh > t || rw > t)
        return (uint64_t)(ceil(rh / t) * ceil(rw / t)) + 1;
    return 1;
}

/* PixtralImageProcessor (image_processing_pil_pixtral.py get_resize_output_image_size,
 * :90-103): scaled down (floor) so that neither side exceeds longest_edge, then each
 * side rounded up to whole patches.  processing_pixtral.py:102-104 puts an
 * [IMG_BREAK] after each row of [IMG] tokens, the last one an [IMG_END]. */
static int pixtral(const mm_spec *s, const module_spec *v, uint64_t h, uint64_t w,
                   vis_tokens *o)
{
    /* Mistral3: PixtralProcessor passes patch_size x spatial_merge_size to the image
     * processor (processing_pixtral.py:94) and counts merged rows (:98-104) */
    const module_spec *c = mm_spec_module(s, MOD_CONNECTOR);
    uint64_t mg = c && c->conn == CONN_MISTRAL3 && c->merge_size ? c->merge_size : 1;
    double L = (double)(v->img.longest_edge ? v->img.longest_edge : v->image_size);
    double H = (double)h, W = (double)w, ratio = fmax(H / L, W / L);
    if (ratio > 1) {
        H = floor(H / ratio);
        W = floor(W / ratio);
    }
    uint64_t p = v->patch_size * mg, hh = H < 1 ? 1 : (uint64_t)H, ww = W < 1 ? 1 : (uint64_t)W;
    o->tiles = 1;
    o->grid_h = ((hh - 1) / p + 1) * mg;
    o->grid_w = ((ww - 1) / p + 1) * mg;
    o->patches = o->seq = o->grid_h * o->grid_w;
    o->llm_tokens = o->patches / (mg * mg) + o->grid_h / mg;
    return 0;
}

/* tokens a tile (or the packed image) gives the language model after the connector */
static uint64_t after_connector(const mm_spec *s, const module_spec *v, uint64_t patches)
{
    const module_spec *c = mm_spec_module(s, MOD_CONNECTOR);
    uint64_t m = c ? c->merge_size : 1;
    if (!c || c->conn == CONN_MLP || c->conn == CONN_LINEAR)
        return patches + (v->class_token && v->keep_cls ? 1 : 0);
    if (c->conn == CONN_AVG_POOL)
        return patches / (c->pool_kernel * c->pool_kernel);
    return patches / (m * m);
}

static int fixed_like(const mm_spec *s, const module_spec *v, uint64_t tiles, vis_tokens *o)
{
    uint64_t g = v->image_size / v->patch_size;
    o->tiles = tiles;
    o->grid_h = o->grid_w = g;
    o->seq = g * g + (v->class_token ? 1 : 0);
    o->patches = tiles * g * g;
    o->llm_tokens = tiles * after_connector(s, v, g * g);
    return 0;
}

/* The pixel bounds a dynamic processor resizes with: the image processor's,
 * or for a video the frames' own where the spec gives them (qwen_vl_utils
 * fetch_video resizes frames between VIDEO_MIN_PIXELS and its per-frame cap,
 * then the processor runs with do_resize=False: ms-swift
 * swift/template/templates/qwen.py; transformers' Qwen2VLVideoProcessor built
 * from a checkpoint's preprocessor_config.json takes the image bounds) */
void tokens_pixel_bounds(const mm_spec *s, const module_spec *v, uint64_t *lo, uint64_t *hi)
{
    const training_spec *t = &s->training;
    *lo = v->img.min_pixels;
    *hi = v->img.max_pixels;
    if (t->video_frames && t->video_min_pixels)
        *lo = t->video_min_pixels;
    if (t->video_frames && t->video_max_pixels)
        *hi = t->video_max_pixels;
}

int tokens_per_image(const mm_spec *s, uint64_t h, uint64_t w, vis_tokens *o, mm_error *err)
{
    const module_spec *v = mm_spec_module(s, MOD_VISION);
    memset(o, 0, sizeof *o);
    if (!v)
        return 0;
    const image_proc *ip = &v->img;
    switch (ip->kind) {
    case IMG_FIXED:
        return fixed_like(s, v, 1, o);
    case IMG_DYNAMIC: {
        uint64_t f = v->patch_size * v->spatial_merge_size, rh, rw, lo, hi;
        tokens_pixel_bounds(s, v, &lo, &hi);
        if (smart_resize(h, w, f, lo, hi, &rh, &rw)) {
            mm_err(err, "%s: training.image_size %llux%llu: aspect ratio above 200", s->path,
                   (unsigned long long)h, (unsigned long long)w);
            return -1;
        }
        uint64_t t = s->training.video_frames && v->temporal_patch_size
                         ? (s->training.video_frames + v->temporal_patch_size - 1) /
                               v->temporal_patch_size
                         : 1;
        o->tiles = 1;
        o->grid_h = rh / v->patch_size;
        o->grid_w = rw / v->patch_size;
        o->patches = o->seq = t * o->grid_h * o->grid_w;
        o->llm_tokens = after_connector(s, v, o->patches);
        return 0;
    }
    case IMG_TILES: {
        uint64_t c = 1, r = 1, lo = ip->min_tiles ? ip->min_tiles : 1;
        if (ip->max_tiles > 1)
            tiled_canvas(h, w, v->image_size, lo, ip->max_tiles, &c, &r);
        return fixed_like(s, v, c * r + (c * r > 1 && ip->thumbnail ? 1 : 0), o);
    }
    case IMG_ANYRES: {
        uint64_t bh, bw;
        best_resolution(ip, h, w, &bh, &bw);
        uint64_t t = v->image_size, g = t / v->patch_size;
        fixed_like(s, v, 1 + (bh / t) * (bw / t), o);
        o->llm_tokens = anyres_features(v, h, w, bh / t, bw / t, g);
        return 0;
    }
    case IMG_SPLIT:
        return fixed_like(s, v, split_tiles(v, h, w), o);
    case IMG_PIXTRAL:
        return pixtral(s, v, h, w, o);
    case IMG_MLLAMA: /* pixel_values are padded to max_image_tiles; tokens reach the
                        decoder through cross-attention, not the sequence */
        fixed_like(s, v, v->max_num_tiles, o);
        o->seq += (8 - o->seq % 8) % 8;
        o->llm_tokens = 0;
        return 0;
    }
    return 0;
}

void tokens_worst_image(const mm_spec *s, const module_spec *v, uint64_t *h, uint64_t *w)
{
    const training_spec *t = &s->training;
    if (t->image_height) {
        *h = t->image_height;
        *w = t->image_width;
        return;
    }
    const image_proc *ip = &v->img;
    *h = *w = v->image_size;
    if (ip->kind == IMG_DYNAMIC) {
        uint64_t f = v->patch_size * v->spatial_merge_size, lo, hi;
        tokens_pixel_bounds(s, v, &lo, &hi);
        uint64_t side = (uint64_t)floor(sqrt((double)hi) / (double)f) * f;
        *h = *w = side ? side : f;
    } else if (ip->kind == IMG_TILES) {
        *w = v->image_size * (ip->max_tiles ? ip->max_tiles : 1); /* a 1 x max_tiles grid */
    } else if (ip->kind == IMG_ANYRES) {
        uint64_t best = 0;
        for (size_t i = 0; i < ip->n_pinpoints; i++)
            if (ip->pinpoints[i][0] * ip->pinpoints[i][1] > best) {
                best = ip->pinpoints[i][0] * ip->pinpoints[i][1];
                *h = ip->pinpoints[i][0];
                *w = ip->pinpoints[i][1];
            }
    } else if (ip->kind == IMG_PIXTRAL) {
        *h = *w = ip->longest_edge ? ip->longest_edge : v->image_size;
    } else if (ip->kind == IMG_SPLIT) {
        *h = *w = ip->longest_edge ? ip->longest_edge : v->image_size;
    }
}
