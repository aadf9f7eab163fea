"""The measuring half of ``scripts/bench_time_to_accuracy.py``, the same in both workers.

``GreedyScorer``: greedy held-out accuracy of a policy's weights, loaded into the scorer's own copy of the
model (``make_scorer`` builds it from a worker's spec). ``Clock``: a worker's training clock, which runs the
scorer between iterations with the clock stopped, prints the ``EVAL`` / ``DONE`` lines the controller reads
and says when a side stops.
"""

from __future__ import annotations

import json
import os
import time


# ------------------------------------------------------------------ the one scorer (both workers)
class GreedyScorer:
    """Greedy held-out accuracy of a policy's weights, loaded into this scorer's own copy of the model."""

    def __init__(
        self,
        model_dir: str,
        task: str,
        task_args: dict,
        heldout: int,
        new_tokens: int,
        threads: int = 1,
        batch: int = 50,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        from lit_rl.data.prompts import render_prompt
        from lit_rl.data.tasks import get_task
        from lit_rl.rewards import LastIntReward

        held = get_task(task, **task_args)[1]
        if heldout > len(held):
            raise SystemExit(f"--heldout {heldout}: the task has {len(held)} held-out prompts; lower it")
        self.prompts, self.batch, self.reward = held[:heldout], batch, LastIntReward()
        self.threads = threads
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.tok.eos_token_id
        # A fresh config: nothing from the checkpoint's generation_config.json (sampling flags) applies.
        self.gen = GenerationConfig(
            do_sample=False, max_new_tokens=new_tokens, eos_token_id=self.tok.eos_token_id, pad_token_id=pad
        )
        self.ids = [render_prompt(p, self.tok) for p in self.prompts]
        self.pad = pad

    def __call__(self, state_dict) -> float:
        import torch

        self.model.load_state_dict(state_dict, strict=True)
        correct, training_threads = 0, torch.get_num_threads()
        # Outside the training clock, so every core may help (the same count on both sides); then training's.
        torch.set_num_threads(self.threads)
        with torch.inference_mode():
            for i in range(0, len(self.ids), self.batch):
                rows = self.ids[i : i + self.batch]
                width = max(map(len, rows))  # left padding: every prompt ends where generation starts
                ids = torch.tensor([[self.pad] * (width - len(r)) + r for r in rows])
                mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
                out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=self.gen)
                for p, row in zip(self.prompts[i : i + self.batch], out[:, width:]):
                    text = self.tok.decode(row, skip_special_tokens=True)
                    correct += self.reward(p, text) >= 1
        torch.set_num_threads(training_threads)
        return correct / len(self.ids)


def make_scorer(spec: dict) -> GreedyScorer:
    return GreedyScorer(
        *(spec[k] for k in ("model", "task", "task_args", "heldout", "new_tokens", "eval_threads"))
    )


class Clock:
    """A worker's training clock: evaluates between iterations with the clock stopped, says when to stop.

    ``start`` before the first iteration (evaluates the initial weights, then starts the clock), ``after`` at
    the end of each iteration. Prints ``EVAL {"train_s", "iteration", "accuracy", "eval_s"}`` per evaluation
    and ``DONE {"iterations", "reason"}`` last (the controller reads them), then calls ``exit``."""

    def __init__(self, spec: dict, scorer, exit=os._exit):
        self.spec, self.scorer, self.exit = spec, scorer, exit
        self.trained = 0.0  # training seconds before the last resume
        self.resumed: float | None = None  # when the clock last started; None before start()
        self.accuracies: list[float] = []
        self.evaluated_at = -1

    def train_s(self) -> float:
        return self.trained + (time.perf_counter() - self.resumed if self.resumed is not None else 0.0)

    def evaluate(self, k: int, weights) -> None:
        now = time.perf_counter()
        self.trained = self.train_s()
        acc = self.scorer(weights())
        eval_s = time.perf_counter() - now
        self.accuracies.append(acc)
        self.evaluated_at = k
        row = {"train_s": self.trained, "iteration": k, "accuracy": acc, "eval_s": eval_s}
        print("EVAL " + json.dumps(row), flush=True)
        self.resumed = time.perf_counter()

    def start(self, weights) -> None:
        self.evaluate(0, weights)

    def after(self, k: int, weights) -> None:
        """Iteration ``k`` has ended: evaluate when due; stop when time, iterations or the target say so."""
        s = self.spec
        out_of_time, last = self.train_s() >= s["max_s"], k >= s["max_iterations"]
        if k % s["eval_every"] == 0 or out_of_time or last:
            self.evaluate(k, weights)
        recent = self.accuracies[-s["hold"] :]
        held = len(recent) == s["hold"] and min(recent) >= s["target"]
        if held or out_of_time or last:
            self.done(k, "target held" if held else "max minutes" if out_of_time else "max iterations")

    def done(self, k: int, reason: str, weights=None) -> None:
        if weights is not None and self.evaluated_at != k:
            self.evaluate(k, weights)
        print("DONE " + json.dumps({"iterations": k, "reason": reason}), flush=True)
        self.exit(0)  # os._exit: skip teardown (vLLM shutdown, final saves); nothing after this is measured
