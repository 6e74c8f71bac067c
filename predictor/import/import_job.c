/* import_job.c - after every input was read: what follows from several of
 * them together (the weight dtype LLaMA-Factory and HF Trainer leave, the
 * versions and attention LLaVA's scripts pin) and what none of them said,
 * each stated as an assumption in the spec's header. */
#include "import_rd.h"

#include <stdio.h>
#include <string.h>

/* LLaMA-Factory casts trainable parameters to fp32 unless pure_bf16, ZeRO-3
 * or quantized (model/adapter.py init_adapter) and trains under autocast;
 * DeepSpeed and FSDP keep their own master weights */
static void weight_dtype(imp_job *j)
{
    imp_section *t = &j->s->training;
    const char *prec = imp_get(t, "precision");
    if (!prec || !strcmp(prec, "fp32") || j->zero_stage >= 1 || j->fsdp ||
        imp_get(t, "master_weights"))
        return;
    if (j->lf && !j->pure_bf16 && !strcmp(j->finetuning, "full")) {
        imp_set(t, "master_weights", "LLaMA-Factory upcasts trainable parameters to fp32 "
                "(model/adapter.py) and trains under autocast", "fp32");
        imp_note(j->s, "assumed fp32 weights for the frozen modules too: LLaMA-Factory keeps them "
                       "in %s, which the spec (one weight dtype) cannot say", prec);
    } else if (j->lf && !j->pure_bf16) {
        imp_note(j->s, "assumed 16-bit LoRA adapters: LLaMA-Factory upcasts them to fp32 (their "
                       "weights, gradients and Adam states are 2 x as large as the spec counts)");
    } else if (j->trainer && !j->lf && !j->swift) {
        imp_note(j->s, "assumed the model is loaded in %s (torch_dtype, as LLaVA and TRL "
                       "scripts do); a model loaded in fp32 trains under autocast with fp32 "
                       "weights: set training.master_weights fp32", prec);
    }
}

/* LLaVA-1.5's scripts: deepspeed llava/train/train_mem.py (flash_attention_2),
 * pinned transformers 4.37.2, torch 2.1.2, deepspeed 0.12.6 (pyproject.toml) */
static void llava(imp_job *j)
{
    if (!j->llava)
        return;
    if (!imp_get(&j->s->training, "attention"))
        imp_set(&j->s->training, "attention", "assumed: LLaVA's scripts run train_mem.py, which "
                "loads the model with flash_attention_2", "flash");
    imp_section *f = &j->s->framework;
    if (!f->n) {
        imp_set(f, "transformers_version", "assumed: the versions LLaVA-1.5 pins", "\"4.37.2\"");
        /* LLaVA-1.5 pins torch 2.1.2 and DeepSpeed 0.12.6: versions the model does not
         * follow (it follows torch 2.11-2.13, DeepSpeed 0.19.x), which the spec refuses;
         * they are left out, the prediction is the modelled versions' */
    }
}

void imp_job_finish(imp_job *j)
{
    imp_ddp_finish(j);
    weight_dtype(j);
    llava(j);
    imp_training_defaults(j->s, !j->lf && !j->swift); /* both bound images by max_pixels */
}
