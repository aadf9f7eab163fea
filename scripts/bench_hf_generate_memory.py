"""Peak memory of ``HFEngine.generate`` at a Qwen-sized vocabulary (V = 151,936): the old path (``output_logits``
stacked into one (N, C, V) tensor, then its log-softmax) against the current one (one final logits processor
holding an (N, V) log-softmax per step, ``lit_rl.rollout.engine._ProcessedSampler``).

Each variant runs in a fresh worker process (``--worker``) so one's allocations cannot hide the other's; the
worker samples its resident set size every 2 ms during ``generate`` and reports the peak above the level just
before the call. The model is a 1-layer Qwen2 (hidden 64) with V = 151,936, so the vocabulary dominates.

    python scripts/bench_hf_generate_memory.py [--rows 8] [--tokens 128] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time

V = 151_936


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _OldEngine:
    """The generation path before the logits processor, kept here only for this comparison."""

    @staticmethod
    def patch(engine) -> None:
        import torch
        from transformers import GenerationConfig

        from lit_rl.rollout.engine import Completion

        def _generate(rows, sp):
            tok, model = engine.tokenizer, engine.model
            P = max(len(r) for r in rows)
            ids = torch.full((len(rows), P), tok.pad_token_id, dtype=torch.long)
            att = torch.zeros((len(rows), P), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, P - len(r) :] = torch.tensor(r)
                att[i, P - len(r) :] = 1
            cfg = GenerationConfig(
                do_sample=True,
                max_new_tokens=sp.max_new_tokens,
                min_length=0,
                temperature=sp.temperature,
                top_p=1.0,
                top_k=0,
                repetition_penalty=1.0,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
                return_dict_in_generate=True,
                output_logits=True,
            )
            out = model.generate(input_ids=ids, attention_mask=att, generation_config=cfg)
            new = out.sequences[:, P:]
            logits = torch.stack(out.logits, dim=1).float()  # (N, C, V)
            lp = torch.log_softmax(logits / sp.logprob_temperature, -1).gather(-1, new[..., None])[..., 0]
            return [Completion(new[i].tolist(), lp[i].tolist(), "length") for i in range(new.shape[0])]

        engine._generate = _generate


def worker(variant: str, rows: int, tokens: int, model_dir: str) -> dict:
    import torch

    from lit_rl.models.loading import load_causal_lm, load_tokenizer
    from lit_rl.rollout.engine import HFEngine, SamplingConfig

    torch.set_num_threads(1)
    module = type("M", (), {})()
    module.model, module.tokenizer = load_causal_lm(model_dir), load_tokenizer(model_dir)
    engine = HFEngine(share_prefill=False)
    engine.bind(module)
    if variant == "old":
        _OldEngine.patch(engine)
    prompt = module.tokenizer("the cat sat on the mat", add_special_tokens=False)["input_ids"]
    sp = SamplingConfig(temperature=1.0, max_new_tokens=tokens)
    engine.generate([prompt], rows, SamplingConfig(temperature=1.0, max_new_tokens=2))  # warm-up
    base, peak, stop = _rss(), [0], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.process_time()  # CPU seconds: wall time on a shared machine mostly measures the queue
    out = engine.generate([prompt], rows, sp)[0]
    cpu = time.process_time() - t0
    stop.set()
    t.join()
    peak[0] = max(peak[0], _rss())
    return {
        "variant": variant,
        "peak_mib": (peak[0] - base) / 2**20,
        "cpu_s": cpu,
        "tokens": sum(len(c.token_ids) for c in out),
    }


def build(model_dir: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lit_rl.models.tiny import build_tiny_model

    build_tiny_model(model_dir, layers=1, hidden=64, heads=2, tokenizer="char", overwrite=True)
    cfg = Qwen2Config.from_pretrained(model_dir)
    cfg.vocab_size = V  # the char tokenizer's ids are a prefix of this vocabulary
    Qwen2ForCausalLM(cfg).save_pretrained(model_dir)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--worker", choices=["old", "new"])
    ap.add_argument("--model-dir", default="/tmp/lit_rl_bench_v151936")
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.rows, a.tokens, a.model_dir)))
        return
    build(a.model_dir)
    res: dict[str, dict] = {}
    for _ in range(a.repeats):  # alternating; the minimum of each column
        for v in ("old", "new"):
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                v,
                "--rows",
                str(a.rows),
                "--tokens",
                str(a.tokens),
                "--model-dir",
                a.model_dir,
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=os.environ)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            prev = res.setdefault(v, r)
            prev["peak_mib"], prev["cpu_s"] = (
                min(prev["peak_mib"], r["peak_mib"]),
                min(prev["cpu_s"], r["cpu_s"]),
            )
    nctv = a.rows * a.tokens * V * 4 / 2**20
    print(
        f"HFEngine.generate, V={V}, {a.rows} rows x {a.tokens} new tokens (one fp32 (N, C, V) = {nctv:.0f} MiB)"
    )
    print(f"min over {a.repeats} alternating runs, one torch thread")
    print("| path | peak RSS above start (MiB) | CPU (s) | tokens |")
    print("|---|---:|---:|---:|")
    for v, name in (("old", "old: output_logits stacked"), ("new", "new: final logits processor")):
        r = res[v]
        print(f"| {name} | {r['peak_mib']:.0f} | {r['cpu_s']:.2f} | {r['tokens']} |")
    print(
        f"| new / old | {res['new']['peak_mib'] / max(res['old']['peak_mib'], 1e-9):.3f} | "
        f"{res['new']['cpu_s'] / res['old']['cpu_s']:.2f} | |"
    )


if __name__ == "__main__":
    main()
