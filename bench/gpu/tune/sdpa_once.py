"""One SDPA-flash (FlashAttention-2) forward + backward on the FA3-paper shape, for ncu profiling next to ours."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

d, s, causal = int(sys.argv[1]), int(sys.argv[2]), bool(int(sys.argv[3]))
b, h = 16384 // s, 2048 // d
q, k, v = (torch.randn(b, h, s, d, dtype=torch.bfloat16, device="cuda", requires_grad=True) for _ in range(3))
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        o.backward(torch.randn_like(o))
torch.cuda.synchronize()
