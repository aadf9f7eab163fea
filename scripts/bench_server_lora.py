"""LoRA weight sync into a vLLM server: the adapter alone (``lora_sync=adapter``) vs the merged model
(``lora_sync=merged``), side by side in one run; and what serving through the adapter costs in generation.

    python scripts/bench_server_lora.py            # 8 layers x hidden 512 (~18M params), LoRA r=16 all-linear
    python scripts/bench_server_lora.py --quick    # 2 layers x hidden 128

One launched server per path, one after the other (never two at once), each with ``--threads`` CPU threads.
Sync seconds are ``VLLMServerEngine.update_weights(engine.sync_items(model))``, what RolloutCallback runs
after an optimizer step: for ``merged`` that is the on-the-fly merge (a copy of the model with W + BA·s), the
safetensors file in /dev/shm, the server's reload, prefix-cache reset and version check; for ``adapter`` the
adapter's tensors, its PEFT files, the server's load of ``policy-<run>-vN``, the unload of the previous one and
the checks. ``bytes`` is what rank 0 writes per sync. Generation tokens/s: the same prompts and seeds through
each server, best of ``--gen-repeats`` (the merged one serves a plain model, the adapter one applies LoRA at every
linear layer).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import types


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small model and batch (a smoke run)")
    p.add_argument("--rank", type=int, default=16, help="LoRA r (lora_alpha = 2r, all linear layers)")
    p.add_argument("--sync-repeats", type=int, default=5)
    p.add_argument("--gen-repeats", type=int, default=3, help="timed generate calls per path (best counts)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of each server")
    a = p.parse_args(argv)

    import torch

    from lit_rl.models.loading import load_causal_lm, load_tokenizer
    from lit_rl.models.tiny import build_tiny_model
    from lit_rl.rollout.engine import SamplingConfig
    from lit_rl.rollout.server import VLLMServerEngine

    if a.quick:
        size, (n_prompts, n, new_tokens) = (
            {"layers": 2, "hidden": 128, "heads": 4, "intermediate": 512},
            (8, 4, 16),
        )
    else:
        size, (n_prompts, n, new_tokens) = (
            {"layers": 8, "hidden": 512, "heads": 8, "intermediate": 768},
            (16, 4, 32),
        )
    root = tempfile.mkdtemp(prefix="bench_server_lora_")
    path = str(build_tiny_model(f"{root}/model", tokenizer="char", overwrite=True, **size))
    model = load_causal_lm(path, lora={"r": a.rank, "lora_alpha": 2 * a.rank})
    with torch.no_grad():  # a trained-looking adapter (lora_B starts at zero)
        g = torch.Generator().manual_seed(0)
        for name, q in model.named_parameters():
            if "lora_B" in name:
                q.copy_(torch.randn(q.shape, generator=g) * 0.02)
    module = types.SimpleNamespace(model=model, tokenizer=load_tokenizer(path), model_path=path)
    n_base = sum(q.numel() for name, q in model.named_parameters() if "lora_" not in name)
    n_lora = sum(q.numel() for name, q in model.named_parameters() if "lora_" in name)
    prompts = [
        module.tokenizer.encode(("# " * (i % 5)) + f"{i % 97}+{(7 * i) % 89}=") for i in range(n_prompts)
    ]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=new_tokens, seed=0)
    max_len = max(len(q) for q in prompts) + new_tokens + 8

    rows = {}
    for mode in ("merged", "adapter"):
        eng = VLLMServerEngine(
            launch={
                "threads_per_server": a.threads,
                "max_model_len": max_len,
                "max_num_seqs": n_prompts * n,
                "kv_cache_gb": 1,
                "extra_args": ["--max-num-batched-tokens", str(n_prompts * n * max_len)],
            },
            lora_sync=mode,
            request_timeout_s=600,
        )
        try:
            eng.bind(module)
            assert eng.sync_path == mode, eng.sync_path_reason
            eng.generate(prompts[:2], 2, sampling)  # warm-up (and the initial sync)
            syncs = []
            for _ in range(a.sync_repeats):
                t0 = time.perf_counter()
                eng.update_weights(eng.sync_items(model))
                syncs.append(time.perf_counter() - t0)
            rate = 0.0
            for _ in range(a.gen_repeats):  # best of: the machine may be shared
                t0 = time.perf_counter()
                groups = eng.generate(prompts, n, sampling)
                gen_s = time.perf_counter() - t0
                rate = max(rate, sum(len(c.token_ids) for grp in groups for c in grp) / gen_s)
            rows[mode] = (syncs, eng.last_sync_bytes, rate)
        finally:
            eng.close()

    print(
        f"\nmodel: {size['layers']} layers, hidden {size['hidden']}, {n_base / 1e6:.1f}M base params, LoRA r={a.rank} "
        f"({n_lora / 1e6:.2f}M params), float32; 1 server x {a.threads} thread(s); generation {n_prompts} prompts "
        f"x {n} samples x {new_tokens} tokens"
    )
    print(f"{'sync path':<10}{'min s':>9}{'median s':>10}{'bytes':>12}{'gen tok/s':>11}")
    for mode, (syncs, nbytes, rate) in rows.items():
        print(f"{mode:<10}{min(syncs):>9.3f}{statistics.median(syncs):>10.3f}{nbytes:>12d}{rate:>11.0f}")
    (ms, mb, mr), (asy, ab, ar) = rows["merged"], rows["adapter"]
    print(
        f"adapter / merged: sync {min(asy) / min(ms):.2f}x (min), "
        f"{statistics.median(asy) / statistics.median(ms):.2f}x (median); bytes {ab / mb:.3f}x; "
        f"generation tok/s {ar / mr:.2f}x"
    )


if __name__ == "__main__":
    main()
