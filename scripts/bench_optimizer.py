"""The optimizer step on a real model: torch's AdamW as a per-parameter loop, ``foreach`` and ``fused``.

    python scripts/bench_optimizer.py --model runs/smollm2 --threads 2 --repeats 8

Why: an RL iteration of the SmolLM2 recipe takes two AdamW steps over 134.5M float32 parameters. Each step is
memory-bound elementwise work (read the weight, gradient and both moments, write three of them back), and the
way torch runs it differs: the default on CPU is a loop over parameters doing one elementwise op at a time
(each pass over the data a separate kernel with its own temporaries), ``foreach=True`` batches each op over all
parameters (temporaries the size of every parameter at once), ``fused=True`` does the whole update of a
parameter in one kernel. TRL's ``GRPOTrainer`` steps with ``adamw_torch_fused`` (transformers' default with
torch >= 2.8).

What it prints, one process, the variants interleaved round by round (this machine is noisy; read the ratios):
the median seconds of one step (after a first step that creates the moments), its ratio to the loop, the
rise of resident memory over one step (VmHWM reset through ``/proc/self/clear_refs`` before it), and the
largest difference of any parameter from the loop's after 1 + ``--repeats`` identical steps (same gradients, same
order): the three compute the same update up to float32 rounding.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

VARIANTS = {"loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def _status_mib(key: str) -> float:
    """A memory line of /proc/self/status (``VmRSS``, ``VmHWM``), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def _reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # Linux: resets the peak resident set (VmHWM) to the current one


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="runs/smollm2", help="a Hugging Face checkpoint directory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=8, help="timed steps per variant")
    ap.add_argument("--lr", type=float, default=2e-5)
    a = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    base = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    start = [p.detach().clone() for p in base.parameters()]
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(p.shape, generator=gen) * 1e-3 for p in start]  # one fixed gradient per parameter
    n = sum(p.numel() for p in start)

    params, opts = {}, {}
    for name, kw in VARIANTS.items():
        ps = [torch.nn.Parameter(s.clone()) for s in start]
        for p, g in zip(ps, grads):
            p.grad = g  # shared: AdamW without maximize only reads the gradient
        params[name] = ps
        opts[name] = torch.optim.AdamW(ps, lr=a.lr, weight_decay=0.0, **kw)
        opts[name].step()  # the first step creates exp_avg / exp_avg_sq: not timed
    del base, start  # three copies of the weights and moments (~5 GB) are what this process needs

    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    rise: dict[str, float] = {}
    for r in range(a.repeats):
        for name in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            rss = _status_mib("VmRSS")
            _reset_hwm()
            t0 = time.perf_counter()
            opts[name].step()
            times[name].append(time.perf_counter() - t0)
            rise[name] = max(rise.get(name, 0.0), _status_mib("VmHWM") - rss)

    ref = params["loop"]
    print(f"AdamW step over {n / 1e6:.1f}M float32 parameters, {a.threads} threads, {a.repeats} steps each")
    print()
    print(
        "| variant | median s per step | / loop | resident rise over a step, MiB | max abs diff from loop |"
    )
    print("|---|---|---|---|---|")
    base_t = statistics.median(times["loop"])
    for name in VARIANTS:
        t = statistics.median(times[name])
        diff = max((p - q).abs().max().item() for p, q in zip(params[name], ref))
        print(f"| {name} | {t:.3f} | {t / base_t:.2f} | {rise[name]:.0f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
