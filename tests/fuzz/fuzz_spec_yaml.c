/* fuzz_spec_yaml.c - libFuzzer: YAML spec loader, then predict + JSON. */
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    mm_error e;
    mm_spec *s = mm_spec_load_buffer((const char *)data, size, "fuzz.yaml", MM_FMT_YAML, &e);
    if (!s) {
        fuzz_check_error(&e);
        if (!strstr(e.msg, "fuzz.yaml"))
            FUZZ_FAIL("a load error does not name the file");
        return 0;
    }
    (void)mm_spec_name(s);
    (void)mm_spec_digest(s);
    fuzz_predict(s);
    mm_spec_free(s);
    return 0;
}
