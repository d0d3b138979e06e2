"""Timing shared by the GPU benchmark scripts (engine_bench.py, ring_bench.py, torch_bench.py): per-call seconds of a
callable, by CUDA events on the GPU or the wall clock on the CPU (their --smoke runs)."""
import time


def sample_seconds(fn, reps, warmup=1, device="cuda"):
    """Seconds of each of `reps` timed calls of fn(), after `warmup` untimed ones (a list, in call order; the caller
    takes the median). device "cuda": a pair of CUDA events around each call, synchronized after it (the device time
    of the call: work still queued from before is not counted); anything else: time.perf_counter around each call."""
    for _ in range(warmup):
        fn()
    ts = []
    if device != "cuda":
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return ts
    import torch

    torch.cuda.synchronize()
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return ts
