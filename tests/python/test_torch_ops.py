"""flashkv.torch on CPU tensors: the custom operators through autograd and torch.compile, vs the float64 reference.

* forward (out, lse) and loss.backward() gradients of flashkv.torch.attention / flash_attn_func / the varlen call vs
  the float64 reference differentiated by autograd (torch_reference.py, explicit boolean mask); error <= 2x (forward,
  lse) / 3x (gradients) the error of the naive computation in the same precision, both vs float64, plus the absolute
  slack of the other Python tests (1e-5 out, 1e-4 lse and gradients);
* torch.library.opcheck on every operator (schema, fake implementation vs real outputs, autograd registration);
* torch.compile(fullgraph=True) of a block using the operators, forward + backward, with no graph break
  (torch._dynamo.explain) and the eager result;
* kv_append and paged_decode (the CPU implementation) vs the reference on the gathered pages.
Skipped (with the reason) where torch is not installed. Seeds: conftest.py (printed; FLASHKV_TEST_SEED reproduces).
"""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup installs it for the CI)")

import flashkv  # noqa: E402
import flashkv.torch as ft  # noqa: E402
from torch_reference import attention_ref, grads, max_err, varlen_ref  # noqa: E402

TDT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def rand(rng, shape, dtype="float32"):
    return torch.from_numpy(rng.standard_normal(shape).astype("float32")).to(TDT[dtype])


def check_fwd_bwd(fn, ref_fn, inputs, dout, dtype):
    """fn, ref_fn(*inputs, dtype=...) -> (out, lse). Forward 2x / backward 3x rule vs float64 through autograd."""
    out, lse = fn(*inputs)
    ref, ref_lse = ref_fn(*inputs, dtype=torch.float64)
    naive, naive_lse = ref_fn(*inputs, dtype=TDT[dtype])
    assert out.dtype == inputs[0].dtype and lse.dtype == torch.float32 and not lse.requires_grad
    err, base = max_err(out, ref), max_err(naive, ref)
    assert err <= 2 * base + 1e-5, ("out", err, base)
    lerr, lbase = max_err(lse, ref_lse), max_err(naive_lse, ref_lse)
    assert lerr <= 2 * lbase + 1e-4, ("lse", lerr, lbase)
    _, g = grads(lambda *x: fn(*x)[0], inputs, dout)
    _, g64 = grads(lambda *x: ref_fn(*x, dtype=torch.float64)[0], inputs, dout)
    _, gn = grads(lambda *x: ref_fn(*x, dtype=TDT[dtype])[0], inputs, dout)
    for name, a, r, n in zip(("dq", "dk", "dv"), g, g64, gn):
        assert a.dtype == inputs[0].dtype and a.shape == r.shape
        err, base = max_err(a, r), max_err(n, r)
        assert err <= 3 * base + 1e-4, (name, err, base)


CASES = [
    # (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, options)
    (2, 37, 53, 4, 4, 32, {}),
    (2, 37, 53, 4, 2, 64, {"causal": True}),  # GQA
    (1, 61, 29, 4, 1, 32, {"causal": True}),  # MQA; seqlen_q > seqlen_k: the first rows see no key
    (1, 45, 70, 2, 2, 16, {"window_size": (9, 3), "softcap": 20.0, "softmax_scale": 0.3}),
]


def case_id(c):
    return "_".join([f"b{c[0]}q{c[1]}k{c[2]}h{c[3]}_{c[4]}d{c[5]}", *sorted(c[6])])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_attention_autograd_matches_reference(rng, dtype, case):
    b, sq, sk, h, hkv, d, opts = case
    q, k, v = rand(rng, (b, sq, h, d), dtype), rand(rng, (b, sk, hkv, d), dtype), rand(rng, (b, sk, hkv, d), dtype)
    dout = rand(rng, (b, sq, h, d))
    check_fwd_bwd(lambda q, k, v: ft.attention(q, k, v, return_lse=True, **opts),
                  lambda q, k, v, dtype: attention_ref(q, k, v, dtype=dtype, **opts), (q, k, v), dout, dtype)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_flash_attn_func_matches_reference(rng, case):
    b, sq, sk, h, hkv, d, opts = case
    q, k, v = rand(rng, (b, sq, h, d)), rand(rng, (b, sk, hkv, d)), rand(rng, (b, sk, hkv, d))
    dout = rand(rng, (b, sq, h, d))

    def fn(q, k, v):
        out, lse, s_dmask = ft.flash_attn_func(q, k, v, return_attn_probs=True, **opts)
        assert s_dmask.numel() == 0 and s_dmask.dtype == q.dtype  # flash_attn: no probabilities without dropout
        return out, lse

    check_fwd_bwd(fn, lambda q, k, v, dtype: attention_ref(q, k, v, dtype=dtype, **opts), (q, k, v), dout, "float32")


SEQS = [(5, 17), (0, 9), (33, 0), (1, 40), (23, 23)]  # (seqlen_q, seqlen_k) per sequence, empty ones included


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("opts", [{}, {"causal": True}, {"window_size": (7, 2), "softcap": 15.0}],
                         ids=["full", "causal", "window_softcap"])
def test_varlen_autograd_matches_reference(rng, dtype, opts):
    h, hkv, d = 4, 2, 32
    lq, lk = [s for s, _ in SEQS], [s for _, s in SEQS]
    cu_q = torch.tensor([0] + list(torch.tensor(lq).cumsum(0)), dtype=torch.int64)  # int64 accepted (converted)
    cu_k = torch.tensor([0] + list(torch.tensor(lk).cumsum(0)), dtype=torch.int64)
    q, k, v = rand(rng, (sum(lq), h, d), dtype), rand(rng, (sum(lk), hkv, d), dtype), rand(rng, (sum(lk), hkv, d), dtype)
    dout = rand(rng, (sum(lq), h, d))

    def fn(q, k, v):
        out, lse, _ = ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lq), max(lk), return_attn_probs=True, **opts)
        return out, lse

    check_fwd_bwd(fn, lambda q, k, v, dtype: varlen_ref(q, k, v, cu_q, cu_k, dtype=dtype, **opts), (q, k, v), dout,
                  dtype)


def test_strided_views_and_expanded_gradients(rng):
    """transformers' layout ([b, h, s, d] transposed to bshd views) needs no copy; out.sum() backpropagates a
    stride-0 gradient; both must give the reference values."""
    q = rand(rng, (2, 4, 19, 32)).transpose(1, 2).requires_grad_(True)
    k = rand(rng, (2, 2, 23, 32)).transpose(1, 2).requires_grad_(True)
    v = rand(rng, (2, 2, 23, 32)).transpose(1, 2).requires_grad_(True)
    out = ft.flash_attn_func(q, k, v, causal=True)
    ref, _ = attention_ref(q.detach(), k.detach(), v.detach(), causal=True)
    assert max_err(out, ref) < 1e-5
    out.sum().backward()
    _, g64 = grads(lambda *x: attention_ref(*x, causal=True)[0], (q.detach(), k.detach(), v.detach()),
                   torch.ones(out.shape, dtype=torch.float64))
    for a, r in zip((q.grad, k.grad, v.grad), g64):
        assert max_err(a, r) < 1e-4


def test_deterministic_flag_reaches_the_backward(rng):
    q, k, v = rand(rng, (1, 16, 2, 16)), rand(rng, (1, 16, 2, 16)), rand(rng, (1, 16, 2, 16))
    outs = []
    for det in (False, True):
        _, g = grads(lambda *x: ft.flash_attn_func(*x, causal=True, deterministic=det), (q, k, v),
                     torch.ones(1, 16, 2, 16))
        outs.append(g)
    for a, b in zip(*outs):  # the CPU backward is always deterministic: both flags give the same bits
        assert torch.equal(a, b)


# ---- operators: opcheck, torch.compile ----------------------------------------------------------------------------


def test_opcheck_every_operator(rng):
    q, k, v = rand(rng, (2, 9, 4, 16)), rand(rng, (2, 11, 2, 16)), rand(rng, (2, 11, 2, 16))
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    torch.library.opcheck(torch.ops.flashkv.fwd.default, (qg, kg, vg, None, True, -1, -1, 0.0, False))
    out, lse = torch.ops.flashkv.fwd(q, k, v, None, True, -1, -1, 0.0, False)
    torch.library.opcheck(torch.ops.flashkv.bwd.default, (torch.ones_like(out), q, k, v, out, lse, None, True, -1, -1,
                                                          0.0, False))
    cu_q, cu_k = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([0, 7, 11], dtype=torch.int32)
    qv, kv, vv = q[0].clone().requires_grad_(True), k[0].clone().requires_grad_(True), v[0].clone().requires_grad_(True)
    torch.library.opcheck(torch.ops.flashkv.varlen_fwd.default, (qv, kv, vv, cu_q, cu_k, 5, 7, None, True, -1, -1, 0.0,
                                                                 False))
    o2, l2 = torch.ops.flashkv.varlen_fwd(q[0], k[0], v[0], cu_q, cu_k, 5, 7, None, True, -1, -1, 0.0, False)
    torch.library.opcheck(torch.ops.flashkv.varlen_bwd.default, (torch.ones_like(o2), q[0], k[0], v[0], o2, l2, cu_q,
                                                                 cu_k, 5, 7, None, True, -1, -1, 0.0, False))
    kc, vc = rand(rng, (6, 16, 2, 16)), rand(rng, (6, 16, 2, 16))
    table = torch.tensor([[0, 2, 4], [1, 3, 5]], dtype=torch.int32)
    lens = torch.tensor([5, 20], dtype=torch.int32)
    kn, vn = rand(rng, (2, 3, 2, 16)), rand(rng, (2, 3, 2, 16))
    torch.library.opcheck(torch.ops.flashkv.kv_append.default, (kc.clone(), vc.clone(), table, lens, kn, vn))
    torch.library.opcheck(torch.ops.flashkv.paged_decode.default, (q[:, :3].contiguous(), kc.clone(), vc.clone(), table,
                                                                   lens, kn, vn, None, True, 0.0, 0, 0))


class Block(torch.nn.Module):
    """An attention block: qkv projection, flashkv attention (GQA, causal), output projection."""

    def __init__(self, dim=64, heads=4, kv_heads=2):
        super().__init__()
        self.h, self.hkv, self.d = heads, kv_heads, dim // heads
        self.qkv = torch.nn.Linear(dim, (heads + 2 * kv_heads) * self.d)
        self.o = torch.nn.Linear(heads * self.d, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.hkv * self.d, self.hkv * self.d], dim=-1)
        out = ft.flash_attn_func(q.view(b, s, self.h, self.d), k.view(b, s, self.hkv, self.d),
                                 v.view(b, s, self.hkv, self.d), causal=True)
        return self.o(out.reshape(b, s, -1))


def test_compile_fullgraph_no_graph_break_and_same_result(rng):
    torch.manual_seed(int(rng.integers(1 << 30)))
    block = Block()
    x = torch.randn(2, 24, 64)
    explain = torch._dynamo.explain(block)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")  # AOT autograd: fake impls + backward
    y_eager = block(x)
    y_eager.square().sum().backward()
    g_eager = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    y = compiled(x)
    y.square().sum().backward()
    assert torch.equal(y, y_eager)
    for a, b in zip((p.grad for p in block.parameters()), g_eager):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_compile_fullgraph_varlen_and_kvcache(rng):
    q, k, v = rand(rng, (20, 4, 16)), rand(rng, (24, 2, 16)), rand(rng, (24, 2, 16))
    cu_q, cu_k = torch.tensor([0, 8, 20], dtype=torch.int32), torch.tensor([0, 10, 24], dtype=torch.int32)

    def f(q, k, v):
        return ft.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 12, 14, causal=True)

    assert torch._dynamo.explain(f)(q, k, v).graph_break_count == 0
    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v), f(q, k, v))
    kc, vc = rand(rng, (2, 32, 2, 16)), rand(rng, (2, 32, 2, 16))
    lens = torch.tensor([3, 9], dtype=torch.int32)
    kn, vn, qd = rand(rng, (2, 1, 2, 16)), rand(rng, (2, 1, 2, 16)), rand(rng, (2, 1, 4, 16))

    def g(q, kc, vc):
        return ft.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, causal=True)

    assert torch._dynamo.explain(g)(qd, kc.clone(), vc.clone()).graph_break_count == 0
    kc1, vc1, kc2, vc2 = kc.clone(), vc.clone(), kc.clone(), vc.clone()
    out_c = torch.compile(g, fullgraph=True, backend="aot_eager")(qd, kc1, vc1)
    out_e = g(qd, kc2, vc2)
    assert torch.equal(out_c, out_e) and torch.equal(kc1, kc2) and torch.equal(vc1, vc2)  # the in-place append too


# ---- KV append, paged decode (CPU implementation), flash_attn_with_kvcache ------------------------------------------


def gather_pages(cache, table, n):
    ps = cache.shape[1]
    pages = table[: (n + ps - 1) // ps].to(torch.int64)
    return cache[pages].reshape(-1, *cache.shape[2:])[:n]


@pytest.mark.parametrize("paged", [True, False], ids=["paged", "contiguous"])
def test_flash_attn_with_kvcache_appends_and_matches_reference(rng, paged):
    b, h, hkv, d, ps, sq = 3, 4, 2, 32, 16, 2
    lens = torch.tensor([0, 17, 40], dtype=torch.int32)
    if paged:
        kc, vc = rand(rng, (9, ps, hkv, d)), rand(rng, (9, ps, hkv, d))
        table = torch.tensor([[4, 0, 8], [2, 6, 1], [7, 3, 5]], dtype=torch.int32)
    else:
        kc, vc, table = rand(rng, (b, 48, hkv, d)), rand(rng, (b, 48, hkv, d)), None
    k0, v0 = kc.clone(), vc.clone()
    q, kn, vn = rand(rng, (b, sq, h, d)), rand(rng, (b, sq, hkv, d)), rand(rng, (b, sq, hkv, d))
    out, lse = ft.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=lens, block_table=table, causal=True,
                                          return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (b, h, sq) and lens.tolist() == [0, 17, 40]  # not updated
    for i in range(b):
        n = int(lens[i]) + sq
        if paged:
            ks, vs = gather_pages(kc, table[i], n), gather_pages(vc, table[i], n)
            before = gather_pages(k0, table[i], int(lens[i]))
        else:
            ks, vs, before = kc[i, :n], vc[i, :n], k0[i, : int(lens[i])]
        assert torch.equal(ks[n - sq :], kn[i]) and torch.equal(vs[n - sq :], vn[i])  # appended in place
        assert torch.equal(ks[: n - sq], before)  # the rest untouched
        ref, ref_lse = attention_ref(q[i : i + 1], ks[None], vs[None], causal=True)
        assert max_err(out[i : i + 1], ref) < 1e-5 and max_err(lse[i : i + 1], ref_lse) < 1e-4
    # cache_seqlens as an int, no append, non-causal; None = the whole capacity
    out2 = ft.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=17, block_table=table)
    ks = gather_pages(kc, table[1], 17) if paged else kc[1, :17]
    vs = gather_pages(vc, table[1], 17) if paged else vc[1, :17]
    assert max_err(out2[1:2], attention_ref(q[1:2], ks[None], vs[None])[0]) < 1e-5
    full = ft.flash_attn_with_kvcache(q, kc, vc, block_table=table)
    cap = 48
    ks = gather_pages(kc, table[0], cap) if paged else kc[0]
    vs = gather_pages(vc, table[0], cap) if paged else vc[0]
    assert max_err(full[0:1], attention_ref(q[0:1], ks[None], vs[None])[0]) < 1e-5


def test_kv_append_positions_and_capacity(rng):
    kc, vc = torch.zeros(4, 16, 1, 8), torch.zeros(4, 16, 1, 8)
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    lens = torch.tensor([14, 0], dtype=torch.int32)
    kn, vn = rand(rng, (2, 3, 1, 8)), rand(rng, (2, 3, 1, 8))
    ft.kv_append(kc, vc, table, lens, kn, vn)
    assert torch.equal(kc[3, 14:16], kn[0, :2]) and torch.equal(kc[1, 0], kn[0, 2])  # crosses into the next page
    assert torch.equal(vc[0, :3], vn[1]) and int(kc[2].abs().sum()) == 0
    with pytest.raises(flashkv.CapacityError, match="cache_seqlens.*capacity 32"):
        ft.kv_append(kc, vc, table, torch.tensor([30, 0], dtype=torch.int32), kn, vn)
    with pytest.raises(TypeError, match="'cache_seqlens': expected int32"):
        ft.kv_append(kc, vc, table, lens.to(torch.int64), kn, vn)


def test_kvcache_append_past_capacity_is_an_error_and_writes_nothing(rng):
    """As the CUDA paged decode (docs/python.md): lengths past the capacity raise CapacityError naming them, and the
    cache is unchanged."""
    kc, vc = rand(rng, (1, 16, 1, 8)), rand(rng, (1, 16, 1, 8))
    k0, v0 = kc.clone(), vc.clone()
    q, kn, vn = rand(rng, (1, 3, 2, 8)), rand(rng, (1, 3, 1, 8)), rand(rng, (1, 3, 1, 8))
    with pytest.raises(flashkv.CapacityError, match="needs 17 tokens.*capacity 16"):
        ft.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=14)
    assert torch.equal(kc, k0) and torch.equal(vc, v0)
    out = ft.flash_attn_with_kvcache(q, kc, vc, kn, vn, cache_seqlens=13, causal=True)  # exactly fills the capacity
    assert torch.equal(kc[0, 13:], kn[0])
    ref, _ = attention_ref(q, kc, vc, causal=True)
    assert max_err(out, ref) < 1e-5


# ---- flash-attn signatures: names, order, defaults; every unsupported argument is an error naming it --------------

FLASH_ATTN_SIGNATURES = {  # flash_attn 2.x flash_attn_interface.py (names, defaults) — the drop-in contract
    "flash_attn_func": [("q", None), ("k", None), ("v", None), ("dropout_p", 0.0), ("softmax_scale", None),
                        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
                        ("deterministic", False), ("return_attn_probs", False)],
    "flash_attn_varlen_func": [("q", None), ("k", None), ("v", None), ("cu_seqlens_q", None), ("cu_seqlens_k", None),
                               ("max_seqlen_q", None), ("max_seqlen_k", None), ("dropout_p", 0.0),
                               ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                               ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False),
                               ("return_attn_probs", False), ("block_table", None)],
    "flash_attn_with_kvcache": [("q", None), ("k_cache", None), ("v_cache", None), ("k", None), ("v", None),
                                ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                                ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
                                ("num_splits", 0), ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_SIGNATURES))
def test_flash_attn_signature(name):
    import inspect

    params = list(inspect.signature(getattr(ft, name)).parameters.values())
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == FLASH_ATTN_SIGNATURES[name]
    assert all(p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)  # positional use works too


def test_flash_attn_arguments_each_documented_one(rng):
    q, k, v = rand(rng, (1, 12, 2, 16)), rand(rng, (1, 12, 2, 16)), rand(rng, (1, 12, 2, 16))
    base = ft.flash_attn_func(q, k, v)
    ref = lambda **o: attention_ref(q, k, v, **o)[0]  # noqa: E731
    assert max_err(base, ref()) < 1e-5
    assert max_err(ft.flash_attn_func(q, k, v, 0.0, 0.2), ref(softmax_scale=0.2)) < 1e-5  # positional softmax_scale
    assert max_err(ft.flash_attn_func(q, k, v, causal=True), ref(causal=True)) < 1e-5
    assert max_err(ft.flash_attn_func(q, k, v, window_size=(3, 1)), ref(window_size=(3, 1))) < 1e-5
    assert max_err(ft.flash_attn_func(q, k, v, softcap=2.0), ref(softcap=2.0)) < 1e-5
    assert torch.equal(ft.flash_attn_func(q, k, v, deterministic=True), base)
    out, lse, s = ft.flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out, base) and lse.shape == (1, 2, 12) and s.numel() == 0
    for kwargs, arg in [({"dropout_p": 0.1}, "dropout_p"), ({"alibi_slopes": torch.ones(2)}, "alibi_slopes")]:
        with pytest.raises(flashkv.UnsupportedError, match=f"'{arg}'"):
            ft.flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(ValueError, match="'window_size'"):
        ft.flash_attn_func(q, k, v, window_size=3)
    with pytest.raises(TypeError, match="'q'"):
        ft.flash_attn_func(q.double(), k.double(), v.double())
    cu = torch.tensor([0, 12], dtype=torch.int32)
    with pytest.raises(flashkv.UnsupportedError, match="'block_table'"):
        ft.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12, 12, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(TypeError, match="'max_seqlen_q'"):
        ft.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 12.0, 12)
    kc, vc = rand(rng, (1, 32, 2, 16)), rand(rng, (1, 32, 2, 16))
    for kwargs, arg in [({"rotary_cos": torch.ones(1)}, "rotary_cos"), ({"rotary_sin": torch.ones(1)}, "rotary_sin"),
                        ({"cache_batch_idx": torch.zeros(1, dtype=torch.int32)}, "cache_batch_idx"),
                        ({"cache_leftpad": torch.zeros(1, dtype=torch.int32)}, "cache_leftpad"),
                        ({"alibi_slopes": torch.ones(2)}, "alibi_slopes"), ({"window_size": (4, 0)}, "window_size")]:
        with pytest.raises(flashkv.UnsupportedError, match=f"'{arg}'"):
            ft.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, **kwargs)
    with pytest.raises(ValueError, match="'v'"):
        ft.flash_attn_with_kvcache(q, kc, vc, k=k)
    with pytest.raises(ValueError, match="'num_splits'"):
        ft.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, num_splits=300)
    # window_size (-1, 0) is the causal mask; num_splits / rotary_interleaved accepted (no effect on the CPU result)
    a = ft.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, window_size=(-1, 0), num_splits=3)
    assert torch.equal(a, ft.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20, causal=True))
    assert max_err(a, attention_ref(q, kc[:, :20], vc[:, :20], causal=True)[0]) < 1e-5
