/* cli_html.c - the pictures (issue 25): `mmguard predict SPEC --html FILE`
 * (live bytes over the predicted step, stacked by factor and by module, the
 * reserved line, the peak event, the card) and `mmguard report LOG --html
 * FILE` (decisions over time, predicted vs measured, error histogram, margin
 * advice).  Self-contained HTML with inline SVG: no script, no network, no
 * external file.  Every text from a spec or a log is HTML-escaped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_html.h"
#include "loop.h"
#include "timeline.h"

#define W 900.0
#define H 340.0
#define ML 80.0   /* left margin: the y labels */
#define MR 170.0  /* right margin: the legend */
#define MT 20.0
#define MB 40.0
#define GIB 1073741824.0

static const char *const colors[] = { "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
                                      "#edc948", "#b07aa1", "#9c755f" };

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '<') fputs("&lt;", f);
        else if (c == '>') fputs("&gt;", f);
        else if (c == '&') fputs("&amp;", f);
        else if (c == '"') fputs("&quot;", f);
        else if (c < 0x20 || c == 0x7f) fputc('?', f);
        else fputc(c, f);
    }
}

static void head(FILE *f, const char *title)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>", f);
    esc(f, title);
    fputs("</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}"
          "figure{margin:18px 0}figcaption{font-size:13px;color:#555}"
          "svg text{font-size:11px;font-family:sans-serif}"
          "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 8px}"
          "</style></head>\n<body>\n<h1>", f);
    esc(f, title);
    fputs("</h1>\n", f);
}

/* An empty chart with y ticks (ymax in display units) and x label; returns
 * nothing, the caller draws inside [ML, W-MR] x [MT, H-MB]. */
static void frame(FILE *f, const char *id, const char *ylabel, double ymax, const char *xlabel)
{
    fprintf(f, "<svg id=\"%s\" width=\"%.0f\" height=\"%.0f\" "
               "viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n", id, W, H, W, H);
    fprintf(f, "<rect x=\"0\" y=\"0\" width=\"%.0f\" height=\"%.0f\" fill=\"#fff\"/>\n", W, H);
    for (int i = 0; i <= 5; i++) {
        double y = H - MB - (H - MT - MB) * i / 5.0;
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n",
                ML, W - MR, y, y, ML - 6, y + 4, ymax * i / 5.0);
    }
    fprintf(f, "<text x=\"14\" y=\"%.1f\" transform=\"rotate(-90 14 %.1f)\" text-anchor=\"middle\">",
            (H - MB + MT) / 2, (H - MB + MT) / 2);
    esc(f, ylabel);
    fprintf(f, "</text>\n<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", (ML + W - MR) / 2, H - 8);
    esc(f, xlabel);
    fputs("</text>\n", f);
}

static void legend(FILE *f, size_t i, const char *color, const char *name, int dashed)
{
    double y = MT + 14 + 18.0 * (double)i;
    if (dashed)
        fprintf(f, "<line class=\"legend\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                   "stroke-width=\"2\" stroke-dasharray=\"5,3\"/>", W - MR + 12, W - MR + 26, y - 4, y - 4, color);
    else
        fprintf(f, "<rect class=\"legend\" x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"10\" fill=\"%s\"/>",
                W - MR + 12, y - 9, color);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", W - MR + 32, y);
    esc(f, name);
    fputs("</text>\n", f);
}

static double px(double x, double xmax)
{
    return ML + (W - MR - ML) * (xmax > 0 ? x / xmax : 0);
}

static double py(double y, double ymax)
{
    return H - MB - (H - MT - MB) * (ymax > 0 ? y / ymax : 0);
}

/* ---- predict ---------------------------------------------------------------------- */

static uint64_t layer_value(const mm_tl_point *p, int by_module, size_t k)
{
    return by_module ? p->module[k] : p->factor[k];
}

/* One stacked chart: layers (factors or modules) as areas, the reserved line,
 * the peak, the card. */
static void stack_chart(FILE *f, const mm_timeline *tl, int by_module, double ymax, uint64_t card,
                        uint64_t device_peak)
{
    size_t nl = by_module ? MM_TL_MODULES : MM_TL_FACTORS, li = 0;
    double xmax = tl->n > 1 ? (double)(tl->n - 1) : 1;
    double *base = calloc(tl->n + 1, sizeof(double));
    frame(f, by_module ? "live-by-module" : "live-by-factor", "GiB", ymax / GIB, "allocation events of one step (sampled)");
    for (size_t k = 0; base && k < nl; k++) {
        const char *name = by_module ? tl->module_names[k] : mm_tl_factor_names[k];
        int any = 0;
        for (size_t i = 0; i < tl->n; i++)
            any |= layer_value(&tl->pts[i], by_module, k) != 0;
        if (!any)
            continue;
        fprintf(f, "<polygon class=\"layer\" fill=\"%s\" fill-opacity=\"0.85\" points=\"", colors[k % 8]);
        for (size_t i = 0; i < tl->n; i++)
            fprintf(f, "%.1f,%.1f ", px((double)i, xmax),
                    py(base[i] + (double)layer_value(&tl->pts[i], by_module, k), ymax));
        for (size_t i = tl->n; i-- > 0;)
            fprintf(f, "%.1f,%.1f ", px((double)i, xmax), py(base[i], ymax));
        fputs("\"/>\n", f);
        for (size_t i = 0; i < tl->n; i++)
            base[i] += (double)layer_value(&tl->pts[i], by_module, k);
        legend(f, li++, colors[k % 8], name, 0);
    }
    fputs("<polyline id=\"reserved\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.5\" points=\"", f);
    for (size_t i = 0; i < tl->n; i++)
        fprintf(f, "%.1f,%.1f ", px((double)i, xmax), py((double)tl->pts[i].reserved, ymax));
    fputs("\"/>\n", f);
    legend(f, li++, "#333", "reserved (1 replay)", 1);
    fprintf(f, "<line id=\"device-peak\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#9467bd\" "
               "stroke-dasharray=\"2,3\" stroke-width=\"2\"/>\n", ML, W - MR, py((double)device_peak, ymax),
            py((double)device_peak, ymax));
    legend(f, li++, "#9467bd", "predicted device peak", 1);
    fprintf(f, "<line id=\"peak\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\"/>"
               "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#d62728\"/>\n",
            px((double)tl->peak_point, xmax), px((double)tl->peak_point, xmax), MT,
            H - MB, px((double)tl->peak_point, xmax), py((double)tl->peak_live, ymax));
    legend(f, li++, "#d62728", "peak event", 0);
    if (card) {
        fprintf(f, "<line id=\"capacity\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#000\" "
                   "stroke-dasharray=\"8,4\" stroke-width=\"2\"/>\n", ML, W - MR, py((double)card, ymax),
                py((double)card, ymax));
        legend(f, li, "#000", "card capacity", 1);
    }
    fputs("</svg>\n", f);
    free(base);
}

static void gib(char *buf, size_t n, double v)
{
    snprintf(buf, n, "%.2f GiB", v / GIB);
}

int mm_html_predict(FILE *f, const mm_spec *sp, const mm_prediction *p, const mm_timeline *tl,
                    uint64_t card)
{
    char a[32], b[32], c[32];
    double ymax = (double)tl->peak_live;
    if ((double)p->peak_bytes > ymax)
        ymax = (double)p->peak_bytes;
    if ((double)tl->reserved_peak > ymax)
        ymax = (double)tl->reserved_peak;
    if ((double)card > ymax)
        ymax = (double)card;
    ymax *= 1.08;
    head(f, "mmguard predict: memory over one step");
    fprintf(f, "<p id=\"summary\" data-peak-live=\"%llu\" data-peak-bytes=\"%llu\" data-events=\"%llu\">Spec <b>",
            (unsigned long long)tl->peak_live, (unsigned long long)p->peak_bytes,
            (unsigned long long)tl->events);
    esc(f, mm_spec_name(sp));
    gib(a, sizeof a, (double)p->peak_bytes);
    gib(b, sizeof b, (double)tl->peak_live);
    gib(c, sizeof c, (double)tl->reserved_peak);
    fprintf(f, "</b> at %u GPU(s): predicted device peak <b>%s</b> (allocated peak on the timeline "
               "%s, reserved %s) in the ", tl->data_parallel, a, b, c);
    esc(f, mm_phase_name(p->peak_phase));
    fputs(" phase, at <code>", f);
    esc(f, p->peak_event);
    fprintf(f, "</code>; %llu allocation events.", (unsigned long long)tl->events);
    if (card) {
        gib(a, sizeof a, (double)card);
        fprintf(f, " Card: %s.", a);
    }
    fputs("</p>\n<figure>", f);
    stack_chart(f, tl, 0, ymax, card, p->peak_bytes);
    fputs("<figcaption>Live bytes by factor over the step's allocation events (the allocated "
          "peak is the prediction's); the solid line is what the caching allocator model reserves "
          "replaying this step once from an empty cache (the prediction's reserved peak replays two "
          "steps); dotted: the predicted device peak (reserved + CUDA context and the rest outside "
          "the allocator), which is what is judged against the card; red: the peak event."
          "</figcaption></figure>\n<figure>", f);
    stack_chart(f, tl, 1, ymax, card, p->peak_bytes);
    fputs("<figcaption>The same by module.</figcaption></figure>\n</body></html>\n", f);
    return ferror(f) ? -1 : 0;
}

/* ---- report ----------------------------------------------------------------------- */

static const char *const dec_order[] = { "accept", "warn", "reject", "resize", "error" };

/* decisions per day, stacked bars */
static void decisions_chart(FILE *f, struct mm_loop *l)
{
    size_t n = mm_loop_n_decisions(l), ndays = 0;
    char (*day)[11] = calloc(n + 1, sizeof(*day));
    size_t (*cnt)[5] = calloc(n + 1, sizeof(*cnt));
    size_t ymax = 1;
    for (size_t i = 0; day && cnt && i < n; i++) {
        const char *t, *d = mm_loop_decision_at(l, i, &t);
        size_t k = 0, di;
        while (k < 5 && strcmp(d, dec_order[k]))
            k++;
        for (di = 0; di < ndays && strncmp(day[di], t, 10); di++)
            ;
        if (di == ndays)
            snprintf(day[ndays++], sizeof day[0], "%.10s", t);
        if (k < 5)
            cnt[di][k]++;
    }
    for (size_t di = 0; cnt && di < ndays; di++) {
        size_t s = cnt[di][0] + cnt[di][1] + cnt[di][2] + cnt[di][3] + cnt[di][4];
        ymax = s > ymax ? s : ymax;
    }
    frame(f, "decisions", "decisions per day", (double)ymax, "day");
    for (size_t di = 0; cnt && di < ndays; di++) {
        double bw = (W - MR - ML) / (double)ndays, x = ML + bw * (double)di, acc = 0;
        for (size_t k = 0; k < 5; k++) {
            double h = (H - MT - MB) * (double)cnt[di][k] / (double)ymax;
            if (cnt[di][k])
                fprintf(f, "<rect class=\"bar\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>",
                        x + 1, H - MB - acc - h, bw > 3 ? bw - 2 : bw, h, colors[k]);
            acc += h;
        }
        if (ndays <= 31) {
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", x + bw / 2, H - MB + 12);
            esc(f, day[di]);
            fputs("</text>", f);
        }
        fputc('\n', f);
    }
    for (size_t k = 0; k < 5; k++)
        legend(f, k, colors[k], dec_order[k], 0);
    fputs("</svg>\n", f);
    free(day);
    free(cnt);
}

static void scatter_chart(FILE *f, const double *pred, const double *meas, size_t n)
{
    double m = 1;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fmax(pred[i], meas[i]) / GIB);
    m *= 1.05;
    frame(f, "scatter", "measured peak, GiB", m, "predicted peak, GiB");
    fprintf(f, "<line id=\"diagonal\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\" "
               "stroke-dasharray=\"4,3\"/>\n", px(0, m), py(0, m), px(m, m), py(m, m));
    for (size_t i = 0; i < n; i++)
        fprintf(f, "<circle class=\"job\" cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\" fill-opacity=\"0.7\"/>\n",
                px(pred[i] / GIB, m), py(meas[i] / GIB, m), meas[i] > pred[i] ? colors[2] : colors[0]);
    legend(f, 0, colors[0], "over-predicted", 0);
    legend(f, 1, colors[2], "under-predicted", 0);
    legend(f, 2, "#999", "predicted = measured", 1);
    fputs("</svg>\n", f);
}

static void histogram_chart(FILE *f, const double *pred, const double *meas, size_t n)
{
    enum { NB = 20 };
    size_t bins[NB] = { 0 }, ymax = 1;
    for (size_t i = 0; i < n; i++) {
        double e = pred[i] / meas[i] - 1;                  /* -0.5 .. 0.5 in 5 % bins */
        int b = (int)floor((e + 0.5) / 0.05);
        bins[b < 0 ? 0 : b >= NB ? NB - 1 : b]++;
    }
    for (int b = 0; b < NB; b++)
        ymax = bins[b] > ymax ? bins[b] : ymax;
    frame(f, "histogram", "jobs", (double)ymax, "predicted / measured - 1 (5% bins, ends open)");
    for (int b = 0; b < NB; b++) {
        double bw = (W - MR - ML) / NB, h = (H - MT - MB) * (double)bins[b] / (double)ymax;
        fprintf(f, "<rect class=\"bin\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%+.0f%%</text>\n",
                ML + bw * b + 1, H - MB - h, bw - 2, h, b < NB / 2 ? colors[2] : colors[0],
                ML + bw * b + bw / 2, H - MB + 12, (-0.5 + 0.05 * b) * 100);
    }
    legend(f, 0, colors[2], "under-predictions", 0);
    legend(f, 1, colors[0], "over-predictions", 0);
    fputs("</svg>\n", f);
}

static void advice_chart(FILE *f, struct mm_loop *l)
{
    size_t acc[MM_LOOP_N_MARGINS], oom[MM_LOOP_N_MARGINS], ymax = 1;
    double xmax = mm_loop_margins[MM_LOOP_N_MARGINS - 1];
    mm_loop_advice(l, acc, oom);
    for (size_t m = 0; m < MM_LOOP_N_MARGINS; m++)
        ymax = acc[m] > ymax ? acc[m] : ymax;
    frame(f, "advice", "recorded jobs", (double)ymax, "margin, % of the card");
    for (int k = 0; k < 2; k++) {
        fprintf(f, "<polyline class=\"curve\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"",
                colors[k ? 2 : 0]);
        for (size_t m = 0; m < MM_LOOP_N_MARGINS; m++)
            fprintf(f, "%.1f,%.1f ", px(mm_loop_margins[m], xmax), py((double)(k ? oom[m] : acc[m]), (double)ymax));
        fputs("\"/>\n", f);
        for (size_t m = 0; m < MM_LOOP_N_MARGINS; m++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>", px(mm_loop_margins[m], xmax),
                    py((double)(k ? oom[m] : acc[m]), (double)ymax), colors[k ? 2 : 0]);
    }
    for (size_t m = 0; m < MM_LOOP_N_MARGINS; m++)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>", px(mm_loop_margins[m], xmax),
                H - MB + 12, mm_loop_margins[m]);
    legend(f, 0, colors[0], "accepted", 0);
    legend(f, 1, colors[2], "accepted, would OOM", 0);
    fputs("</svg>\n", f);
}

int mm_html_report(FILE *f, struct mm_loop *l)
{
    size_t cap = 100000, n;
    double *pred = malloc(cap * sizeof(double)), *meas = malloc(cap * sizeof(double));
    if (!pred || !meas) {
        free(pred);
        free(meas);
        return -1;
    }
    n = mm_loop_points(l, pred, meas, cap);
    head(f, "mmguard report: decisions and outcomes");
    fprintf(f, "<p id=\"summary\">%zu decision line(s); %zu job(s) with a predicted and a measured "
               "device peak.</p>\n", mm_loop_n_decisions(l), n);
    fputs("<h2>Decisions over time</h2><figure>", f);
    decisions_chart(f, l);
    fputs("</figure>\n<h2>Predicted vs measured</h2><figure>", f);
    scatter_chart(f, pred, meas, n);
    fputs("<figcaption>Each dot a job: mmguard's predicted device peak against the peak it "
          "recorded (NVML, else reserved).</figcaption></figure>\n<h2>Prediction error</h2><figure>", f);
    histogram_chart(f, pred, meas, n);
    fputs("</figure>\n<h2>Margin advice</h2><figure>", f);
    advice_chart(f, l);
    fputs("<figcaption>For each margin: the recorded jobs it would have accepted, and how many of "
          "those ran out of memory.</figcaption></figure>\n</body></html>\n", f);
    free(pred);
    free(meas);
    return ferror(f) ? -1 : 0;
}

/* ---- the commands' side ------------------------------------------------------------- */

static FILE *open_out(const char *cmd, const char *path)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fprintf(stderr, "mmguard %s: --html %s: cannot write it\n", cmd, path);
    return f;
}

static int close_out(const char *cmd, const char *path, FILE *f, int rc)
{
    if (fclose(f) != 0 || rc != 0) {
        fprintf(stderr, "mmguard %s: --html %s: write error\n", cmd, path);
        return 1;
    }
    return 0;
}

int mm_cli_predict_html(const mm_spec *s, const mm_prediction *p, const char *path,
                        const char *gpu_mem)
{
    mm_timeline *tl = malloc(sizeof *tl);
    mm_error err;
    uint64_t card = 0;
    FILE *f;
    int rc;
    if (!tl)
        return 2;
    if (gpu_mem && mm_parse_size(gpu_mem, &card, &err)) {
        fprintf(stderr, "mmguard predict: --gpu-mem: %s\n", err.msg);
        free(tl);
        return 2;
    }
    if (mm_timeline_build(s, tl, &err)) {
        fprintf(stderr, "mmguard predict: --html: %s\n", err.msg);
        free(tl);
        return 2;
    }
    if (!(f = open_out("predict", path))) {
        free(tl);
        return 2;
    }
    rc = close_out("predict", path, f, mm_html_predict(f, s, p, tl, card));
    free(tl);
    return rc ? 2 : 0;
}

int mm_cli_report_html(struct mm_loop *l, const char *path)
{
    FILE *f = open_out("report", path);
    if (!f)
        return 1;
    return close_out("report", path, f, mm_html_report(f, l));
}
