"""ring_attention over NCCL on 2 GPUs (the 2xH200 machine): bf16 out/lse/gradients of each rank's shard vs the float64
reference on the whole sequence, error <= 2x (forward) / 3x (backward) the naive bf16 computation's; causal zigzag and
non-causal contiguous, GQA, uneven zigzag chunks. NCCL_NVLS_ENABLE=0. Skips with fewer than 2 CUDA devices.
  NCCL_NVLS_ENABLE=0 PYTHONPATH=$PWD/python FLASHKV_LIBRARY=$PWD/build/cuda/devlibs/libflashkv.so \\
    LD_LIBRARY_PATH=$PWD/build/cuda/devlibs python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_torch_distributed_cuda.py
"""
import os
import traceback

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if torch.cuda.device_count() < 2:
    pytest.skip(f"needs 2 CUDA devices, found {torch.cuda.device_count()}", allow_module_level=True)
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from torch_reference import attention_ref, grads, max_err  # noqa: E402

CASES = [  # (seqlen, heads, kv heads, head_dim, causal, sharding, first_chunk per rank or None)
    (4096 + 3, 8, 2, 128, True, "zigzag", None),
    (3000, 4, 4, 64, False, "contiguous", None),
    (2500, 4, 1, 128, True, "zigzag", [300, 900]),
]


def _worker(rank, world, init_file, seed, result_dir):
    status = "ok"
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world)
        from flashkv.torch import distributed as fd

        for s, h, hkv, d, causal, sharding, first in CASES:
            g = torch.Generator().manual_seed(seed)
            q, k, v = (torch.randn(1, s, n, d, generator=g).cuda().to(torch.bfloat16) for n in (h, hkv, hkv))
            dout = torch.randn(1, s, h, d, generator=g).cuda().to(torch.bfloat16)
            if first is None:
                rows = [i for a, b in fd.shard_bounds(s, world, rank, sharding) for i in range(a, b)]
                fc = None
            else:  # zigzag chunks: rank r holds chunk r (first[r] rows) and chunk 2W-1-r (the rest of its half)
                lens = [first[0], first[1], s // 2 - first[1], s - s // 2 - first[0]]
                starts = [sum(lens[:i]) for i in range(4)]
                a, b = rank, 3 - rank
                rows = list(range(starts[a], starts[a] + lens[a])) + list(range(starts[b], starts[b] + lens[b]))
                fc = first[rank]
            idx = torch.tensor(rows, device="cuda")
            ql, kl, vl = (x[:, idx].clone().requires_grad_(True) for x in (q, k, v))
            out, lse = fd.ring_attention(ql, kl, vl, causal=causal, sharding=sharding, first_chunk=fc,
                                         return_lse=True)
            (out * dout[:, idx]).sum().backward()
            ref, ref_lse = attention_ref(q, k, v, causal=causal)
            naive, naive_lse = attention_ref(q, k, v, causal=causal, dtype=torch.bfloat16)
            assert max_err(out, ref[:, idx]) <= 2 * max_err(naive[:, idx], ref[:, idx]) + 1e-5
            assert max_err(lse, ref_lse[:, :, idx]) <= 2 * max_err(naive_lse[:, :, idx].float(), ref_lse[:, :, idx]) + 1e-4
            _, g64 = grads(lambda *x: attention_ref(*x, causal=causal)[0], (q, k, v), dout)
            _, gn = grads(lambda *x: attention_ref(*x, causal=causal, dtype=torch.bfloat16)[0], (q, k, v), dout)
            for got, r64, rn in zip((ql.grad, kl.grad, vl.grad), g64, gn):
                assert max_err(got, r64[:, idx]) <= 3 * max_err(rn[:, idx], r64[:, idx]) + 1e-4
        dist.barrier()
    except Exception:  # noqa: BLE001
        status = traceback.format_exc()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
        f.write(status)


def test_ring_attention_on_two_gpus(tmp_path, rng):
    seed = int(rng.integers(1 << 31))
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), seed, str(tmp_path)), nprocs=2, join=True)
    for r in range(2):
        status = (tmp_path / f"rank{r}.txt").read_text()
        assert status == "ok", f"rank {r}:\n{status}"
