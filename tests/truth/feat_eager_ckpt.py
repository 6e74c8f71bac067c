"""Truth rows for eager attention under gradient checkpointing with a frozen LLM (issue 21 item
6b / issue 22): LLaVA stage 1 (vision tower and LLM frozen, projector trained;
gradient_checkpointing_enable() with its enable_input_require_grads()), as the H100 rows
llava7b-pretrain-eager-*-ck1 run it.  Long enough sequences that the (B, H, S, S) attention
probabilities, not the logits, set the peak: in the re-run layer's softmax backward the
fp32 gradient, the kept probabilities, grad_input and the CUDA kernel's grad * output
(emul.py softmax_backward_cuda) are alive together.  Small on purpose: 2 shared CPU cores.

    setups()    the rows, called by ONE line of truth.py config_list
"""

# (checkpointing, B, S)
ROWS = [
    ({"use_reentrant": False, "every_n_layers": 1}, 2, 1024),
    ({"use_reentrant": True, "every_n_layers": 1}, 2, 1024),
    ({"use_reentrant": False, "every_n_layers": 1}, 1, 1536),
    (False, 2, 1024),
]


def setups():
    import truth
    out = []
    for gc_, B, S in ROWS:
        out.append(truth.make_setup("llava", "pretrain", "bf16", "eager", gc_, B, S, 1, (112, 112), "adamw_torch",
                                    "single", 1, model={"hidden": 256, "layers": 2}, seed=23))
    return out
