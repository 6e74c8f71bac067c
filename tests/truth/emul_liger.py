"""Liger-Kernel emulations: the counted CPU bytes of Liger's Triton kernels.

Liger's kernels are Triton and do not run on the CPU.  Each class below is an
autograd.Function that allocates, counted, exactly what Liger's Python wrapper
allocates around its Triton launch (outputs, saved tensors, backward buffers,
and the in-place writes that allocate nothing), and computes the numbers the
kernel would compute in registers with PyTorch inside memhook.uncounted().
Source followed: linkedin/Liger-Kernel at ead96b61 (2026-08-21),
src/liger_kernel/ops/{rms_norm,swiglu,rope,utils}.py and
src/liger_kernel/transformers/{rms_norm,swiglu,rope,monkey_patch}.py; the
line numbers cited are of that commit.  docs/oracle.md has the summary.

    patch_model(model, rms_norm=True, swiglu=True, rope=True)
        what apply_liger_kernel_to_llama / _qwen2(model=...) does to an
        instance (monkey_patch.py: _patch_rms_norm_module, _patch_swiglu_module,
        modeling_<family>.apply_rotary_pos_emb = liger_rotary_pos_emb); for Qwen2-VL /
        Qwen2.5-VL what apply_liger_kernel_to_qwen2_vl / _qwen2_5_vl(model=...) does
        (patch_qwen_vl: monkey_patch.py:1860-1952, :1955-2041), layer_norm too
"""
import sys

import torch
import torch.nn.functional as F

import memhook

# rms_norm.py:519-521 takes the SM count of the device for the rows of its fp32
# dW partial sums; the harness has no CUDA device: an H100 SXM has 132 SMs.
SM_COUNT = 132


def _contig(t):
    # ops/utils.py:44-54 ensure_contiguous: every tensor argument .contiguous()
    return t.contiguous() if isinstance(t, torch.Tensor) else t


# ------------------------------------------------------------------ RMSNorm
class LigerRMSNormEmul(torch.autograd.Function):
    """ops/rms_norm.py:612-683 (casting_mode 'llama', in_place=True: transformers/rms_norm.py:13-15).
    forward (rms_norm_forward :436-510): Y empty (n_rows, H) in X's dtype; RSTD empty (n_rows,)
    fp32 (llama/gemma casting, :452-453); saves X, W, RSTD (:657).
    backward (rms_norm_backward :513-609): _dW empty (sm_count, H) fp32 (:529); dX = dY, the
    kernel writes dX over dY in place (:540-541); dW = _dW.sum(0).to(W.dtype) (:605), computed
    whether or not W needs a gradient."""

    @staticmethod
    def forward(ctx, X, W, eps, offset=0.0, gemma=False, in_place=True):
        X, W = _contig(X), _contig(W)
        shape = X.shape
        X = X.view(-1, shape[-1])
        Y = torch.empty(X.shape, dtype=X.dtype)
        RSTD = torch.empty(X.shape[0], dtype=torch.float32)   # fp32 for llama and gemma (:452)
        with memhook.uncounted():
            xf = X.float()
            r = torch.rsqrt(xf.pow(2).mean(-1) + eps)
            RSTD.copy_(r)
            if gemma:     # gemma casting: all in fp32, (offset + W), cast back at the end
                Y.copy_((xf * r[:, None] * (offset + W.float())).to(X.dtype))
            else:         # llama casting: (X*rstd).to(X dtype) * (offset + W)
                Y.copy_((xf * r[:, None]).to(X.dtype) * (offset + W))
            del xf, r
        ctx.eps, ctx.offset, ctx.in_place = eps, offset, in_place
        ctx.save_for_backward(X, W, RSTD)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY):
        X, W, RSTD = ctx.saved_tensors
        dY = _contig(dY)
        shape = dY.shape
        dY = dY.view(-1, shape[-1])
        _dW = torch.empty((SM_COUNT, shape[-1]), dtype=torch.float32)
        # in_place: dX stored over dY (:540-541); else torch.zeros_like(dY) (:543)
        dX = dY if ctx.in_place else torch.zeros_like(dY)
        with memhook.uncounted(), torch.enable_grad():
            x = X.detach().float().requires_grad_()
            w = W.detach().float().requires_grad_()
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + ctx.eps) * (ctx.offset + w)
            gx, gw = torch.autograd.grad(y, (x, w), dY.float())
            dX.copy_(gx)
            _dW.zero_()
            _dW[0].copy_(gw)                      # the per-SM partial sums, summed below
            del x, w, y, gx, gw
        dW = _dW.sum(dim=0).to(W.dtype)
        del _dW
        return dX.view(*shape), dW, None, None, None, None


def liger_rms_norm_forward(self, hidden_states):
    # transformers/rms_norm.py:37-46 LigerRMSNorm.forward (offset 0 for Llama/Qwen2)
    return LigerRMSNormEmul.apply(hidden_states, self.weight, self.variance_epsilon)


def liger_rms_norm_gemma_forward(self, hidden_states):
    # _patch_rms_norm_module(offset=1.0, casting_mode="gemma", in_place=False), Gemma 3's
    # (monkey_patch.py apply_liger_kernel_to_gemma3_text :1099-1101); Gemma3RMSNorm keeps eps
    return LigerRMSNormEmul.apply(hidden_states, self.weight, self.eps, 1.0, True, False)


# ------------------------------------------------------------------ SwiGLU
class LigerSiLUMulEmul(torch.autograd.Function):
    """ops/swiglu.py:230-296 LigerSiLUMulFunction.  forward (swiglu_forward :149-188): c =
    empty_like(a), saves a and b (:262) -- no silu(a) product is kept.  backward
    (swiglu_backward :191-227): the kernel recomputes silu(a) and writes da over a and db
    over b in place; it allocates nothing but dc's contiguous copy if dc is strided."""

    @staticmethod
    def forward(ctx, a, b):
        a, b = _contig(a), _contig(b)
        c = torch.empty_like(a)
        with memhook.uncounted():
            # _swiglu_forward_kernel: silu(a in fp32).cast(b dtype) * b
            c.copy_(F.silu(a.float()).to(b.dtype) * b)
        ctx.save_for_backward(a, b)
        return c

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        dc = _contig(dc)
        with memhook.uncounted():
            af = a.float()
            sig = torch.sigmoid(af)
            silu = af * sig
            db = dc.float() * silu
            da = dc.float() * (silu * (1 - sig) + sig) * b.float()
            a.copy_(da)
            b.copy_(db)
            del af, sig, silu, da, db
        return a, b


def liger_swiglu_forward(self, x):
    # transformers/swiglu.py:20-21 LigerSwiGLUMLP.forward
    return self.down_proj(LigerSiLUMulEmul.apply(self.gate_proj(x), self.up_proj(x)))


# ------------------------------------------------------------------ GeGLU
class LigerGELUMulEmul(torch.autograd.Function):
    """ops/geglu.py:132-146 LigerGELUMulFunction (gelu tanh).  forward (geglu_forward :87-108):
    c = empty_like(a), saves a and b (:138).  backward (geglu_backward :111-130): the kernel
    writes da over a and db over b in place and returns them: the same bytes as SwiGLU."""

    @staticmethod
    def forward(ctx, a, b):
        a, b = _contig(a), _contig(b)
        c = torch.empty_like(a)
        with memhook.uncounted():
            c.copy_(F.gelu(a.float(), approximate="tanh").to(b.dtype) * b)
        ctx.save_for_backward(a, b)
        return c

    @staticmethod
    def backward(ctx, dc):
        a, b = ctx.saved_tensors
        dc = _contig(dc)
        with memhook.uncounted(), torch.enable_grad():
            af = a.detach().float().requires_grad_()
            g = F.gelu(af, approximate="tanh")
            (da,) = torch.autograd.grad(g, (af,), dc.float() * b.float())
            db = dc.float() * g.detach()
            a.copy_(da)
            b.copy_(db)
            del af, g, da, db
        return a, b


def liger_geglu_forward(self, x):
    # transformers/geglu.py:21-22 LigerGEGLUMLP.forward
    return self.down_proj(LigerGELUMulEmul.apply(self.gate_proj(x), self.up_proj(x)))


def patch_gemma3(model, rms_norm=True, geglu=True, rope=True, layer_norm=True):
    """apply_liger_kernel_to_gemma3(model=<Gemma3ForConditionalGeneration>) (monkey_patch.py
    :1151-1240): the SigLIP tower's post_layernorm always (:1217), every encoder layer's
    layer_norm1 / layer_norm2 with layer_norm (:1219-1223), the projector's mm_soft_emb_norm
    (:1227-1228) and, through apply_liger_kernel_to_gemma3_text(model=language_model) (:1064-
    1148, :1230-1237), every Gemma3RMSNorm of the text model (final, four per layer, q_norm /
    k_norm) in gemma casting, offset 1, not in place (:1099-1101); each MLP's forward (GeGLU);
    and modeling_gemma3.apply_rotary_pos_emb (:1103-1104), which 5.17's attention calls."""
    import importlib
    mod = importlib.import_module("transformers.models.gemma3.modeling_gemma3")
    n = {"rms_norm": 0, "geglu": 0, "rope": 0, "layer_norm": 0}
    if rope:
        mod.apply_rotary_pos_emb = liger_rotary_pos_emb
        n["rope"] += 1
    vt = model.model.vision_tower
    sv = getattr(vt, "vision_model", vt)
    lns = [sv.post_layernorm] + ([m for lyr in sv.encoder.layers for m in (lyr.layer_norm1, lyr.layer_norm2)]
                                 if layer_norm else [])
    for m in lns:
        m.forward = liger_layer_norm_forward.__get__(m)
        n["layer_norm"] += 1
    norms = []
    text = model.model.language_model
    if rms_norm:
        norms = [model.model.multi_modal_projector.mm_soft_emb_norm, text.norm]
        for lyr in text.layers:
            norms += [lyr.input_layernorm, lyr.post_attention_layernorm, lyr.pre_feedforward_layernorm,
                      lyr.post_feedforward_layernorm, lyr.self_attn.q_norm, lyr.self_attn.k_norm]
    for m in norms:
        m.forward = liger_rms_norm_gemma_forward.__get__(m)
        n["rms_norm"] += 1
    if geglu:
        for lyr in text.layers:
            lyr.mlp.forward = liger_geglu_forward.__get__(lyr.mlp)
            n["geglu"] += 1
    return n


# ------------------------------------------------------------------ RoPE
def _rot(t, cos, sin, backward):
    h = t.shape[-1] // 2
    t1, t2 = t[..., :h], t[..., h:]
    if backward:                                  # the transpose of the rotation
        return torch.cat((t1 * cos[..., :h] + t2 * sin[..., h:], t2 * cos[..., h:] - t1 * sin[..., :h]), -1)
    return torch.cat((t1 * cos[..., :h] - t2 * sin[..., :h], t2 * cos[..., h:] + t1 * sin[..., h:]), -1)


def _rope_inplace(q, k, cos, sin, backward):
    """ops/rope.py rope_forward / rope_backward: q, k transposed to (b, s, h, d) and made
    contiguous (a copy only if that layout is strided), then _triton_rope rotates them in place."""
    q = q.transpose(1, 2).contiguous()
    k = k.transpose(1, 2).contiguous()
    with memhook.uncounted():
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)  # (b|1, s, 1, d)
        for t in (q, k):
            t.copy_(_rot(t.float(), c.float(), s.float(), backward).to(t.dtype))
    return q.transpose(1, 2), k.transpose(1, 2)


class LigerRopeEmul(torch.autograd.Function):
    """ops/rope.py LigerRopeFunction: forward rotates q and k in place and saves only the
    (contiguous) cos and sin; backward rotates dq and dk in place."""

    @staticmethod
    def forward(ctx, q, k, cos, sin):
        cos, sin = cos.contiguous(), sin.contiguous()
        q, k = _rope_inplace(q, k, cos, sin, False)
        ctx.save_for_backward(cos, sin)
        return q, k

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        dq, dk = _rope_inplace(dq, dk, cos, sin, True)
        return dq, dk, None, None


def liger_rotary_pos_emb(q, k, cos, sin, position_ids=None, unsqueeze_dim=1):
    # transformers/rope.py:8-24
    return LigerRopeEmul.apply(q, k, cos, sin)


# ------------------------------------------------------------------ LayerNorm
class LigerLayerNormEmul(torch.autograd.Function):
    """ops/layer_norm.py:307-320 LigerLayerNormFunction (ensure_contiguous).  forward
    (layer_norm_forward :169-227): Y empty (n_rows, H) in X's dtype (:189); Mean and RSTD
    empty (n_rows,) in X's dtype, not fp32 (:190-191); saves X, W, B, Mean, RSTD (:312).
    backward (layer_norm_backward :230-304): _DW and _DB empty (sm_count, H) fp32 (:257-258),
    DX a new (n_rows, H) in X's dtype (:268, not in place), DW = _DW.sum(0).to(W.dtype) and
    DB = _DB.sum(0).to(B.dtype) (:301-302), made whether or not W / B need them."""

    @staticmethod
    def forward(ctx, X, W, B, eps):
        X, W, B = _contig(X), _contig(W), _contig(B)
        shape = X.shape
        X = X.view(-1, shape[-1])
        Y = torch.empty(X.shape, dtype=X.dtype)
        Mean = torch.empty(X.shape[0], dtype=X.dtype)
        RSTD = torch.empty(X.shape[0], dtype=X.dtype)
        with memhook.uncounted():
            xf = X.float()
            mu = xf.mean(-1)
            r = torch.rsqrt((xf - mu[:, None]).pow(2).mean(-1) + eps)
            Mean.copy_(mu)
            RSTD.copy_(r)
            Y.copy_(((xf - mu[:, None]) * r[:, None] * W.float() + B.float()).to(X.dtype))
            del xf, mu, r
        ctx.save_for_backward(X, W, B, Mean, RSTD)
        return Y.view(*shape)

    @staticmethod
    def backward(ctx, dY):
        X, W, B, Mean, RSTD = ctx.saved_tensors
        dY = _contig(dY)
        shape = dY.shape
        dY = dY.view(-1, shape[-1])
        _DW = torch.empty((SM_COUNT, shape[-1]), dtype=torch.float32)
        _DB = torch.empty((SM_COUNT, shape[-1]), dtype=torch.float32)
        DX = torch.empty(dY.shape, dtype=X.dtype)
        with memhook.uncounted(), torch.enable_grad():
            x = X.detach().float().requires_grad_()
            w = W.detach().float().requires_grad_()
            b = B.detach().float().requires_grad_()
            y = F.layer_norm(x, (x.shape[-1],), w, b, 1e-6)
            gx, gw, gb = torch.autograd.grad(y, (x, w, b), dY.float())
            DX.copy_(gx)
            _DW.zero_()
            _DB.zero_()
            _DW[0].copy_(gw)
            _DB[0].copy_(gb)
            del x, w, b, y, gx, gw, gb
        DW = _DW.sum(dim=0).to(W.dtype)
        DB = _DB.sum(dim=0).to(B.dtype)
        del _DW, _DB
        return DX.view(*shape), DW, DB, None


def liger_layer_norm_forward(self, hidden_states):
    # transformers/layer_norm.py:20-21 LigerLayerNorm.forward; _patch_layer_norm_module
    # (monkey_patch.py:103-) keeps the module's eps as variance_epsilon
    return LigerLayerNormEmul.apply(hidden_states, self.weight, self.bias, self.eps)


# ------------------------------------------------------------------ M-RoPE
class LigerQwen2VLMRopeEmul(torch.autograd.Function):
    """ops/qwen2vl_mrope.py:191-222 LigerQwen2VLMRopeFunction: forward (qwen2vl_mrope_forward
    :110-149) transposes q, k to (b, s, h, d), .contiguous() (no copy for the projection's
    layout), rotates them in place and returns the contiguous cos / sin (3, b, s, d), which
    it saves (:208); backward (:152-188) rotates dq, dk in place.  Nothing else is allocated."""

    @staticmethod
    def forward(ctx, q, k, cos, sin, mrope_section):
        cos, sin = cos.contiguous(), sin.contiguous()
        with memhook.uncounted():
            sec = list(mrope_section) * 2
            c = torch.cat([m[i % 3] for i, m in enumerate(cos.split(sec, dim=-1))], dim=-1)
            s = torch.cat([m[i % 3] for i, m in enumerate(sin.split(sec, dim=-1))], dim=-1)
        q, k = _rope_inplace(q, k, c, s, False)
        ctx.save_for_backward(cos, sin)
        ctx.sec = sec
        return q, k

    @staticmethod
    def backward(ctx, dq, dk):
        cos, sin = ctx.saved_tensors
        with memhook.uncounted():
            c = torch.cat([m[i % 3] for i, m in enumerate(cos.split(ctx.sec, dim=-1))], dim=-1)
            s = torch.cat([m[i % 3] for i, m in enumerate(sin.split(ctx.sec, dim=-1))], dim=-1)
        dq, dk = _rope_inplace(dq, dk, c, s, True)
        return dq, dk, None, None, None


def liger_multimodal_rotary_pos_emb(q, k, cos, sin, mrope_section, unsqueeze_dim=1):
    # transformers/qwen2vl_mrope.py:4-20
    return LigerQwen2VLMRopeEmul.apply(q, k, cos, sin, mrope_section)


def patch_qwen_vl(model, rms_norm=True, swiglu=True, rope=True, layer_norm=True):
    """apply_liger_kernel_to_qwen2_vl (monkey_patch.py:1860-1952) / _qwen2_5_vl (:1955-2041)
    with model=<the base model> (transformers integrations/liger.py unwraps PEFT).
    rope: modeling_qwen2_*vl.apply_multimodal_rotary_pos_emb is replaced (:1900, :1991); the
    transformers this harness runs (5.17) no longer calls that name (the rotary embedding
    recomposes the sections, modeling_qwen2_vl.py:167-176; attention calls
    apply_rotary_pos_emb, :572): the assignment changes nothing, as on a GPU.
    Instance patches: the vision blocks' norm1 / norm2 (Qwen2-VL: LayerNorm when layer_norm,
    :1937-1939; Qwen2.5-VL: RMSNorm when rms_norm, :2027-2030), the text model's final norm,
    every decoder layer's two RMSNorms and its MLP (:1942-1952, :2032-2041).  The merger's
    ln_q and the vision MLP are not patched on an instance."""
    import importlib
    q25 = "Qwen2_5_VL" in type(model).__name__
    mod = importlib.import_module("transformers.models.%s.modeling_%s" % (("qwen2_5_vl",) * 2 if q25
                                                                          else ("qwen2_vl",) * 2))
    n = {"rms_norm": 0, "swiglu": 0, "rope": 0, "layer_norm": 0}
    if rope:
        mod.apply_multimodal_rotary_pos_emb = liger_multimodal_rotary_pos_emb
    for blk in model.model.visual.blocks:
        for nm in (blk.norm1, blk.norm2):
            if q25 and rms_norm:
                nm.forward = liger_rms_norm_forward.__get__(nm)
                n["rms_norm"] += 1
            elif not q25 and layer_norm:
                nm.forward = liger_layer_norm_forward.__get__(nm)
                n["layer_norm"] += 1
    text = model.model.language_model
    if rms_norm:
        text.norm.forward = liger_rms_norm_forward.__get__(text.norm)
        n["rms_norm"] += 1
    for layer in text.layers:
        if swiglu:
            layer.mlp.forward = liger_swiglu_forward.__get__(layer.mlp)
            n["swiglu"] += 1
        if rms_norm:
            for nm in (layer.input_layernorm, layer.post_attention_layernorm):
                nm.forward = liger_rms_norm_forward.__get__(nm)
                n["rms_norm"] += 1
    return n


# ------------------------------------------------------------------ patching
def _is_rms_norm(m):
    return type(m).__name__.endswith("RMSNorm") and hasattr(m, "variance_epsilon")


def _is_swiglu(m):
    act = getattr(getattr(m, "config", None), "hidden_act", None)
    return all(hasattr(m, n) for n in ("gate_proj", "up_proj", "down_proj")) and act in ("silu", "swish")


def patch_model(model, rms_norm=True, swiglu=True, rope=True, layer_norm=True, geglu=True):
    """The instance patch of monkey_patch.py apply_liger_kernel_to_llama (:221-300) and _qwen2:
    every decoder RMSNorm's forward (_patch_rms_norm_module), every decoder MLP's forward
    (_patch_swiglu_module), and modeling_<family>.apply_rotary_pos_emb.  Returns the names of
    the module-level functions it replaced, so a caller can restore them."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base).__name__ in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"):
        return patch_qwen_vl(base, rms_norm, swiglu, rope, layer_norm)
    if type(base).__name__ == "Gemma3ForConditionalGeneration":
        return patch_gemma3(base, rms_norm, geglu, rope, layer_norm)
    n = {"rms_norm": 0, "swiglu": 0, "rope": 0}
    for m in model.modules():
        if rms_norm and _is_rms_norm(m):
            m.forward = liger_rms_norm_forward.__get__(m)
            n["rms_norm"] += 1
        elif swiglu and _is_swiglu(m):
            m.forward = liger_swiglu_forward.__get__(m)
            n["swiglu"] += 1
    if rope:
        for name, mod in list(sys.modules.items()):
            if name.startswith("transformers.models.") and name.endswith((".modeling_llama", ".modeling_qwen2")) \
                    and hasattr(mod, "apply_rotary_pos_emb"):
                mod.apply_rotary_pos_emb = liger_rotary_pos_emb
                n["rope"] += 1
    return n
