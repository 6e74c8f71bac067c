"""Truth rows for tensor parallelism (issue 23): torch.distributed.tensor.parallel on gloo.

The plan is torchtitan's for its dense decoder blocks (torchtitan a33d0e3,
torchtitan/models/llama3/infra/parallelize.py apply_tp, lines 217-241) on the Hugging Face
module names: q/k/v and gate/up ColwiseParallel (weights Shard(0), outputs sharded on the
heads / intermediate dim, handed on as local tensors), o_proj and down_proj RowwiseParallel
(weights Shard(1), input Shard(-1), output Partial -> Replicate: an all-reduce).  Without
sequence parallelism the block boundaries carry the full hidden on every rank; norms,
embeddings and lm_head stay replicated (HF's base_model_tp_plan for Llama/Qwen2 without its
lm_head entry).  The same rows again with torchtitan's whole plan (sequence_parallel): it adds
SequenceParallel on the norms, the attention / MLP inputs all-gathered, o/down reduce-scattered,
the embedding and output sharded on the vocabulary and loss_parallel (apply_tp lines 173-188,
217-241), modelled by predictor/train/parallel_tp.c (tp_seq, embedding_grad) and
model/ops_loss.c (loss_parallel).

DTensor runs on the CPU with gloo; its collectives are the functional ones
(torch/distributed/_functional_collectives.py), whose outputs are new tensors on either
device, so the counted allocations are the CUDA job's.

    setups()          the rows, called by ONE line of truth.py config_list
    apply(model, setup, world)  parallelizes the model (truth.py run_rank, parallel "tp")
"""
import hashlib
import json

GC = {"use_reentrant": False, "every_n_layers": 1}
# (family, mode, precision, checkpointing, B, S, tp, model)
ROWS = [
    ("llama", "full", "bf16", False, 2, 256, 2, {"hidden": 256, "layers": 2, "vocab": 16384}),
    ("llama", "full", "bf16", GC, 2, 256, 2, {"hidden": 256, "layers": 2, "vocab": 16384}),
    ("llama", "full", "fp32", False, 1, 256, 2, {"hidden": 256, "layers": 2, "vocab": 16384}),
    ("llama", "full", "fp32", GC, 2, 128, 2, {"hidden": 256, "layers": 3, "vocab": 16384}),
    ("qwen2", "full", "bf16", False, 2, 256, 2, {"hidden": 256, "layers": 2}),
    ("qwen2", "full", "fp32", GC, 1, 256, 2, {"hidden": 256, "layers": 2}),
    ("llama", "full", "bf16", False, 2, 256, 4, {"hidden": 512, "layers": 2, "vocab": 16384}),
    ("llama", "full", "fp32", GC, 1, 256, 4, {"hidden": 512, "layers": 2, "vocab": 16384}),
]
# (family, mode, precision, attention, checkpointing, B, S, tp, model): eager attention, reentrant
# checkpointing.  No autocast rows: accelerate's prepare_model wraps a multi-process model in DDP,
# which refuses DTensor parameters (the spec refuses autocast with tensor_parallel)
MORE_ROWS = [
    # a small vocabulary: the peak sits inside the blocks, where the all-reduces' clones are
    ("llama", "full", "bf16", "sdpa", False, 2, 256, 2, {"hidden": 512, "layers": 2, "vocab": 512}),
    ("llama", "full", "fp32", "sdpa", GC, 2, 256, 2, {"hidden": 512, "layers": 2, "vocab": 512}),
    # where the model's phase peaks move with the all-reduces' clones (backward; forward under
    # checkpointing): a check of tp_linear against the library
    ("llama", "full", "fp32", "sdpa", False, 2, 256, 2, {"hidden": 1024, "layers": 2, "vocab": 128}),
    ("llama", "full", "fp32", "sdpa", GC, 2, 256, 4, {"hidden": 512, "layers": 2, "vocab": 128}),
    ("llama", "full", "bf16", "eager", False, 1, 256, 2, {"hidden": 256, "layers": 2, "vocab": 16384}),
    ("qwen2", "full", "bf16", "sdpa", {"use_reentrant": True, "every_n_layers": 1}, 2, 256, 2,
     {"hidden": 256, "layers": 3}),
]

# (family, precision, checkpointing, B, S, tp, model, grad_accum, sequence_parallel)
GA_ROWS = [
    ("llama", "bf16", False, 2, 256, 2, {"hidden": 256, "layers": 2, "vocab": 16384}, 2, False),
    ("llama", "fp32", GC, 1, 256, 2, {"hidden": 512, "layers": 2, "vocab": 512}, 4, False),
    ("qwen2", "bf16", GC, 2, 256, 2, {"hidden": 256, "layers": 2}, 2, True),
    # sequence parallel with accumulation where the optimizer step peaks (fp32) and at tp 4: the
    # earlier micro-batch's whole-vocabulary embedding gradient (parallel_tp.c embedding_grad)
    ("llama", "fp32", False, 1, 256, 2, {"hidden": 256, "layers": 2, "vocab": 16384}, 2, True),
    ("llama", "bf16", GC, 2, 256, 4, {"hidden": 512, "layers": 2, "vocab": 16384}, 2, True),
]

COLWISE = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")
ROWWISE = ("self_attn.o_proj", "mlp.down_proj")


def sequence_parallel(setup):
    return bool((setup.get("parallel_options") or {}).get("sequence_parallel"))


def apply_sp(model, mesh):
    """torchtitan's whole plan (apply_tp lines 173-188 and 217-241, loss parallel on): the
    embedding vocabulary-sharded with a sequence-sharded output, SequenceParallel norms, the
    attention and MLP inputs all-gathered (PrepareModuleInput), o/down reduce-scattered to
    Shard(1), lm_head vocabulary-sharded with its logits left sharded for loss_parallel"""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    })
    for layer in model.model.layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(), "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return model


def adjust_batch(batch, setup):
    """sequence parallel: the decoder sees S/tp positions per rank, so the full position_ids are
    passed (HF would derive arange(S/tp)) and no 2-D attention_mask (all ones: sdpa's causal
    path, as torchtitan's model has no padding mask)"""
    import torch
    if not sequence_parallel(setup):
        return batch
    b = dict(batch)
    del b["attention_mask"]
    B, S = b["input_ids"].shape
    b["position_ids"] = torch.arange(S).unsqueeze(0).expand(B, S)
    return b


def step_context(setup):
    """loss_parallel around forward and backward (torchtitan train.py's train_context)"""
    import contextlib
    if not sequence_parallel(setup):
        return contextlib.nullcontext()
    from torch.distributed.tensor.parallel import loss_parallel
    return loss_parallel()


def apply(model, setup, world):
    """torchtitan's block plan (apply_tp lines 229-240, no SequenceParallel) on every decoder layer"""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, distribute_module
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("cpu", (world,))
    if sequence_parallel(setup):
        return apply_sp(model, mesh)
    plan = {n: ColwiseParallel() for n in COLWISE}
    plan.update({n: RowwiseParallel() for n in ROWWISE})
    for layer in model.model.layers:
        parallelize_module(layer, mesh, plan)
    # every other parameter a Replicate DTensor: the optimizer's foreach kernels refuse a list that
    # mixes DTensor and torch.Tensor (torchtitan's plan leaves none plain: its norms are
    # SequenceParallel, its embedding and output sharded)
    for m in list(model.modules()):
        if any(not isinstance(p, DTensor) for p in m.parameters(recurse=False)):
            distribute_module(m, mesh, input_fn=_replicate_inputs, output_fn=_local_output)
    return model


def _replicate_inputs(mod, inputs, mesh):
    from torch.distributed.tensor import DTensor, Replicate
    import torch
    return tuple(DTensor.from_local(x, mesh, [Replicate()], run_check=False)
                 if isinstance(x, torch.Tensor) and not isinstance(x, DTensor) else x for x in inputs)


def _local_output(mod, out, mesh):
    from torch.distributed.tensor import DTensor
    return out.to_local() if isinstance(out, DTensor) else out


def setups():
    import truth
    out = []
    rows = [(f, m, p, "sdpa", g, b, s_, t, mo) for f, m, p, g, b, s_, t, mo in ROWS] + MORE_ROWS
    for sp in (False, True):        # without, then with torchtitan's SequenceParallel + loss parallel
        for fam, mode, prec, attn, gc_, B, S, tp, model in rows:
            if sp and attn != "sdpa":
                continue            # adjust_batch drops the 2-D mask: sdpa's causal path only
            s = truth.make_setup(fam, mode, prec, attn, gc_, B, S, 0, None, "adamw_torch", "tp", tp,
                                 popt={"tensor_parallel": tp, "sequence_parallel": sp}, model=model, seed=23)
            key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
            s["id"] = "%s-tp-%d-%s-%s-%s-%s%s" % (fam, tp, mode, prec, attn, "sp-" if sp else "",
                                                 hashlib.sha1(key.encode()).hexdigest()[:10])
            out.append(s)
    # gradient accumulation (the HF Trainer's loop, truth.py micro_batches): .grad alive between
    # micro-batches; no reduction to hold back under TP (each rank owns its shards' gradients)
    for fam, prec, gc_, B, S, tp, model, ga, sp in GA_ROWS:
        s = truth.make_setup(fam, "full", prec, "sdpa", gc_, B, S, 0, None, "adamw_torch", "tp", tp,
                             popt={"tensor_parallel": tp, "sequence_parallel": sp}, model=model, seed=23,
                             accum=(ga, False))
        key = json.dumps({k2: s[k2] for k2 in sorted(s) if k2 not in ("hf_class", "id")}, sort_keys=True)
        s["id"] = "%s-tp-%d-full-%s-sdpa-%sga%d-%s" % (fam, tp, prec, "sp-" if sp else "", ga,
                                                      hashlib.sha1(key.encode()).hexdigest()[:10])
        out.append(s)
    return out
