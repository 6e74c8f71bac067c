#!/usr/bin/python3
"""Self-tests of the CPU memory oracle (make check-oracle).

1. The byte counter is exact: nn.Linear + AdamW (torch 2.x foreach emulation)
   steady-state step, every phase checked against hand-computed byte counts.
2. The same against torch 1.13's own torch.optim.AdamW(foreach=True).
3. The fused-attention emulation (flash / SDPA) matches eager attention in
   outputs and gradients (MHA and GQA, causal and not).
4. The torch 2.x emulations keep what they should for backward.
Skips (exit 0) with a clear message when torch or its C++ headers are absent.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import torch
except ImportError:
    print("oracle selftest: skipped: torch not available (run with /usr/bin/python3; "
          "Debian package python3-torch)")
    sys.exit(0)

import memcount  # noqa: E402

why = memcount.headers_missing()
if why:
    print("oracle selftest: skipped: " + why)
    sys.exit(0)

import model as M  # noqa: E402

FAILS = []


def check(name, got, want):
    ok = got == want
    print("  %-52s %10d  expected %10d  %s" % (name, got, want, "ok" if ok else "FAIL"))
    if not ok:
        FAILS.append(name)


def linear_step(opt_factory, n_in=64, n_out=32, batch=4):
    ext = memcount.load()
    ext.install()
    torch.manual_seed(0)
    lin = torch.nn.Linear(n_in, n_out)
    opt = opt_factory(lin)
    x = torch.randn(batch, n_in)
    res = {}
    for measured in (False, True):
        g = torch.ones(batch, n_out)        # upstream gradient, allocated before the step
        ext.reset_peak()
        res["start"] = ext.live()
        y = lin(x)
        res["fwd_peak"] = ext.reset_peak()
        y.backward(g)
        res["bwd_peak"] = ext.reset_peak()
        res["bwd_end"] = ext.live()
        del y, g
        opt.step()
        opt.zero_grad(set_to_none=True) if not isinstance(opt, M.AdamW2x) else opt.zero_grad()
        res["opt_peak"] = ext.reset_peak()
        res["end"] = ext.live()
    return res


def test_linear_exact():
    print("linear(64->32) fp32 + AdamW foreach (torch 2.x emulation), batch 4:")
    r = linear_step(lambda lin: M.AdamW2x([(list(lin.parameters()), 0.0)]))
    F = 4                       # fp32 bytes
    W = 32 * 64 * F             # 8192  weight
    B = 32 * F                  # 128   bias
    P = W + B                   # 8320  params
    S = 2 * P                   # 16640 exp_avg + exp_avg_sq (steps are host floats)
    X = 4 * 64 * F              # 1024  input
    G = 4 * 32 * F              # 512   upstream grad (held by the test)
    Y = 4 * 32 * F              # 512   output y = addmm(b, x, W^T)
    start = P + S + X + G
    check("start: params+states+input+upstream grad", r["start"], start)
    check("forward peak: + output", r["fwd_peak"], start + Y)
    check("backward peak: + dW + db (dx not needed)", r["bwd_peak"], start + Y + W + B)
    check("end of backward", r["bwd_end"], start + Y + W + B)
    # after del y, g: params+states+x+grads, + one sqrt(exp_avg_sq) list
    check("optimizer peak: + sqrt(exp_avg_sq) list", r["opt_peak"], P + S + X + P + P)
    check("after zero_grad(set_to_none)", r["end"], P + S + X)


def test_linear_torch113_adamw():
    print("linear(64->32) fp32 + torch 1.13 torch.optim.AdamW(foreach=True):")
    r = linear_step(lambda lin: torch.optim.AdamW(lin.parameters(), lr=1e-3, weight_decay=0.0, foreach=True))
    F = 4
    P = (32 * 64 + 32) * F
    S = 2 * P + 2 * 4           # exp_avg, exp_avg_sq, two fp32 0-dim step tensors
    X = 4 * 64 * F
    G = 4 * 32 * F
    start = P + S + X + G
    check("start", r["start"], start)
    check("backward peak", r["bwd_peak"], start + G + P)
    # 1.13 _multi_tensor_adamw: sqrt list + out-of-place denom list (2 x P);
    # its CPU slow path also wraps Python scalars into 0-dim tensors (<= 64 B).
    extra = r["opt_peak"] - (P + S + X + P + 2 * P)
    print("  %-52s %10d  expected in [0, 64]  %s" % ("optimizer peak - (states+grads+2 temp lists)",
                                                  extra, "ok" if 0 <= extra <= 64 else "FAIL"))
    if not 0 <= extra <= 64:
        FAILS.append("torch113 adamw")
    check("after zero_grad", r["end"], P + S + X)


def ref_attn(q, k, v, causal, scale):
    # q (B,S,H,D), k/v (B,S,Hk,D)
    rep = q.shape[2] // k.shape[2]
    qh, kh, vh = (t.permute(0, 2, 1, 3) for t in (q, k, v))
    kh = kh.repeat_interleave(rep, 1)
    vh = vh.repeat_interleave(rep, 1)
    s = qh @ kh.transpose(-1, -2) * scale
    if causal:
        S = q.shape[1]
        s = s.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ vh).permute(0, 2, 1, 3)


def test_fused_attention():
    print("fused attention emulation vs eager (fp32):")
    memcount.load()
    torch.manual_seed(0)
    for (B, S, H, Hk, D, causal, kind) in [(2, 37, 4, 4, 16, True, "sdpa_fa"),
                                            (1, 70, 8, 2, 32, True, "fa2"),
                                            (3, 50, 4, 4, 8, False, "sdpa_me"),
                                            (2, 300, 4, 1, 16, True, "fa2")]:
        q = torch.randn(B, S, H, D, dtype=torch.float64).float().requires_grad_()
        k = torch.randn(B, S, Hk, D).requires_grad_()
        v = torch.randn(B, S, Hk, D).requires_grad_()
        go = torch.randn(B, S, H, D)
        sc = D ** -0.5
        o1 = M.fused_attention(q, k, v, causal, sc, kind)
        g1 = torch.autograd.grad(o1, (q, k, v), go)
        o2 = ref_attn(q, k, v, causal, sc)
        g2 = torch.autograd.grad(o2, (q, k, v), go)
        errs = [float((o1 - o2).abs().max())] + [float((a - b).abs().max()) for a, b in zip(g1, g2)]
        ok = max(errs) < 1e-4
        print("  B%d S%d H%d Hk%d D%d causal=%s %-8s max|diff| out/dq/dk/dv = %s  %s" % (
            B, S, H, Hk, D, causal, kind, " ".join("%.1e" % e for e in errs), "ok" if ok else "FAIL"))
        if not ok:
            FAILS.append("fused attention %s" % kind)


def test_emulations():
    print("torch 2.x emulations:")
    x = torch.randn(3, 8, requires_grad=True)
    y = M.Mean2x.apply(x.pow(2))
    g = torch.autograd.grad(y.sum(), x)[0]
    ok = torch.allclose(g, 2 * x / 8) and not hasattr(y.grad_fn, "_saved_self")
    print("  Mean2x gradient and no saved input: %s" % ("ok" if ok else "FAIL"))
    if not ok:
        FAILS.append("Mean2x")
    memcount.load().install()
    ext = memcount.load()
    x = torch.randn(64, 64, requires_grad=True)
    import gc
    gc.collect()
    before = ext.live()
    yd = M.Dropout2x.apply(x, 0.25)
    kept = ext.live() - before
    ok = kept == 64 * 64 * 4 + 64 * 64 * 1  # output (fp32) + bool mask
    print("  Dropout2x keeps output + 1-byte mask: %d bytes  %s" % (kept, "ok" if ok else "FAIL"))
    if not ok:
        FAILS.append("Dropout2x")
    del yd


def main():
    test_linear_exact()
    test_linear_torch113_adamw()
    test_fused_attention()
    test_emulations()
    if FAILS:
        print("oracle selftest: FAILED: " + ", ".join(FAILS))
        return 1
    print("oracle selftest: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
