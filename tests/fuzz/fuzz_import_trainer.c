/* fuzz_import_trainer.c - libFuzzer: TrainingArguments / SFTConfig / LLaVA
 * keys as YAML (and, for inputs starting with '{', JSON) through
 * `mmguard import`, then the emitted spec. */
#include "fuzz_import.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int reader(imp_job *j, const char *buf, size_t len, const char *name, mm_error *err)
{
    return imp_trainer_buffer(j, buf, len, name, len && buf[0] == '{', err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_import(data, size, "trainer.yaml", reader);
    return 0;
}
