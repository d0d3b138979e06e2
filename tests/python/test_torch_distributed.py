"""flashkv.torch.distributed.ring_attention over gloo on the CPU kernels: 2, 3 and 4 processes.

Every rank builds the same global q, k, v (seeded), takes its shard, runs ring attention forward + backward, and
compares its out, lse and dq/dk/dv shard with the float64 reference on the whole sequence (torch_reference.py, autograd
gradients): causal and not, zigzag and contiguous sharding, uneven shard lengths (arbitrary zigzag chunk lengths, an
empty shard), GQA, softcap, bfloat16 (2x / 3x the naive bf16 error), varlen (sequences packed per rank). The float32
bound: 1e-5 (out), 1e-4 (lse, gradients) absolute, as the other float32 tests; world size 1 equals single-process
flashkv bit for bit. Skipped without torch (or without gloo). Seeds: conftest.py (printed).
"""
import os
import traceback

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (scripts/setup installs it for the CI)")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

from torch_reference import attention_ref, grads, max_err, varlen_ref  # noqa: E402


def _cases(world):
    """(name, global seqlen or per-rank layout, heads, kv heads, head dim, options)."""
    w = world
    return [
        ("zigzag_causal", {"seqlen": 8 * w + 3, "sharding": "zigzag"}, 4, 2, 32, {"causal": True}),
        ("zigzag_full_softcap", {"seqlen": 6 * w, "sharding": "zigzag"}, 2, 2, 16, {"softcap": 5.0}),
        ("zigzag_uneven_chunks", {"chunks": [(3 + r, 7 - r if r < 7 else 1) for r in range(w)],
                                  "sharding": "zigzag"}, 4, 1, 16, {"causal": True}),
        ("contiguous_causal_uneven", {"lengths": [5, 0, 13, 2][:w] if w > 2 else [9, 4],
                                      "sharding": "contiguous"}, 4, 2, 16, {"causal": True, "softmax_scale": 0.4}),
        ("contiguous_full", {"lengths": [7] * w, "sharding": "contiguous"}, 2, 1, 16, {}),
        ("zigzag_causal_bf16", {"seqlen": 8 * w, "sharding": "zigzag", "dtype": torch.bfloat16}, 4, 2, 32,
         {"causal": True}),
    ]


def _zigzag_positions(chunks, world):
    """Global index lists per rank for zigzag chunk lengths chunks[r] = (len chunk r, len chunk 2W-1-r)."""
    lens = [0] * (2 * world)
    for r, (a, b) in enumerate(chunks):
        lens[r], lens[2 * world - 1 - r] = a, b
    starts = [sum(lens[:i]) for i in range(2 * world)]
    out = []
    for r in range(world):
        a, b = r, 2 * world - 1 - r
        out.append(list(range(starts[a], starts[a] + lens[a])) + list(range(starts[b], starts[b] + lens[b])))
    return out, sum(lens)


def _run_case(rank, world, seed, case):
    from flashkv.torch import distributed as fd

    name, layout, h, hkv, d, opts = case
    dtype = layout.get("dtype", torch.float32)
    g = torch.Generator().manual_seed(seed)
    first = None
    if "seqlen" in layout:
        n = layout["seqlen"]
        per_rank = []
        for r in range(world):
            per_rank.append([i for s, e in fd.shard_bounds(n, world, r, layout["sharding"]) for i in range(s, e)])
    elif "chunks" in layout:
        per_rank, n = _zigzag_positions(layout["chunks"], world)
        first = layout["chunks"][rank][0]
    else:
        lens = layout["lengths"]
        n = sum(lens)
        per_rank = [list(range(sum(lens[:r]), sum(lens[: r + 1]))) for r in range(world)]
    q = torch.randn(2, n, h, d, generator=g).to(dtype)
    k = torch.randn(2, n, hkv, d, generator=g).to(dtype)
    v = torch.randn(2, n, hkv, d, generator=g).to(dtype)
    dout = torch.randn(2, n, h, d, generator=g)
    mine = torch.tensor(per_rank[rank], dtype=torch.long)
    if "seqlen" in layout:  # shard() is the documented way; check it picks the same rows
        assert torch.equal(fd.shard(q, world, rank, layout["sharding"]), q[:, mine])
    ql, kl, vl = (x[:, mine].clone().requires_grad_(True) for x in (q, k, v))
    out, lse = fd.ring_attention(ql, kl, vl, return_lse=True, sharding=layout["sharding"], first_chunk=first, **opts)
    (out * dout[:, mine].to(out.dtype)).sum().backward()
    ref, ref_lse = attention_ref(q, k, v, **opts)
    _, g64 = grads(lambda *x: attention_ref(*x, **opts)[0], (q, k, v), dout)
    if dtype == torch.float32:
        bounds = (1e-5, 1e-4, 1e-4)
        checks = [(out, ref[:, mine], bounds[0]), (lse, ref_lse[:, :, mine], bounds[1])]
    else:
        naive, naive_lse = attention_ref(q, k, v, dtype=dtype, **opts)
        _, gn = grads(lambda *x: attention_ref(*x, dtype=dtype, **opts)[0], (q, k, v), dout)
        checks = [(out, ref[:, mine], 2 * max_err(naive[:, mine], ref[:, mine]) + 1e-5),
                  (lse, ref_lse[:, :, mine], 2 * max_err(naive_lse[:, :, mine], ref_lse[:, :, mine]) + 1e-4)]
    for i, (got, x) in enumerate(zip((ql.grad, kl.grad, vl.grad), g64)):
        bound = 1e-4 if dtype == torch.float32 else 3 * max_err(gn[i][:, mine], x[:, mine]) + 1e-4
        checks.append((got, x[:, mine], bound))
    for j, (got, want, bound) in enumerate(checks):
        err = max_err(got, want)
        assert err <= bound, f"{name} rank {rank}: check {j} error {err} > {bound}"


def _run_varlen(rank, world, seed):
    """Three sequences, each split contiguously across the ranks (uneven pieces, some empty)."""
    from flashkv.torch import distributed as fd

    g = torch.Generator().manual_seed(seed + 7)
    seq_lens = [11, 3 * world + 1, 2]
    h, hkv, d = 4, 2, 16
    pieces = [[(n * r) // world for r in range(world + 1)] for n in seq_lens]  # piece r of seq s: [p[r], p[r+1])
    starts = [sum(seq_lens[:s]) for s in range(len(seq_lens))]
    n = sum(seq_lens)
    q, k, v = torch.randn(n, h, d, generator=g), torch.randn(n, hkv, d, generator=g), torch.randn(n, hkv, d, generator=g)
    dout = torch.randn(n, h, d, generator=g)
    rows = [starts[s] + i for s in range(len(seq_lens)) for i in range(pieces[s][rank], pieces[s][rank + 1])]
    mine = torch.tensor(rows, dtype=torch.long)
    cu = torch.tensor([0] + list(torch.tensor([pieces[s][rank + 1] - pieces[s][rank] for s in range(len(seq_lens))])
                                 .cumsum(0)), dtype=torch.int32)
    ql, kl, vl = (x[mine].clone().requires_grad_(True) for x in (q, k, v))
    out, lse = fd.ring_attention(ql, kl, vl, causal=True, return_lse=True, sharding="contiguous", cu_seqlens=cu,
                                 max_seqlen=max(seq_lens))
    (out * dout[mine]).sum().backward()
    cu_all = torch.tensor([0] + seq_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    ref, ref_lse = varlen_ref(q, k, v, cu_all, cu_all, causal=True)
    _, g64 = grads(lambda *x: varlen_ref(*x, cu_all, cu_all, causal=True)[0], (q, k, v), dout)
    assert max_err(out, ref[mine]) <= 1e-5 and max_err(lse, ref_lse[:, mine]) <= 1e-4
    for got, want in zip((ql.grad, kl.grad, vl.grad), g64):
        assert max_err(got, want[mine]) <= 1e-4, ("varlen grad", max_err(got, want[mine]))


def _worker(rank, world, init_file, seed, result_dir):
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    status = "ok"
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        for case in _cases(world):
            _run_case(rank, world, seed, case)
        _run_varlen(rank, world, seed)
        dist.barrier()
    except Exception:  # noqa: BLE001 - reported to the parent
        status = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write(status)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_attention_equals_single_process_reference(tmp_path, rng, world):
    seed = int(rng.integers(1 << 31))
    mp.spawn(_worker, args=(world, str(tmp_path / "init"), seed, str(tmp_path)), nprocs=world, join=True)
    for r in range(world):
        status = (tmp_path / f"rank{r}.txt").read_text()
        assert status == "ok", f"rank {r}:\n{status}"


def test_world_size_one_is_flashkv_attention(tmp_path, rng):
    """One process: the ring degenerates to one local call (bit-identical to flashkv.torch.attention)."""
    import flashkv.torch as ft
    from flashkv.torch import distributed as fd

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init1'}", rank=0, world_size=1)
    try:
        q = torch.from_numpy(rng.standard_normal((1, 19, 2, 16)).astype("float32")).requires_grad_(True)
        out, lse = fd.ring_attention(q, q, q, causal=True, return_lse=True)
        ref, ref_lse = ft.attention(q, q, q, causal=True, return_lse=True)
        assert torch.equal(out, ref) and torch.equal(lse, ref_lse)
        with pytest.raises(ValueError, match="'sharding'"):
            fd.ring_attention(q, q, q, sharding="striped")
    finally:
        dist.destroy_process_group()
