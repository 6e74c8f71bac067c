/* fuzz_spec_json.c - libFuzzer: JSON spec loader, then predict + JSON. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer((const char *)data, size, "fuzz.json", MM_FMT_JSON, &e);
    if (!s) {
        fuzz_check_error(&e);
        if (!strstr(e.msg, "fuzz.json"))
            FUZZ_FAIL("a load error does not name the file");
        return 0;
    }
    (void)mm_spec_name(s);
    (void)mm_spec_digest(s);
    fuzz_predict(s);
    mm_spec_free(s);
    return 0;
}
