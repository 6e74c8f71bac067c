"""Small LLaVA-style model for the CPU memory oracle (tests/oracle).

CLIP ViT tower -> mlp2x_gelu projector -> LLaMA decoder, written to allocate
and save for backward what transformers 4.46 + torch 2.x on CUDA do.  Every
place where torch 1.13 on the CPU would behave differently is replaced by an
emulation; docs/oracle.md lists them (tags "EMU-n" below refer to that list).
Only torch + stdlib; no transformers.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

import memcount

IGNORE_INDEX = -100
IMAGE_TOKEN_INDEX = -200


def _rup(n, m):
    return (n + m - 1) // m * m


# --------------------------------------------------------------------------
# EMU-1: torch 2.x MeanBackward keeps only sizes (1.13 keeps its input).
class Mean2x(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.mean(-1, keepdim=True)

    @staticmethod
    def backward(ctx, g):
        # torch 2.x mean_backward: sum_backward(grad).../ n  (one full-size result)
        return g.expand(ctx.shape) / ctx.shape[-1]


# --------------------------------------------------------------------------
# EMU-2: CUDA native_dropout keeps a 1-byte bool mask; 1.13 CPU keeps a
# dtype-sized noise tensor.
class Dropout2x(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = torch.empty(x.shape, dtype=torch.bool).bernoulli_(1.0 - p)
        scale = 1.0 / (1.0 - p)
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        torch.mul(x, mask, out=out)
        with memcount.uncounted():
            out.mul_(scale)
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        out = torch.empty_like(g, memory_format=torch.contiguous_format)
        torch.mul(g, mask, out=out)
        with memcount.uncounted():
            out.mul_(ctx.scale)
        return out, None


class PeftDropout(nn.Module):
    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if self.training and self.p > 0:
            return Dropout2x.apply(x, self.p)
        return x


# --------------------------------------------------------------------------
# EMU-3: fused attention (FlashAttention-2 / torch SDPA flash or
# memory-efficient backends).  Only the tensors the CUDA kernels allocate in
# global memory are counted: output (B,S,H,D storage), fp32 logsumexp, and in
# backward dq/dk/dv plus the kernel's own buffers.  The chunked math runs
# "uncounted" (on the GPU it lives in SRAM/registers).
#   kind = "fa2"      HF flash_attention_2 (flash-attn 2.x): GQA native
#          "sdpa_fa"  torch SDPA flash backend (bf16/fp16), k/v already repeated
#          "sdpa_me"  torch SDPA memory-efficient backend (fp32), lse padded to 32
class FusedAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, kind):
        # q: (B,S,H,D) k,v: (B,S,Hk,D), any strides with unit last-dim stride
        B, S, H, D = q.shape
        Hk = k.shape[2]
        out = torch.empty((B, S, H, D), dtype=q.dtype)
        lse_len = _rup(S, 32) if kind == "sdpa_me" else S
        lse = torch.empty((B, H, lse_len), dtype=torch.float32)
        with memcount.uncounted():
            rep = H // Hk
            kf = k.float().permute(0, 2, 1, 3)  # B,Hk,S,D
            vf = v.float().permute(0, 2, 1, 3)
            if rep > 1:
                kf = kf.repeat_interleave(rep, dim=1)
                vf = vf.repeat_interleave(rep, dim=1)
            qf = q.float().permute(0, 2, 1, 3)
            c = FusedAttn._chunk(B, H, S)
            for i in range(0, S, c):
                j = min(S, i + c)
                s = torch.matmul(qf[:, :, i:j], kf.transpose(-1, -2)) * scale
                if causal:
                    idx = torch.arange(i, j).unsqueeze(1) < torch.arange(S).unsqueeze(0)
                    s.masked_fill_(idx, float("-inf"))
                m = torch.logsumexp(s, dim=-1)
                p = torch.exp(s - m.unsqueeze(-1))
                o = torch.matmul(p, vf)
                out[:, i:j].copy_(o.permute(0, 2, 1, 3))
                lse[:, :, i:j].copy_(m)
                del s, p, o, m
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.kind = causal, scale, kind
        return out

    @staticmethod
    def _chunk(B, H, S):
        return max(1, min(S, (1 << 24) // max(1, B * H * S)))

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        B, S, H, D = q.shape
        Hk = k.shape[2]
        rep = H // Hk
        kind, scale = ctx.kind, ctx.scale
        dq = torch.empty((B, S, H, D), dtype=q.dtype)
        dk = torch.empty((B, S, Hk, D), dtype=k.dtype)
        dv = torch.empty((B, S, Hk, D), dtype=v.dtype)
        extra = []
        if kind in ("fa2", "sdpa_fa"):
            # flash-attn 2 mha_bwd: softmax_d (B,H,S_r128) fp32 and
            # dq_accum (B,S_r128,H,D_r32) fp32; GQA: dk/dv expanded to H heads.
            extra.append(torch.empty((B, H, _rup(S, 128)), dtype=torch.float32))
            extra.append(torch.empty((B, _rup(S, 128), H, _rup(D, 32)), dtype=torch.float32))
            if rep > 1:
                extra.append(torch.empty((B, S, H, D), dtype=k.dtype))
                extra.append(torch.empty((B, S, H, D), dtype=v.dtype))
        else:
            # memory-efficient backward: delta (B,H,S) fp32
            extra.append(torch.empty((B, H, S), dtype=torch.float32))
        with memcount.uncounted():
            qf = q.float().permute(0, 2, 1, 3)
            kf = k.float().permute(0, 2, 1, 3)
            vf = v.float().permute(0, 2, 1, 3)
            if rep > 1:
                kf = kf.repeat_interleave(rep, dim=1)
                vf = vf.repeat_interleave(rep, dim=1)
            dof = dout.float().permute(0, 2, 1, 3)
            of = out.float().permute(0, 2, 1, 3)
            lsef = lse[:, :, :S]
            dkf = torch.zeros_like(kf)
            dvf = torch.zeros_like(vf)
            c = FusedAttn._chunk(B, H, S)
            for i in range(0, S, c):
                j = min(S, i + c)
                s = torch.matmul(qf[:, :, i:j], kf.transpose(-1, -2)) * scale
                if ctx.causal:
                    idx = torch.arange(i, j).unsqueeze(1) < torch.arange(S).unsqueeze(0)
                    s.masked_fill_(idx, float("-inf"))
                p = torch.exp(s - lsef[:, :, i:j].unsqueeze(-1))
                do = dof[:, :, i:j]
                dvf += torch.matmul(p.transpose(-1, -2), do)
                dp = torch.matmul(do, vf.transpose(-1, -2))
                delta = (do * of[:, :, i:j]).sum(-1, keepdim=True)
                ds = p * (dp - delta) * scale
                dq[:, i:j].copy_(torch.matmul(ds, kf).permute(0, 2, 1, 3))
                dkf += torch.matmul(ds.transpose(-1, -2), qf[:, :, i:j])
                del s, p, dp, ds, delta
            if rep > 1:
                dkf = dkf.view(B, Hk, rep, S, D).sum(2)
                dvf = dvf.view(B, Hk, rep, S, D).sum(2)
            dk.copy_(dkf.permute(0, 2, 1, 3))
            dv.copy_(dvf.permute(0, 2, 1, 3))
        del extra
        return dq, dk, dv, None, None, None


def fused_attention(q, k, v, causal, scale, kind):
    """q,k,v in (B,S,H,D) layout (views allowed). Returns (B,S,H,D)."""
    return FusedAttn.apply(q, k, v, causal, scale, kind)


# --------------------------------------------------------------------------
# EMU-4: reentrant activation checkpointing as torch 2.x
# torch.utils.checkpoint(use_reentrant=True) (transformers >= 4.35 default).
# The RNG states it stashes live in host memory on a GPU run, so they are
# allocated uncounted here.
class Checkpoint2x(torch.autograd.Function):
    @staticmethod
    def forward(ctx, run_function, *args):
        ctx.run_function = run_function
        with memcount.uncounted():
            ctx.fwd_cpu_state = torch.get_rng_state()
        ctx.inputs = []
        ctx.tensor_indices = []
        tensor_inputs = []
        for i, a in enumerate(args):
            if torch.is_tensor(a):
                tensor_inputs.append(a)
                ctx.tensor_indices.append(i)
                ctx.inputs.append(None)
            else:
                ctx.inputs.append(a)
        ctx.save_for_backward(*tensor_inputs)
        with torch.no_grad():
            outputs = run_function(*args)
        return outputs

    @staticmethod
    def backward(ctx, *args):
        inputs = list(ctx.inputs)
        tensors = ctx.saved_tensors
        for i, idx in enumerate(ctx.tensor_indices):
            inputs[idx] = tensors[i]
        with memcount.uncounted():
            surrounding = torch.get_rng_state()
        torch.set_rng_state(ctx.fwd_cpu_state)
        detached = []
        for inp in inputs:
            if torch.is_tensor(inp):
                x = inp.detach()
                x.requires_grad = inp.requires_grad
                detached.append(x)
            else:
                detached.append(inp)
        with torch.enable_grad():
            outputs = ctx.run_function(*detached)
        torch.set_rng_state(surrounding)
        if torch.is_tensor(outputs):
            outputs = (outputs,)
        outs, grads = [], []
        for o, g in zip(outputs, args):
            if torch.is_tensor(o) and o.requires_grad:
                outs.append(o)
                grads.append(g)
        del outputs
        torch.autograd.backward(outs, grads)
        del outs, grads
        return (None,) + tuple(x.grad if torch.is_tensor(x) else None for x in detached)


def checkpoint(fn, *args):
    return Checkpoint2x.apply(fn, *args)


# --------------------------------------------------------------------------
# CLIP vision tower (transformers 4.46 CLIPVisionModel)
def quick_gelu(x):
    return x * torch.sigmoid(1.702 * x)


ACTS = {"gelu": F.gelu, "quick_gelu": quick_gelu, "relu": F.relu, "silu": F.silu}


class CLIPAttention(nn.Module):
    def __init__(self, d, heads, attn):
        super().__init__()
        self.d, self.h, self.hd, self.attn = d, heads, d // heads, attn
        self.scale = self.hd ** -0.5
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def _shape(self, t, s, b):
        return t.view(b, s, self.h, self.hd).transpose(1, 2).contiguous()

    def forward(self, x):
        b, s, _ = x.shape
        if self.attn == "eager":
            q = self.q_proj(x) * self.scale
            k = self._shape(self.k_proj(x), -1, b)
            v = self._shape(self.v_proj(x), -1, b)
            shp = (b * self.h, -1, self.hd)
            q = self._shape(q, s, b).view(*shp)
            k = k.view(*shp)
            v = v.view(*shp)
            w = torch.bmm(q, k.transpose(1, 2))
            w = F.softmax(w, dim=-1)
            o = torch.bmm(w, v)
            o = o.view(b, self.h, s, self.hd).transpose(1, 2).reshape(b, s, self.d)
        else:
            q = self.q_proj(x).view(b, s, self.h, self.hd)
            k = self.k_proj(x).view(b, s, self.h, self.hd)
            v = self.v_proj(x).view(b, s, self.h, self.hd)
            kind = "fa2" if self.attn == "flash" else (
                "sdpa_me" if x.dtype == torch.float32 else "sdpa_fa")
            o = fused_attention(q, k, v, False, self.scale, kind)
            o = o.reshape(b, s, self.d)
        return self.out_proj(o)


class CLIPLayer(nn.Module):
    def __init__(self, d, heads, inter, act, attn):
        super().__init__()
        self.self_attn = CLIPAttention(d, heads, attn)
        self.layer_norm1 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, inter)
        self.fc2 = nn.Linear(inter, d)
        self.layer_norm2 = nn.LayerNorm(d)
        self.act = ACTS[act]

    def forward(self, x):
        r = x
        x = self.layer_norm1(x)
        x = self.self_attn(x)
        x = r + x
        r = x
        x = self.layer_norm2(x)
        x = self.fc2(self.act(self.fc1(x)))
        x = r + x
        return (x,)


class CLIPVision(nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c["hidden_size"]
        self.patch = c["patch_size"]
        self.class_embedding = nn.Parameter(torch.randn(d) * 0.02)
        self.patch_embedding = nn.Conv2d(c.get("num_channels", 3), d, self.patch, self.patch, bias=False)
        npos = (c["image_size"] // self.patch) ** 2 + 1
        self.position_embedding = nn.Embedding(npos, d)
        self.register_buffer("position_ids", torch.arange(npos).unsqueeze(0), persistent=False)
        self.pre_layrnorm = nn.LayerNorm(d)
        self.layers = nn.ModuleList([
            CLIPLayer(d, c["num_attention_heads"], c["intermediate_size"],
                      c.get("hidden_act", "quick_gelu"), c["_attn"])
            for _ in range(c["num_hidden_layers"])])
        self.post_layernorm = nn.LayerNorm(d)
        self.gradient_checkpointing = False

    def forward(self, pixel_values):
        b = pixel_values.shape[0]
        pe = self.patch_embedding(pixel_values.to(dtype=self.patch_embedding.weight.dtype))
        pe = pe.flatten(2).transpose(1, 2)
        ce = self.class_embedding.expand(b, 1, -1)
        x = torch.cat([ce, pe], dim=1)
        x = x + self.position_embedding(self.position_ids)
        x = self.pre_layrnorm(x)
        states = ()
        for layer in self.layers:
            states = states + (x,)
            if self.gradient_checkpointing and self.training:
                x = checkpoint(layer.__call__, x)[0]
            else:
                x = layer(x)[0]
        states = states + (x,)
        pooled = self.post_layernorm(x[:, 0, :])
        return x, pooled, states


# --------------------------------------------------------------------------
# LLaMA decoder (transformers 4.46)
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, h):
        dt = h.dtype
        h = h.to(torch.float32)
        var = Mean2x.apply(h.pow(2))  # EMU-1
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dt)


class LoraLinear(nn.Module):
    """PEFT LoraLayer.forward semantics."""

    def __init__(self, base, r, alpha, dropout):
        super().__init__()
        self.base_layer = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.zeros_(self.lora_B.weight)
        self.lora_dropout = PeftDropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / r

    def forward(self, x):
        result = self.base_layer(x)
        dt = result.dtype
        result = result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling
        return result.to(dt)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(h, n_rep):
    b, kv, s, d = h.shape
    if n_rep == 1:
        return h
    h = h[:, :, None, :, :].expand(b, kv, n_rep, s, d)
    return h.reshape(b, kv * n_rep, s, d)


class LlamaAttention(nn.Module):
    def __init__(self, c, attn):
        super().__init__()
        self.hidden = c["hidden_size"]
        self.h = c["num_attention_heads"]
        self.kv = c.get("num_key_value_heads", self.h)
        self.hd = c.get("head_dim", self.hidden // self.h)
        self.attn = attn
        self.q_proj = nn.Linear(self.hidden, self.h * self.hd, bias=False)
        self.k_proj = nn.Linear(self.hidden, self.kv * self.hd, bias=False)
        self.v_proj = nn.Linear(self.hidden, self.kv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.h * self.hd, self.hidden, bias=False)

    def forward(self, x, mask, pos_emb):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.hd).transpose(1, 2)
        cos, sin = pos_emb
        cos = cos.unsqueeze(1)
        sin = sin.unsqueeze(1)
        q = (q * cos) + (rotate_half(q) * sin)
        k = (k * cos) + (rotate_half(k) * sin)
        rep = self.h // self.kv
        if self.attn == "flash":
            o = fused_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                True, 1.0 / math.sqrt(self.hd), "fa2")
            o = o.reshape(b, s, -1).contiguous()
        elif self.attn == "sdpa":
            k = repeat_kv(k, rep)
            v = repeat_kv(v, rep)
            kind = "sdpa_me" if x.dtype == torch.float32 else "sdpa_fa"
            o = fused_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                True, 1.0 / math.sqrt(self.hd), kind)
            o = o.transpose(1, 2)                # (B,H,S,D) view, as SDPA returns
            o = o.transpose(1, 2).contiguous()   # HF: no copy (already B,S,H,D)
            o = o.view(b, s, -1)
        else:
            k = repeat_kv(k, rep)
            v = repeat_kv(v, rep)
            w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
            if mask is not None:
                w = w + mask[:, :, :, : k.shape[-2]]
            w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
            o = torch.matmul(w, v)
            o = o.transpose(1, 2).contiguous()
            o = o.reshape(b, s, -1)
        return self.o_proj(o)


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        h, i = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, c, attn):
        super().__init__()
        self.self_attn = LlamaAttention(c, attn)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = RMSNorm(c["hidden_size"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"])

    def forward(self, x, mask, pos_emb):
        r = x
        x = self.input_layernorm(x)
        x = self.self_attn(x, mask, pos_emb)
        x = r + x
        r = x
        x = self.post_attention_layernorm(x)
        x = self.mlp(x)
        x = r + x
        return (x,)


class Rotary(nn.Module):
    def __init__(self, dim, base=10000.0):
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    @torch.no_grad()
    def forward(self, x, position_ids):
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1)
        pos = position_ids[:, None, :].float()
        freqs = (inv.float() @ pos.float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * 1.0
        sin = emb.sin() * 1.0
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


class Llama(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([LlamaLayer(c, c["_attn"]) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(c["hidden_size"])
        hd = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
        self.rotary_emb = Rotary(hd)
        self.attn = c["_attn"]
        self.gradient_checkpointing = False

    def causal_mask(self, attention_mask, x):
        """_update_causal_mask of transformers 4.46 (training, no cache)."""
        if self.attn == "flash":
            if attention_mask is not None and (attention_mask == 0).any():
                return attention_mask
            return None
        if self.attn == "sdpa":
            if attention_mask is None or bool(attention_mask.all()):
                return None  # _ignore_causal_mask_sdpa -> is_causal=True
        dtype = x.dtype
        b, s = x.shape[0], x.shape[1]
        mn = torch.finfo(dtype).min
        cache_position = torch.arange(s)
        cm = torch.full((s, s), fill_value=mn, dtype=dtype)
        cm = torch.triu(cm, diagonal=1)
        cm *= torch.arange(s) > cache_position.reshape(-1, 1)
        cm = cm[None, None, :, :].expand(b, 1, -1, -1)
        if attention_mask is not None:
            cm = cm.clone()
            ml = attention_mask.shape[-1]
            pad = cm[:, :, :, :ml] + attention_mask[:, None, None, :]
            pad = pad == 0
            cm[:, :, :, :ml] = cm[:, :, :, :ml].masked_fill(pad, mn)
        return cm

    def forward(self, inputs_embeds, attention_mask):
        s = inputs_embeds.shape[1]
        cache_position = torch.arange(s)
        position_ids = cache_position.unsqueeze(0)
        mask = self.causal_mask(attention_mask, inputs_embeds)
        h = inputs_embeds
        pos_emb = self.rotary_emb(h, position_ids)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                h = checkpoint(layer.__call__, h, mask, pos_emb)[0]
            else:
                h = layer(h, mask, pos_emb)[0]
        del mask
        return self.norm(h)


def causal_lm_loss(logits, labels, vocab):
    """transformers >= 4.46 ForCausalLMLoss (labels shifted, no logits copy)."""
    logits = logits.float()
    labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)
    shift_labels = labels[..., 1:].contiguous()
    logits = logits.view(-1, vocab)
    shift_labels = shift_labels.view(-1)
    return F.cross_entropy(logits, shift_labels, ignore_index=IGNORE_INDEX, reduction="mean")


class Llava(nn.Module):
    def __init__(self, vit, proj, llm, attn, select_layer=-2):
        super().__init__()
        vit = dict(vit, _attn=vit.get("attention", attn))
        llm = dict(llm, _attn=llm.get("attention", attn))
        self.vision_tower = CLIPVision(vit)
        layers = []
        for i in range(proj.get("num_layers", 2)):
            layers.append(nn.Linear(proj["input_size"] if i == 0 else proj["hidden_size"], proj["hidden_size"]))
            if i + 1 < proj.get("num_layers", 2):
                layers.append({"gelu": nn.GELU(), "relu": nn.ReLU(), "silu": nn.SiLU()}.get(
                    proj.get("activation", "gelu"), nn.GELU()))
        self.mm_projector = nn.Sequential(*layers)
        self.model = Llama(llm)
        self.lm_head = nn.Linear(llm["hidden_size"], llm["vocab_size"], bias=False)
        self.vocab = llm["vocab_size"]
        self.select_layer = vit.get("select_layer", select_layer)
        self.vision_no_grad = True

    def encode_images(self, images):
        if self.vision_no_grad:
            with torch.no_grad():
                _, _, states = self.vision_tower(images)
                feats = states[self.select_layer][:, 1:].to(images.dtype)
                del states
        else:
            _, _, states = self.vision_tower(images)
            feats = states[self.select_layer][:, 1:].to(images.dtype)
            del states
        return self.mm_projector(feats)

    def prepare(self, input_ids, labels, attention_mask, images, n_img):
        """LLaVA prepare_inputs_labels_for_multimodal (right padding)."""
        embed = self.model.embed_tokens
        if images is None or n_img == 0:
            return embed(input_ids), labels, attention_mask
        image_features = self.encode_images(images)
        new_embeds, new_labels = [], []
        img_idx = 0
        for b in range(input_ids.shape[0]):
            ids = input_ids[b]
            lab = labels[b]
            pos = [-1] + torch.where(ids == IMAGE_TOKEN_INDEX)[0].tolist() + [ids.shape[0]]
            ids_noim, lab_noim = [], []
            for i in range(len(pos) - 1):
                ids_noim.append(ids[pos[i] + 1: pos[i + 1]])
                lab_noim.append(lab[pos[i] + 1: pos[i + 1]])
            sizes = [x.shape[0] for x in lab_noim]
            emb = embed(torch.cat(ids_noim))
            emb_noim = torch.split(emb, sizes, dim=0)
            cur_e, cur_l = [], []
            for i in range(n_img + 1):
                cur_e.append(emb_noim[i])
                cur_l.append(lab_noim[i])
                if i < n_img:
                    f = image_features[img_idx]
                    img_idx += 1
                    cur_e.append(f)
                    cur_l.append(torch.full((f.shape[0],), IGNORE_INDEX, dtype=lab.dtype))
            new_embeds.append(torch.cat(cur_e))
            new_labels.append(torch.cat(cur_l))
            del emb, emb_noim, cur_e, cur_l
        del image_features
        max_len = max(x.shape[0] for x in new_embeds)
        bsz = len(new_embeds)
        padded = []
        labels_p = torch.full((bsz, max_len), IGNORE_INDEX, dtype=new_labels[0].dtype)
        attn = torch.zeros((bsz, max_len), dtype=attention_mask.dtype)
        position_ids = torch.zeros((bsz, max_len), dtype=torch.long)
        for i, (e, l) in enumerate(zip(new_embeds, new_labels)):
            n = e.shape[0]
            padded.append(torch.cat((e, torch.zeros((max_len - n, e.shape[1]), dtype=e.dtype)), dim=0))
            labels_p[i, :n] = l
            attn[i, :n] = True
            position_ids[i, :n] = torch.arange(0, n, dtype=torch.long)
        del new_embeds, new_labels, position_ids
        inputs_embeds = torch.stack(padded, dim=0)
        return inputs_embeds, labels_p, attn

    def forward(self, input_ids, labels, attention_mask, images, n_img):
        inputs_embeds, labels, attention_mask = self.prepare(input_ids, labels, attention_mask, images, n_img)
        h = self.model(inputs_embeds, attention_mask)
        del inputs_embeds
        logits = self.lm_head(h[:, -0:, :])
        del h
        return causal_lm_loss(logits, labels, self.vocab)


# --------------------------------------------------------------------------
# EMU-5: torch 2.x torch.optim.AdamW(foreach=True) = _multi_tensor_adamw.
# State steps live on the host (not capturable/fused) -> Python floats here.
class AdamW2x:
    def __init__(self, groups, lr=1e-5, betas=(0.9, 0.999), eps=1e-8):
        self.groups = groups  # list of (params, weight_decay)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.state = {}

    @torch.no_grad()
    def step(self):
        lr, (b1, b2), eps = self.lr, self.betas, self.eps
        for params, wd in self.groups:
            ps, gs, m1, m2, steps = [], [], [], [], []
            for p in params:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if st is None:
                    st = self.state[p] = {
                        "step": 0.0,
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                ps.append(p)
                gs.append(p.grad)
                m1.append(st["exp_avg"])
                m2.append(st["exp_avg_sq"])
                steps.append(st)
            if not ps:
                continue
            for st in steps:
                st["step"] += 1.0
            bc1 = [1 - b1 ** st["step"] for st in steps]
            bc2 = [1 - b2 ** st["step"] for st in steps]
            step_size = [(lr / bc) * -1 for bc in bc1]
            bc2_sqrt = [bc ** 0.5 for bc in bc2]
            # In-place foreach ops allocate nothing on CUDA; on the CPU slow path
            # they only wrap Python scalars into 0-dim tensors -> uncounted.
            with memcount.uncounted():
                if wd != 0:
                    torch._foreach_mul_(ps, 1 - lr * wd)
                for m, g in zip(m1, gs):  # _foreach_lerp_ (missing in 1.13)
                    m.lerp_(g, 1 - b1)
                torch._foreach_mul_(m2, b2)
                torch._foreach_addcmul_(m2, gs, gs, 1 - b2)
            del gs
            denom = torch._foreach_sqrt(m2)  # the one param-sized temporary list
            with memcount.uncounted():
                torch._foreach_div_(denom, bc2_sqrt)
                torch._foreach_add_(denom, eps)
                torch._foreach_addcdiv_(ps, m1, denom, step_size)
            del denom

    def zero_grad(self):
        for params, _ in self.groups:
            for p in params:
                p.grad = None


def hf_param_groups(model, wd=0.0):
    """HF Trainer: decay group (not bias, not LayerNorm/RMSNorm) and no-decay group."""
    norm_types = (nn.LayerNorm, RMSNorm)
    nodecay = set()
    for mod in model.modules():
        for n, p in mod.named_parameters(recurse=False):
            if isinstance(mod, norm_types) or n == "bias":
                nodecay.add(id(p))
    decay = [p for p in model.parameters() if p.requires_grad and id(p) not in nodecay]
    nod = [p for p in model.parameters() if p.requires_grad and id(p) in nodecay]
    return [(decay, wd), (nod, 0.0)]
