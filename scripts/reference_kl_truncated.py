"""Issue 53's measurement through ``lit-rl fit``: the reference KL the run logs under truncated sampling, against
the exact full-vocabulary KL at the same positions.

The quickstart recipe and its tiny model as the policy (built here with the quickstart's ``tiny_if_missing``
arguments), a perturbed copy saved beside it as ``ReferenceKL.path`` (every weight + ``--noise``·N(0, 1)), one
RL iteration of ``--rows`` one-token rows, ``ReferenceKL(where="reward")`` with each ``--kinds`` entry and each
sampler (top_k 2, top_p 0.4, plain). A probe callback after it recomputes, in float64 from materialised logits
and independently of ``ReferenceKL``'s code, KL(π‖π_ref) over the whole vocabulary at every row's completion
position (π the policy at the rollout), and the standard error of a sampled per-row estimate (k1's spread / √N).
Prints one line per run: ``kl/mean`` as logged, the exact KL, and the standard error. A few minutes on 2 cores.

    python scripts/reference_kl_truncated.py [--out runs/reference_kl_truncated] [--rows 2048]
        [--kinds k1 k3 auto] [--samplers "top_k 2" "top_p 0.4" plain] [--noise 0.2]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import warnings
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[1]
TINY = {"layers": 2, "hidden": 64, "heads": 2, "tokenizer": "char", "seed": 0}  # configs/quickstart.yaml's
SAMPLERS = {
    "top_k 2": ["--rollout.sampling.top_k", "2"],
    "top_p 0.4": ["--rollout.sampling.top_p", "0.4"],
    "plain": [],
}


class ExactKLProbe(L.Callback):
    """Placed after ``ReferenceKL``: on the first Experience, the float64 KL(π‖π_ref) at each row's completion
    positions from materialised logits of a float64 copy of both models, one row at a time without padding
    (written to ``out`` as JSON)."""

    def __init__(self, out: str, ref: str):
        self.out, self.ref = out, ref

    @torch.no_grad()
    def on_experience(self, trainer, module, exp) -> None:
        if Path(self.out).exists():
            return
        from lit_rl.models.loading import load_causal_lm

        policy = copy.deepcopy(module.model).double().eval()
        ref = load_causal_lm(self.ref, "float32").double().eval()
        P, t = exp.prompt_len, module.temperature
        kl, k1, cache = [], [], {}
        for i in range(exp.batch_size):
            if not bool(exp.valid[i]):
                continue
            ids = exp.input_ids[i][exp.attention_mask[i].bool()]  # real tokens: prompt + completion
            n_prompt = int(exp.attention_mask[i, :P].sum())
            key = tuple(ids.tolist())
            if key not in cache:
                lp = torch.log_softmax(policy(input_ids=ids[None]).logits[0].double() / t, -1)
                lq = torch.log_softmax(ref(input_ids=ids[None]).logits[0].double() / t, -1)
                cache[key] = (lp, lq)
            lp, lq = cache[key]
            for c in exp.loss_mask[i].nonzero()[:, 0].tolist():
                pos = n_prompt + c - 1  # the logits that predict completion token c
                y = int(ids[n_prompt + c])
                kl.append(float((lp[pos].exp() * (lp[pos] - lq[pos])).sum()))
                k1.append(float(lp[pos, y] - lq[pos, y]))
        n = len(kl)
        mean_k1 = sum(k1) / n
        se = math.sqrt(sum((x - mean_k1) ** 2 for x in k1) / (n - 1) / n)
        Path(self.out).write_text(json.dumps({"exact_kl": sum(kl) / n, "tokens": n, "se_sampled": se}))


def _models(out: Path, noise: float) -> tuple[Path, Path]:
    from lit_rl.models.tiny import build_tiny_model

    policy = out / "policy"
    if not policy.exists():
        build_tiny_model(policy, arch="qwen2", **TINY)
    ref = out / "reference"
    if not ref.exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(noise * torch.randn(p.shape, generator=g))
        model.save_pretrained(ref)
        AutoTokenizer.from_pretrained(policy).save_pretrained(ref)
    return policy, ref


def run(out: Path, kind: str, sampler: str, rows: int, policy: Path, ref: Path) -> dict:
    from lit_rl.cli import main
    from lit_rl.runs import log_rows

    name = f"{kind}_{sampler.replace(' ', '')}"
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    probe = run_dir / "exact.json"
    (run_dir / "kl.yaml").write_text(
        "trainer:\n  callbacks+:\n"
        "    - class_path: lit_rl.callbacks.reference_kl.ReferenceKL\n"
        f"      init_args: {{path: {ref}, kind: {kind}, where: reward, beta: 0.04}}\n"
        "    - class_path: __main__.ExactKLProbe\n"
        f"      init_args: {{out: {probe}, ref: {ref}}}\n"
    )
    group = 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the explicit-estimator warning is the point of the 'before' rows
        main(
            [
                "fit",
                "-c",
                str(ROOT / "configs/quickstart.yaml"),
                "-c",
                str(run_dir / "kl.yaml"),
                "--model.init_args.model",
                str(policy),
                "--trainer.default_root_dir",
                str(run_dir),
                "--trainer.enable_progress_bar",
                "false",
                "--trainer.max_steps",
                "1",
                "--data.init_args.batch_size",
                str(rows // group),
                "--rollout.group_size",
                str(group),
                *SAMPLERS[sampler],
            ]
        )
    logged = [r["kl/mean"] for r in log_rows(run_dir / "logs/metrics.csv") if "kl/mean" in r]
    return {"kind": kind, "sampler": sampler, "kl/mean": logged[0], **json.loads(probe.read_text())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("runs/reference_kl_truncated"))
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--kinds", nargs="+", default=["k1", "k3", "auto"])
    ap.add_argument("--samplers", nargs="+", default=list(SAMPLERS), choices=list(SAMPLERS))
    ap.add_argument(
        "--noise", type=float, default=0.2, help="std of the Gaussian added to every reference weight"
    )
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    policy, ref = _models(a.out, a.noise)
    results = [run(a.out, k, s, a.rows, policy, ref) for s in a.samplers for k in a.kinds]
    for r in results:
        print(
            f"{r['sampler']:10s} kind={r['kind']:5s} kl/mean {r['kl/mean']:.4f}  exact KL {r['exact_kl']:.4f}"
            f"  (tokens {r['tokens']}, standard error of a sampled estimate {r['se_sampled']:.4f})"
        )
    (a.out / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
