"""The lecture's credit-assignment comparison on a multi-turn tool environment (issue 54.4).

Four ways to credit the turns of an episode that pays one reward at its end, each trained from the same recipe
(default ``configs/agent_calculator.yaml``: CalculatorEnv with two rounds of calls, so a malformed or wrong first
call can be fixed by a second one before the answer) and differing only in the advantage:

- ``grpo``: trajectory-level GRPO, one group-normalised return broadcast to every action token of the episode;
- ``rtg``: reward-to-go (``advantage: reinforce``, gamma 1, no critic), whitened over the batch's action tokens;
  observation tokens are skipped, so with a terminal-only reward every action token's G_t is the return;
- ``gae_reg``: GAE with V(s_t) from a regression head (``Linear(hidden, 1)``) on the policy's own backbone;
- ``gae_tok``: GAE with V(s_t) = P(yes) / (P(yes) + P(no)) of the policy asked "Is this trajectory good?"
  after each prefix (the yes/no-token head: no new parameters).

GAE runs over action tokens only, so the value after a tool's reply (the first token of the next turn) is what
a turn's last TD error sees. Each (variant, seed) runs in its own process, one after another (one model in
memory at a time); the table gives held-out success (AgentEval, greedy) before training, at the middle and at
the end, training seconds per iteration (evaluations excluded), the value head's parameters and the process's
peak RSS::

    lit-rl models smollm2 runs/smollm2
    python scripts/agent_credit.py --model runs/smollm2 --iterations 6 --seeds 0 1

``--tiny`` shrinks everything for the plumbing test (``tests/agent/test_agent_credit.py``): HFEngine, groups of
2, 4-token turns, single-character yes/no tokens of the tiny model's tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("grpo", "rtg", "gae_reg", "gae_tok")


def variant_model_args(variant: str, tiny: bool, lam: float) -> dict:
    """The ``PolicyModule`` settings (and critic) of a variant, applied over the recipe's."""
    if variant == "grpo":
        return {"advantage": "grpo"}
    if variant == "rtg":
        # whitened like gae (which whitens by default): grpo's advantages are normalised too, so the three
        # token-level variants see steps of the same scale and differ in how the credit is spread
        return {"advantage": "reinforce", "gamma": 1.0, "baseline": True, "whiten_advantages": True}
    if variant in ("gae_reg", "gae_tok"):
        critic: dict = {"head": "regression" if variant == "gae_reg" else "token"}
        if tiny and variant == "gae_tok":  # the char tokenizer's single tokens
            critic.update(yes_token="Y", no_token="N")
        return {
            "advantage": "gae",
            "gamma": 1.0,
            "lam": lam,
            "critic": {"class_path": "lit_rl.learners.CriticModule", "init_args": critic},
        }
    raise ValueError(f"variant {variant!r}; valid values: {', '.join(VARIANTS)}")


def _printed(recipe: str) -> dict:
    from lit_rl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["fit", "-c", recipe, "--print_config"])
    return yaml.safe_load(out.getvalue())


def run_config(a: argparse.Namespace, variant: str, seed: int, run_dir: Path) -> dict:
    """The recipe's printed config with the variant's advantage, the seed and the short budget."""
    cfg = _printed(a.recipe)
    cfg["seed_everything"] = seed
    every = a.eval_every if a.eval_every is not None else max(a.iterations // 2, 1)
    cfg["trainer"].update(
        max_steps=a.iterations,
        val_check_interval=every,
        default_root_dir=str(run_dir),
        enable_progress_bar=False,
    )
    cbs = {c["class_path"].rsplit(".", 1)[-1]: c["init_args"] for c in cfg["trainer"]["callbacks"]}
    ev, roll = cbs["AgentEval"], cbs["AgentRolloutCallback"]
    ev.update(max_prompts=a.eval_prompts, baseline=not a.skip_baseline, history_path="eval_history.json")
    cbs["RolloutInspector"].update(every_n_steps=1, max_rows_per_step=a.inspect_rows)
    m = cfg["model"]["init_args"]
    m["model"] = a.model
    m.update(variant_model_args(variant, a.tiny, a.lam))
    if a.tiny:
        roll["group_size"] = 2
        roll["sampling"]["max_new_tokens"] = 4
        roll["agent"]["init_args"]["max_turns"] = 2
        roll["agent"]["init_args"]["engine"] = None
        roll["agent"]["init_args"]["env_factory"]["init_args"]["demonstrations"] = 0
        cfg["data"]["init_args"]["batch_size"] = 2
    # the recipe's own plots and final model are not part of the comparison
    keep = ("AgentRolloutCallback", "AgentEval", "RolloutInspector")
    cfg["trainer"]["callbacks"] = [
        c for c in cfg["trainer"]["callbacks"] if c["class_path"].rsplit(".", 1)[-1] in keep
    ]
    return cfg


def child(a: argparse.Namespace) -> None:
    """One (variant, seed) run in this process; writes ``result.json`` in its run folder."""
    import resource

    from lit_rl.cli import main

    run_dir = Path(a.out) / f"{a.variant}_s{a.seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = run_dir / "config.yaml"
    cfg_path.write_text(yaml.safe_dump(run_config(a, a.variant, a.seed, run_dir)))
    t0 = time.perf_counter()
    cli = main(["fit", "-c", str(cfg_path)])
    critic = cli.model.critic
    result = {
        "variant": a.variant,
        "seed": a.seed,
        "iterations": cli.model.iteration,
        "wall_s": time.perf_counter() - t0,
        "value_params": 0 if critic is None else sum(p.numel() for p in critic.parameters()),
        "policy_params": sum(p.numel() for p in cli.model.model.parameters()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    (run_dir / "result.json").write_text(json.dumps(result, indent=1))


def turn_advantages(run_dir: Path) -> list[list[float]]:
    """Per-turn advantages (the inspector's ``turns[k].advantage``) of every recorded episode of a run."""
    out = []
    for f in sorted((run_dir / "rollouts").glob("step_*.jsonl")):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row.get("turns"):
                out.append([t["advantage"] for t in row["turns"]])
    return out


def summarise(run_dir: Path, first: dict | None = None) -> dict:
    """The table row of one finished run: success at its evaluations, seconds per iteration, costs. ``first``:
    the row whose step-0 evaluation stands for this run's (``--baseline-once``)."""
    res = json.loads((run_dir / "result.json").read_text())
    hist = json.loads((run_dir / "eval_history.json").read_text())
    acc = {int(h["step"]): h["eval/accuracy"] for h in hist}
    if first is not None and 0 in first["eval_steps"]:
        acc[0] = first["success"][first["eval_steps"].index(0)]
    steps = sorted(acc)
    last = hist[-1]
    per_turn = turn_advantages(run_dir)
    multi = [t for t in per_turn if len(t) >= 2]
    return {
        **res,
        "success": [acc[s] for s in steps],
        "eval_steps": steps,
        # AgentEval's wall_s: training time up to the point, the evaluations excluded
        "train_s_per_iter": last["wall_s"] / max(int(last["step"]), 1),
        "multi_turn_episodes": len(multi),
        "turns_differ": sum(len({round(x, 9) for x in t}) > 1 for t in multi),
    }


def table(rows: list[dict]) -> str:
    steps = sorted({s for r in rows for s in r["eval_steps"]})
    head = [
        "variant",
        "seed",
        *[f"success@{s}" for s in steps],
        "train s/iter",
        "value params",
        "peak RSS MB",
    ]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        acc = dict(zip(r["eval_steps"], r["success"]))
        cells = [r["variant"], str(r["seed"]), *[f"{acc[s]:.3f}" if s in acc else "-" for s in steps]]
        cells += [f"{r['train_s_per_iter']:.1f}", str(r["value_params"]), f"{r['peak_rss_mb']:.0f}"]
        lines.append(" | ".join(cells))
    by: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: VARIANTS.index(r["variant"])):
        by.setdefault(r["variant"], []).append(r)
    if rows and len(next(iter(by.values()))) > 1:
        lines.append("")
        lines.append("variant | mean success (min..max over seeds) at each evaluation")
        for v, rs in by.items():
            cols = [[dict(zip(r["eval_steps"], r["success"])).get(s) for r in rs] for s in steps]
            lines.append(
                f"{v} | "
                + "; ".join(
                    f"@{s} {statistics.mean(c):.3f} ({min(c):.3f}..{max(c):.3f})"
                    for s, c in zip(steps, cols)
                    if None not in c
                )
            )
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the policy checkpoint (runs/smollm2; the tiny model)")
    ap.add_argument("--recipe", default=str(ROOT / "configs/agent_calculator.yaml"))
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--eval-prompts", type=int, default=32, help="held-out episodes per evaluation")
    ap.add_argument("--eval-every", type=int, help="iterations between evaluations (default: half the run)")
    ap.add_argument("--lam", type=float, default=1.0, help="GAE's lambda (gamma is 1)")
    ap.add_argument("--inspect-rows", type=int, default=16, help="inspector rows recorded per iteration")
    ap.add_argument("--out", default="runs/agent_credit")
    ap.add_argument("--tiny", action="store_true", help="the plumbing test's sizes (module doc)")
    ap.add_argument(
        "--baseline-once",
        action="store_true",
        help="evaluate the untrained checkpoint in the first run only: greedy episodes of the same weights are "
        "the same for every variant and seed (the other runs' start is that number)",
    )
    ap.add_argument(
        "--start-success",
        type=float,
        help="the untrained checkpoint's held-out success measured before (a step-0 eval_history.json of the same "
        "--eval-prompts); no run evaluates it again",
    )
    ap.add_argument("--skip-baseline", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # the child process's one run
    ap.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.iterations < 1 or a.eval_prompts < 1:
        ap.error(f"--iterations and --eval-prompts must be >= 1, got {a.iterations}, {a.eval_prompts}")
    return a


def main(argv: list[str] | None = None) -> list[dict]:
    a = parse(argv)
    if a.variant is not None:
        child(a)
        return []
    argv = list(sys.argv[1:] if argv is None else argv)
    rows = []
    for seed in a.seeds:  # every variant of a seed first: a cut-short sweep still compares them all
        for variant in a.variants:
            run_dir = Path(a.out) / f"{variant}_s{seed}"
            cmd = [sys.executable, __file__, *argv, "--variant", variant, "--seed", str(seed)]
            if (a.baseline_once and rows) or a.start_success is not None:
                cmd.append("--skip-baseline")
            t0 = time.perf_counter()
            rc = subprocess.run(cmd, cwd=Path.cwd()).returncode
            if rc != 0 or not (run_dir / "result.json").exists():
                raise SystemExit(f"agent_credit: run {variant} seed {seed} failed (exit {rc}); see {run_dir}")
            first = rows[0] if a.baseline_once and rows else None
            if a.start_success is not None:
                first = {"eval_steps": [0], "success": [a.start_success]}
            rows.append(summarise(run_dir, first))
            print(
                f"[{variant} seed {seed}] {time.perf_counter() - t0:.0f} s: {rows[-1]['success']}", flush=True
            )
    (Path(a.out) / "table.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
