"""What the sampler's distribution costs the trainer (``core.processed``), side by side in one process.

For each processing setting: the LM-head pass every training micro-batch runs anyway (``linear_logprobs``: log-probs
and entropy, forward + backward) against the one pass that gives the same plus π^s for the ratios
(``core.fused_sampler.linear_logprobs_and_sampler``, forward + backward, a loss through all three outputs), at
SmolLM2-135M's head size (H 576, V 49152) on N completion positions, with logits as peaked as a pretrained model's
(``--spread``: the std of Gaussian logits), or — closer to a user's run — with ``--model DIR``, the real head and
real hidden states of a checkpoint reading the README's text (e.g. ``lit-rl models smollm2``'s directory: a
pretrained model's next-token distributions are peaked, so top-p's candidates usually cover the nucleus). Prints
the ratio of the two; run it on a quiet machine (ratios only: this machine is noisy).

    python scripts/bench_processed.py [--positions 512] [--spread 3.5] [--model DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lit_rl.core.fused_logprobs import linear_logprobs
from lit_rl.core.fused_sampler import linear_logprobs_and_sampler
from lit_rl.core.processed import History, LogitProcessing

SETTINGS = {
    "top_k 20": LogitProcessing(0.9, top_k=20),
    "top_p 0.9": LogitProcessing(0.9, top_p=0.9),
    "top_p 0.95 + top_k 50": LogitProcessing(1.0, top_p=0.95, top_k=50),
    "min_p 0.05": LogitProcessing(0.9, min_p=0.05),
    "repetition_penalty 1.2": LogitProcessing(0.9, repetition_penalty=1.2),
}


def _timed(fn, hidden, weight) -> float:
    h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    t0 = time.perf_counter()
    sum(o.sum() for o in fn(h, w)).backward()
    return time.perf_counter() - t0


@torch.no_grad()
def _real(path: str, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden (1, N, H), head weight (V, H), next tokens (1, N)) of a checkpoint reading this repository's README."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = tok(text, return_tensors="pt")["input_ids"][:, : n + 1]
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state[:, :-1]
    return hidden.contiguous(), model.get_output_embeddings().weight.detach().clone(), ids[:, 1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--positions", type=int, default=512)
    ap.add_argument("--spread", type=float, default=3.5)
    ap.add_argument("--model", default=None, help="a checkpoint directory: its head and hidden states")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    if a.model:
        hidden, weight, ids = _real(a.model, a.positions)
        N, H, V = hidden.shape[1], hidden.shape[2], weight.shape[0]
    else:
        N, H, V = a.positions, 576, 49152
        hidden = torch.randn(1, N, H, generator=g) / H**0.5
        weight = torch.randn(V, H, generator=g) * a.spread
        ids = torch.randint(0, V, (1, N), generator=g)
    mask = torch.ones(1, N, dtype=torch.bool)
    prompt = torch.randint(0, V, (1, 64), generator=g)
    hist_ids = torch.cat([prompt, ids], 1)
    history = History.of(hist_ids, torch.ones_like(hist_ids), 64)
    source = f"checkpoint {a.model}" if a.model else f"Gaussian logits, std {a.spread}"
    print(f"N={N} positions, H={H}, V={V}, {source}; best of {a.repeat}, forward + backward")
    print(f"{'setting':26s} {'log-probs s':>12s} {'+ π^s s':>12s} {'ratio':>7s}")
    for name, pr in SETTINGS.items():
        hist = history if pr.repetition_penalty != 1 else None

        def base_pass(h, w, pr=pr):
            return linear_logprobs(h, w, ids, temperature=pr.logprob_temperature, mask=mask)

        def with_sampler(h, w, pr=pr, hist=hist):
            return linear_logprobs_and_sampler(h, w, ids, pr, mask, history=hist)

        base = min(_timed(base_pass, hidden, weight) for _ in range(a.repeat))
        extra = min(_timed(with_sampler, hidden, weight) for _ in range(a.repeat))
        print(f"{name:26s} {base:12.3f} {extra:12.3f} {extra / base:7.2f}")


if __name__ == "__main__":
    main()
