/* fuzz_record.c - libFuzzer: the MMGUARD variable reader (spank_plugin/
 * record.c), which slurmstepd runs as root on text from the user.  Any input:
 * no crash, hang or leak; an accepted record is written back and read again
 * to the same values (the cards= verdicts too); its peak model evaluates for
 * any N, its cards are found by type and count. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mmg_record r, back;
    char text[MMG_RECORD_MAX + 1], err[256];
    char *in;
    if (size > MMG_RECORD_MAX + 64)
        return 0;
    in = malloc(size + 1);
    if (!in)
        FUZZ_FAIL("out of memory");
    memcpy(in, data, size);
    in[size] = '\0';
    if (mmg_record_parse(in, &r, err, sizeof err) != 0) {
        if (!memchr(err, '\0', sizeof err))
            FUZZ_FAIL("unterminated error");
        free(in);
        return 0;
    }
    if (mmg_record_format(&r, text, sizeof text) == 0) {
        if (mmg_record_parse(text, &back, err, sizeof err) != 0)
            FUZZ_FAIL("a written record does not read back");
        if (strcmp(back.spec, r.spec) || strcmp(back.error, r.error) || back.peak != r.peak ||
            back.has_model != r.has_model || back.n_terms != r.n_terms ||
            back.n_points != r.n_points ||
            (r.n_points && memcmp(back.points, r.points, r.n_points * sizeof r.points[0])) ||
            back.n_cards != r.n_cards)
            FUZZ_FAIL("a record changed on its way back");
        for (size_t i = 0; i < r.n_cards; i++)
            if (strcmp(back.cards[i].gpu, r.cards[i].gpu) || back.cards[i].n != r.cards[i].n ||
                back.cards[i].kind != r.cards[i].kind || back.cards[i].peak != r.cards[i].peak ||
                back.cards[i].usable != r.cards[i].usable ||
                back.cards[i].retries != r.cards[i].retries)
                FUZZ_FAIL("a card changed on its way back");
    }
    for (size_t i = 0; i < r.n_cards; i++)
        if (mmg_record_card(&r, r.cards[i].gpu, r.cards[i].n) != &r.cards[i] ||
            r.cards[i].peak > r.cards[i].usable || r.cards[i].kind > MM_VERDICT_OOM)
            FUZZ_FAIL("a card not found, or out of its bounds");
    if (r.has_model) {
        (void)mmg_record_peak_for_dp(&r, 1);
        (void)mmg_record_peak_for_dp(&r, 2);
        (void)mmg_record_peak_for_dp(&r, 65536);
        (void)mmg_record_peak_for_dp(&r, UINT32_MAX);
    }
    free(in);
    return 0;
}
