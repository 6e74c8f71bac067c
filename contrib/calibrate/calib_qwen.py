"""Qwen2-VL and Qwen2.5-VL for the calibration harness: config and batch (torch side).

Why this module exists: the Qwen-VL families differ from LLaVA in exactly the places
that matter for memory (a ViT that runs on all h*w patches of a dynamic-resolution image,
a 2x2 patch merger, multimodal RoPE, a 152k vocabulary, q/k/v bias), so they are measured
with the library's own classes, built from the dimensions of the published config.json
(calib_common.QWEN2VL_VIT / QWEN25VL_VIT / LLMS) with random weights.
"""

import calib_common as cc

# token ids of Qwen2-VL-7B-Instruct's config.json (shared by 2B and Qwen2.5-VL)
VISION_START = 151652
VISION_END = 151653
IMAGE_TOKEN = 151655
VIDEO_TOKEN = 151656
CHANNELS = 3


def build_config(group, seq_len_max):
    """Qwen2VLConfig / Qwen2_5_VLConfig for the group (transformers 4.5x and 5.x)."""
    g = group.llm_geometry()
    text = dict(
        hidden_size=g["hidden_size"], intermediate_size=g["intermediate_size"],
        num_hidden_layers=g["num_hidden_layers"], num_attention_heads=g["num_attention_heads"],
        num_key_value_heads=g["num_key_value_heads"], vocab_size=g["vocab_size"],
        max_position_embeddings=max(32768, seq_len_max), rms_norm_eps=1e-6,
        rope_theta=1000000.0, hidden_act="silu", use_cache=False,
        tie_word_embeddings=bool(g.get("tie_word_embeddings", False)),
        rope_scaling={"type": "mrope", "mrope_section": mrope_section(g)},
    )
    ids = dict(image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN,
               vision_start_token_id=VISION_START, vision_end_token_id=VISION_END)
    if group.model == "qwen2vl":
        from transformers import Qwen2VLConfig as C
        v = dict(cc.QWEN2VL_VIT, hidden_size=g["hidden_size"], in_chans=CHANNELS)
    else:
        from transformers import Qwen2_5_VLConfig as C
        v = dict(cc.QWEN25VL_VIT, out_hidden_size=g["hidden_size"], in_chans=CHANNELS)
    cfg = C(text_config=text, vision_config=v,
            tie_word_embeddings=text["tie_word_embeddings"], **ids)
    return cfg


def mrope_section(g):
    """[16, 24, 24] for head_dim 128 (the published configs): a quarter of the rotary
    half for time, the rest split between height and width."""
    half = g.get("head_dim", g["hidden_size"] // g["num_attention_heads"]) // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


def model_class(group):
    if group.model == "qwen2vl":
        from transformers import Qwen2VLForConditionalGeneration as cls
    else:
        from transformers import Qwen2_5_VLForConditionalGeneration as cls
    return cls


def make_batch(group, cfg, device):
    """One image per sample as Qwen2VLProcessor gives it: pixel_values flattened to
    (patches, 3*2*14*14), image_grid_thw, and in input_ids <|vision_start|>, h*w/4
    <|image_pad|> tokens, <|vision_end|>, the rest random text; image positions -100."""
    import torch
    g = group.llm_geometry()
    b, s = cfg.micro_batch, cfg.seq_len
    gh, gw = group.image_grid
    vit = cc.QWEN2VL_VIT if group.model == "qwen2vl" else cc.QWEN25VL_VIT
    p, t = vit["patch_size"], vit["temporal_patch_size"]
    n_img = cc.qwen_image_tokens(group.image_grid)
    ids = torch.randint(0, min(g["vocab_size"], VISION_START) - 1, (b, s), device=device)
    ids[:, 1] = VISION_START
    ids[:, 2:2 + n_img] = IMAGE_TOKEN
    ids[:, 2 + n_img] = VISION_END
    labels = ids.clone()
    labels[:, 1:3 + n_img] = -100
    pix = torch.randn(b * gh * gw, CHANNELS * t * p * p, device=device, dtype=torch.bfloat16)
    thw = torch.tensor([[1, gh, gw]] * b, device=device, dtype=torch.long)
    batch = {"input_ids": ids, "labels": labels, "pixel_values": pix, "image_grid_thw": thw,
             "attention_mask": torch.ones(b, s, dtype=torch.long, device=device)}
    if takes_mm_token_type_ids(group):
        # transformers >= 5.x computes M-RoPE from the processor's modality ids
        batch["mm_token_type_ids"] = (ids == IMAGE_TOKEN).to(torch.int32)
    return batch


def takes_mm_token_type_ids(group):
    import inspect
    return "mm_token_type_ids" in inspect.signature(model_class(group).forward).parameters
