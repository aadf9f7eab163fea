"""GPU check of VLLMEngine (one CUDA GPU, a few minutes): bf16, memory budget, weight sync, logprob match.

    pip install -e ".[gpu,dev]" && python scripts/gpu_check_vllm.py [--out DIR]

What it checks, each printed as PASS/FAIL (exit status 1 if any fails):
  1. start: a bf16 policy on the GPU; VLLMEngine(gpu_memory_utilization=0.3) with CUDA graphs (the GPU
     default) starts in-process; vLLM's dtype is bf16 and the memory it reserved stays within the budget.
  2. logprobs: sampled-token logprobs vs a transformers forward of the same tokens (bf16 kernels differ,
     so the bound is loose: mean |d| < 0.02, max |d| < 0.2).
  3. sync: after update_weights from perturbed weights (CUDA graphs stay captured, weights are copied in
     place), vLLM's logprobs match the *new* weights and are far from the old ones; sync seconds vs a
     state_dict() copy.
  4. fp32 engine: greedy completions equal HFEngine's and logprobs match to 1e-3 after a sync.
  5. throughput: VLLMEngine vs HFEngine tokens/s on the bench model (64 prompts x 8 x 64, bf16).
Results also go to DIR/gpu_check_vllm.json when --out is given.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import types

RESULTS: dict[str, object] = {}
FAILED: list[str] = []
T0 = time.perf_counter()


def check(name: str, ok: bool, detail: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {'PASS' if ok else 'FAIL'} {name}: {detail}", flush=True)
    RESULTS[name] = {"ok": bool(ok), "detail": detail}
    if not ok:
        FAILED.append(name)


def perturb(model, seed: int, scale: float = 0.3) -> None:
    import torch

    g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(
                torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32).to(p.dtype) * scale
            )


def logprob_errors(model, prompts, groups, temperature: float) -> list[float]:
    """|vLLM logprob - transformers logprob| for every sampled token (float32 softmax of the model's logits)."""
    import torch

    errs = []
    dev = next(model.parameters()).device
    with torch.no_grad():
        for p, group in zip(prompts, groups):
            for c in group:
                ids = torch.tensor([p + c.token_ids], device=dev)
                logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].float()  # (C, V)
                ref = (
                    torch.log_softmax(logits / temperature, -1)
                    .gather(-1, torch.tensor(c.token_ids, device=dev)[:, None])
                    .squeeze(-1)
                )  # (C,)
                errs += (torch.tensor(c.logprobs, device=dev) - ref).abs().tolist()
    return errs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    from lit_rl.models.loading import load_causal_lm, load_tokenizer, merged_state_items
    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.engine import HFEngine, SamplingConfig
    from lit_rl.rollout.vllm import VLLMEngine

    _require_cuda()
    root = tempfile.mkdtemp(prefix="gpu_check_vllm_")
    path = str(
        build_tiny_model(f"{root}/model", layers=8, hidden=512, heads=8, intermediate=768, tokenizer="char")
    )
    tok = load_tokenizer(path)
    prompts = [tok.encode(("# " * (i % 5)) + f"{i % 97}+{(7 * i) % 89}=") for i in range(64)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=64)
    total = torch.cuda.mem_get_info()[1]

    # 1. bf16 engine with CUDA graphs, memory budget
    model = load_causal_lm(path, dtype="bfloat16").cuda()
    module = types.SimpleNamespace(model=model, tokenizer=tok, model_path=path)
    reserved0 = torch.cuda.memory_reserved()
    free0 = torch.cuda.mem_get_info()[0]
    eng = VLLMEngine(gpu_memory_utilization=0.3, max_model_len=256)
    t = time.perf_counter()
    eng.bind(module)
    start_s = time.perf_counter() - t
    used = free0 - torch.cuda.mem_get_info()[0]
    dt = eng.llm.llm_engine.model_config.dtype
    check(
        "start_bf16",
        dt == torch.bfloat16 and used <= 0.3 * total * 1.05,
        f"{start_s:.1f}s, dtype {dt}, vLLM took {used / 2**30:.2f} GiB of {total / 2**30:.0f} GiB "
        f"(budget 0.3 = {0.3 * total / 2**30:.1f} GiB), torch reserved +"
        f"{(torch.cuda.memory_reserved() - reserved0) / 2**30:.2f} GiB, "
        f"enforce_eager={getattr(eng.llm.llm_engine.model_config, 'enforce_eager', '?')}",
    )

    # 2. logprobs vs transformers (bf16)
    groups = eng.generate(prompts[:16], 4, sampling)
    errs = logprob_errors(model, prompts[:16], groups, 1.0)
    check(
        "logprobs_bf16",
        statistics.mean(errs) < 0.02 and max(errs) < 0.2,
        f"mean |d| {statistics.mean(errs):.4f}, max |d| {max(errs):.4f} over {len(errs)} tokens",
    )

    # 3. weight sync under CUDA graphs
    old = copy.deepcopy(model)
    perturb(model, seed=1)
    copy_s = statistics.median(_timed(lambda: {k: v.clone() for k, v in model.state_dict().items()}, 3))
    sync_s = statistics.median(_timed(lambda: eng.update_weights(merged_state_items(model)), 3))
    groups = eng.generate(prompts[:16], 4, sampling)
    new_err, old_err = (
        logprob_errors(model, prompts[:16], groups, 1.0),
        logprob_errors(old, prompts[:16], groups, 1.0),
    )
    check(
        "sync_bf16",
        statistics.mean(new_err) < 0.02 and statistics.mean(old_err) > 10 * statistics.mean(new_err),
        f"mean |d| vs new weights {statistics.mean(new_err):.4f}, vs old weights {statistics.mean(old_err):.4f}; "
        f"sync {sync_s:.4f}s vs state_dict copy {copy_s:.4f}s ({sync_s / copy_s:.1f}x), "
        f"policy_version {eng.policy_version}",
    )

    # 5. throughput (bf16, same engine) before switching to fp32
    hf = HFEngine()
    hf.bind(module)
    hf_rate = _rate(hf, prompts, sampling)
    vl_rate = _rate(eng, prompts, sampling)
    check(
        "throughput_bf16",
        vl_rate >= 2 * hf_rate,
        f"vLLM {vl_rate:.0f} tok/s vs HF {hf_rate:.0f} tok/s ({vl_rate / hf_rate:.1f}x, target >= 2x)",
    )
    eng.close()
    del old, hf
    torch.cuda.empty_cache()

    # 4. fp32 engine: greedy parity with HFEngine and tight logprobs after a sync
    model32 = load_causal_lm(path, dtype="float32").cuda()
    module32 = types.SimpleNamespace(model=model32, tokenizer=tok, model_path=path)
    eng32 = VLLMEngine(gpu_memory_utilization=0.3, max_model_len=256, enforce_eager=True)
    eng32.bind(module32)
    perturb(model32, seed=2)
    eng32.update_weights(merged_state_items(model32))
    greedy = SamplingConfig(temperature=0.0, max_new_tokens=16)
    got = eng32.generate(prompts[:16], 1, greedy)
    hf32 = HFEngine()
    hf32.bind(module32)
    want = hf32.generate(prompts[:16], 1, greedy)
    same = sum(g[0].token_ids == w[0].token_ids for g, w in zip(got, want))
    errs = logprob_errors(model32, prompts[:16], eng32.generate(prompts[:16], 2, sampling), 1.0)
    check(
        "fp32_sync_parity",
        same >= 15 and max(errs) < 1e-3,
        f"greedy equal on {same}/16 prompts (TF32/kernel ties may flip one), max |d| logprob {max(errs):.2e}",
    )
    eng32.close()

    RESULTS["wall_s"] = time.perf_counter() - T0
    if a.out:
        with open(f"{a.out}/gpu_check_vllm.json", "w") as f:
            json.dump(RESULTS, f, indent=2)
    print(f"{'ALL PASS' if not FAILED else 'FAILED: ' + ', '.join(FAILED)} in {RESULTS['wall_s']:.0f}s")
    raise SystemExit(1 if FAILED else 0)


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "no CUDA GPU: this script checks the GPU path (the CPU path is tests/test_vllm_engine.py)"
        )


def _timed(fn, repeats: int) -> list[float]:
    import torch

    out = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t)
    return out


def _rate(engine, prompts, sampling) -> float:
    engine.generate(prompts[:2], 2, sampling)  # warm-up
    t = time.perf_counter()
    groups = engine.generate(prompts, 8, sampling)
    return sum(len(c.token_ids) for g in groups for c in g) / (time.perf_counter() - t)


if __name__ == "__main__":
    main()
