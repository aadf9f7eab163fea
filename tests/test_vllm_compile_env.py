"""vLLM on torch's ``default`` CPU kernels: its torch.compile'd sampler functions fail to build there (torch 2.13
inductor C++: "'x' was not declared in this scope"), so the first vLLM generation with log-probs raised under
``ATEN_CPU_CAPABILITY=default``. ``compile_env`` turns torch.compile off for vLLM exactly then; measured:
tests/test_vllm_engine.py::test_sampled_logprobs_match_transformers fails under ``default`` without it and passes
with it, and the vLLM quickstart learns there (docs/learning_tests.md)."""

import json
import os
import subprocess
import sys

import pytest
import torch

CODE = (
    "import json, torch; from lit_rl.rollout._vllm_common import compile_env; "
    "print(json.dumps([torch.backends.cpu.get_cpu_capability(), compile_env()]))"
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the rule is for CPU machines")
@pytest.mark.parametrize("cap, want", [("default", {"TORCH_COMPILE_DISABLE": "1"}), ("avx2", {})])
def test_compile_is_off_only_on_the_default_kernels(cap, want):
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
    out = subprocess.run(
        [sys.executable, "-c", CODE], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    got_cap, got = json.loads(out.stdout.strip().splitlines()[-1])
    if got_cap != cap.upper():  # a CPU without AVX2 runs the default kernels whatever is asked
        pytest.skip(f"this CPU cannot run the {cap} kernels")
    assert got == want
