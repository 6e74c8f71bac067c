/* fuzz_import_ds.c - libFuzzer: a DeepSpeed ds_config.json through
 * `mmguard import` (after trainer values), then the emitted spec. */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int reader(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    j->trainer = len % 2; /* both ways: "auto" from trainer values and from defaults */
    j->micro_batch = 4;
    j->bf16 = 1;
    snprintf(j->trainer_file, sizeof j->trainer_file, "trainer.json");
    return imp_deepspeed_buffer(j, buf, len, name, err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import(data, size, "ds_config.json", reader);
    return 0;
}
