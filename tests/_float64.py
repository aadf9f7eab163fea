"""Float64 all the way through transformers' RMSNorm, for the exact (1e-9) path comparisons.

transformers' ``Qwen2RMSNorm`` computes in float32 even for a float64 model. Paths that sum a prompt's gradients
before it (the shared-prompt pass, padding-free packing: one prompt, G completions) or after it (the padded
forward) then differ by float32 rounding (~1e-7). With the norm in the input dtype they agree to ~1e-15.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def rmsnorm_in_input_dtype(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


@contextmanager
def float64_rmsnorm():
    """Qwen2's RMSNorm computes in the input dtype inside the block (restored after)."""
    from transformers.models.qwen2 import modeling_qwen2

    saved = modeling_qwen2.Qwen2RMSNorm.forward
    modeling_qwen2.Qwen2RMSNorm.forward = rmsnorm_in_input_dtype
    try:
        yield
    finally:
        modeling_qwen2.Qwen2RMSNorm.forward = saved
