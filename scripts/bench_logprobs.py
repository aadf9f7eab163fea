"""Benchmark: naive vs chunked per-token log-probs (lit_rl.core.logprobs.token_logprobs).

    python scripts/bench_logprobs.py                  # B=8, T=1024, V=32000, fp32 and bf16
    python scripts/bench_logprobs.py --backward       # also forward+backward rows

naive   = torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).squeeze(-1)
chunked = token_logprobs(logits, ids)   (default chunk size unless --chunk-size)

Columns:
  time      median wall time of --repeats runs; naive and chunked alternate in the same process so
            that load from other processes hits both alike. ratio = chunked / naive.
  extra MB  peak resident memory *beyond the logits* (and, for fwd+bwd rows, beyond logits.grad,
            which both variants must produce). Each variant runs once in a fresh subprocess: it
            builds the logits, warms the kernels up on a tiny slice, resets the kernel's peak-RSS
            counter (echo 5 > /proc/self/clear_refs), then reports VmHWM - VmRSS(before) from
            /proc/self/status. This is real process memory (allocator caching, page granularity and
            all), not a count of tensor bytes.
  max|Δ|    max abs difference of the outputs (fwd) or of logits.grad (fwd+bwd) between variants.
            A bf16 logits.grad is rounded to bf16 by both variants from slightly different fp32
            values, so for that row the check is "within one bf16 ulp" instead of 1e-5.

Targets (forward rows gate the exit code; fwd+bwd rows are reported with the same checks):
  extra memory chunked <= naive / 10, time ratio <= 1.2, max|Δ| <= 1e-5.

--head: the LM head itself, from hidden states (B, T, H) and a (V, H) weight, forward + backward of
``(logprobs * a).sum()`` (fp32):

    python scripts/bench_logprobs.py --head --vocab 151936 --hidden 256 --rows 8 --tokens 1024

materialised = F.linear(h, W) (B, T, V) logits, ``token_logprobs`` and the entropy metric under no_grad
               (``entropy_from_logits``), as PolicyModule.materialize_logits does;
chunked      = ``core.fused_logprobs.linear_logprobs`` (entropy on), never (B, T, V).
Two modes: ``metric`` (the entropy only logged, no gradient: the GRPO/PPO default) and ``bonus`` (the entropy
also in the loss, ``+ 0.01 * H``, so its gradient flows on both paths). Time = median process CPU time
(user + sys, all threads: robust to other load on a shared machine) of --repeats runs, the two paths
alternating in one process. Peak = VmHWM above the RSS before the step (inputs built, kernels warmed on a slice),
one fresh subprocess per (path, mode); it includes h.grad / W.grad, which both paths produce.
Targets (issue 29): time ratio <= 1.1 at memory ratio <= 0.25.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lit_rl.core.logprobs import default_chunk_rows, token_logprobs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MEM_RATIO_MAX, TIME_RATIO_MAX, DELTA_MAX = 0.1, 1.2, 1e-5


def make_inputs(B: int, T: int, V: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (3.0 * torch.randn(B, T, V, generator=g)).to(dtype)  # (B, T, V)
    ids = torch.randint(0, V, (B, T), generator=g)  # (B, T)
    return logits, ids


def naive(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def within_one_ulp(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Every |a - b| is at most one bf16 spacing at max(|a|, |b|) (spacing <= eps·|x|)."""
    tol = torch.finfo(torch.bfloat16).eps * torch.maximum(a.abs(), b.abs())
    return bool(((a - b).abs() <= tol).all())


def run_variant(variant: str, logits, ids, chunk_size, backward: bool):
    """One call; returns (output, grad or None)."""
    if backward:
        logits = logits.detach().requires_grad_(True)
    out = naive(logits, ids) if variant == "naive" else token_logprobs(logits, ids, chunk_size=chunk_size)
    if not backward:
        return out, None
    out.sum().backward()
    return out.detach(), logits.grad


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def mem_probe(args) -> None:
    """Subprocess body: print peak extra resident bytes of one variant as JSON."""
    logits, ids = make_inputs(args.B, args.T, args.V, DTYPES[args.dtype])
    run_variant(args.variant, logits[:1, :4].contiguous(), ids[:1, :4], args.chunk_size, args.backward)
    reset = True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        reset = False
    before_kb = _status_kb("VmRSS") if reset else _status_kb("VmHWM")
    _, grad = run_variant(args.variant, logits, ids, args.chunk_size, args.backward)
    extra = (_status_kb("VmHWM") - before_kb) * 1024
    if grad is not None:
        extra -= grad.numel() * grad.element_size()  # logits.grad is the same for both variants
    print(json.dumps({"extra_bytes": extra, "hwm_reset": reset}))


def measure_memory(args, variant: str, dtype: str, backward: bool) -> int:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--mem-probe",
        "--variant",
        variant,
        "--dtype",
        dtype,
        "--B",
        str(args.B),
        "--T",
        str(args.T),
        "--V",
        str(args.V),
    ]
    if args.chunk_size is not None:
        cmd += ["--chunk-size", str(args.chunk_size)]
    if backward:
        cmd.append("--backward")
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    info = json.loads(res.stdout.strip().splitlines()[-1])
    if not info["hwm_reset"]:
        print(
            "warning: /proc/self/clear_refs not writable; peak memory may be underestimated", file=sys.stderr
        )
    return int(info["extra_bytes"])


def measure_time(args, logits, ids, backward: bool):
    """Alternate naive/chunked runs; return medians and the last outputs of each."""
    times = {"naive": [], "chunked": []}
    results = {}
    for variant in times:  # warm-up (first-touch allocations, kernel dispatch caches)
        run_variant(variant, logits, ids, args.chunk_size, backward)
    for _ in range(args.repeats):
        for variant, samples in times.items():
            t0 = time.perf_counter()
            results[variant] = run_variant(variant, logits, ids, args.chunk_size, backward)
            samples.append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}, results


HEAD_TIME_MAX, HEAD_MEM_MAX = 1.1, 0.25


def head_inputs(B: int, T: int, V: int, H: int, seed: int = 0):
    """Hidden (B, T, H) and weight (V, H) leaves (logits of std ~2, like a trained head), ids and advantages."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, H, generator=g).requires_grad_(True)
    W = (torch.randn(V, H, generator=g) * (2.0 / H**0.5)).requires_grad_(True)
    return h, W, torch.randint(0, V, (B, T), generator=g), torch.randn(B, T, generator=g)


def head_step(path: str, mode: str, h, W, ids, adv):
    """One forward + backward of the LM head; returns (logprobs, entropy) detached; grads land in h/W."""
    import torch.nn.functional as F

    from lit_rl.core.fused_logprobs import linear_logprobs
    from lit_rl.core.logprobs import entropy_from_logits

    h.grad = W.grad = None
    if path == "chunked":
        lp, ent = linear_logprobs(h, W, ids)
    else:
        z = F.linear(h, W)  # (B, T, V)
        lp = token_logprobs(z, ids)
        if mode == "bonus":
            ent = entropy_from_logits(z)
        else:
            with torch.no_grad():
                ent = entropy_from_logits(z.detach())
    loss = (lp * adv).sum() + (0.01 * ent.sum() if mode == "bonus" else 0.0)
    loss.backward()
    return lp.detach(), ent.detach()


def head_mem_probe(args) -> None:
    h, W, ids, adv = head_inputs(args.B, args.T, args.V, args.hidden)
    small = [
        x[:1, :2].detach().clone().requires_grad_(x.requires_grad) if x.dim() == 3 else x[:1, :2]
        for x in (h, W, ids, adv)
    ]
    head_step(args.variant, args.mode, small[0], W, small[2], small[3])  # warm the kernels on a slice
    W.grad = None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before_kb = _status_kb("VmRSS")
    head_step(args.variant, args.mode, h, W, ids, adv)
    print(json.dumps({"extra_bytes": (_status_kb("VmHWM") - before_kb) * 1024}))


def head_main(args) -> int:
    h, W, ids, adv = head_inputs(args.B, args.T, args.V, args.hidden)
    from lit_rl.core.fused_logprobs import linear_chunk_rows

    rows = linear_chunk_rows(args.V)
    print(
        f"LM head: B={args.B} T={args.T} (B*T={args.B * args.T}) H={args.hidden} V={args.V} fp32, chunk={rows} "
        f"rows ({rows * args.V * 4 / 2**20:.0f} MiB)  threads={torch.get_num_threads()}  repeats={args.repeats}"
    )
    header = (
        f"{'mode':7} {'mat. CPU s':>10} {'chunk CPU s':>11} {'ratio':>6} {'mat. MiB':>9} {'chunk MiB':>9} "
        f"{'mem ratio':>9} {'max|Δlp|':>9} {'max|ΔgW|':>9}  result"
    )
    print(header)
    print("-" * len(header))
    all_ok = True
    for mode in args.modes.split(","):
        times = {"materialised": [], "chunked": []}
        out = {}
        for _ in range(args.repeats):
            for path, samples in times.items():
                c0 = time.process_time()
                lp, _ = head_step(path, mode, h, W, ids, adv)
                samples.append(time.process_time() - c0)
                out[path] = (lp, W.grad.clone(), h.grad.clone())
        t = {k: statistics.median(v) for k, v in times.items()}
        d_lp = float((out["chunked"][0] - out["materialised"][0]).abs().max())
        d_gw = float((out["chunked"][1] - out["materialised"][1]).abs().max())
        del out
        mem = {}
        for path in times:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--head-mem-probe",
                "--variant",
                path,
                "--mode",
                mode,
                "--B",
                str(args.B),
                "--T",
                str(args.T),
                "--V",
                str(args.V),
                "--hidden",
                str(args.hidden),
            ]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            mem[path] = json.loads(res.stdout.strip().splitlines()[-1])["extra_bytes"]
        ratio, mratio = t["chunked"] / t["materialised"], mem["chunked"] / max(mem["materialised"], 1)
        ok = ratio <= HEAD_TIME_MAX and mratio <= HEAD_MEM_MAX
        all_ok &= ok
        print(
            f"{mode:7} {t['materialised']:10.2f} {t['chunked']:11.2f} {ratio:6.2f} "
            f"{mem['materialised'] / 2**20:9.0f} {mem['chunked'] / 2**20:9.0f} {mratio:9.3f} {d_lp:9.2e} "
            f"{d_gw:9.2e}  {'PASS' if ok else 'FAIL'}  (all CPU s: mat. "
            f"{[round(x, 2) for x in times['materialised']]}, chunk. {[round(x, 2) for x in times['chunked']]})",
            flush=True,
        )
    print(
        f"targets: time ratio <= {HEAD_TIME_MAX} at mem ratio <= {HEAD_MEM_MAX} -> {'PASS' if all_ok else 'FAIL'}"
    )
    return 0 if all_ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", "--rows", type=int, default=8)
    p.add_argument("--T", "--tokens", type=int, default=1024)
    p.add_argument("--V", "--vocab", type=int, default=32000)
    p.add_argument(
        "--head", action="store_true", help="benchmark the LM head (hidden -> log-probs), see above"
    )
    p.add_argument("--hidden", type=int, default=256, help="--head: hidden size H")
    p.add_argument("--modes", default="metric,bonus", help="--head: comma list of metric,bonus")
    p.add_argument("--dtypes", default="fp32,bf16", help="comma list of fp32,bf16")
    p.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: library default)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--backward", action="store_true", help="also benchmark forward+backward")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    # internal: one memory measurement in a fresh process
    p.add_argument("--mem-probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=["naive", "chunked", "materialised"], help=argparse.SUPPRESS)
    p.add_argument("--head-mem-probe", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=["metric", "bonus"], help=argparse.SUPPRESS)
    p.add_argument("--dtype", choices=list(DTYPES), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.mem_probe:
        mem_probe(args)
        return 0
    if args.head_mem_probe:
        head_mem_probe(args)
        return 0
    if args.head:
        return head_main(args)

    rows = args.chunk_size or default_chunk_rows(args.V, "cpu")
    print(
        f"B={args.B} T={args.T} V={args.V}  B*T={args.B * args.T}  chunk={rows} rows "
        f"({rows * args.V * 4 / 2**20:.1f} MiB fp32)  threads={torch.get_num_threads()}  repeats={args.repeats}"
    )
    header = (
        f"{'dtype':5} {'pass':7} {'naive s':>8} {'chunk s':>8} {'ratio':>6} "
        f"{'naive MB':>9} {'chunk MB':>9} {'mem ratio':>9} {'max|Δ|':>9}  result"
    )
    print(header)
    print("-" * len(header))
    all_ok = True
    for dname in args.dtypes.split(","):
        logits, ids = make_inputs(args.B, args.T, args.V, DTYPES[dname])
        for backward in [False, True] if args.backward else [False]:
            t, res = measure_time(args, logits, ids, backward)
            i = 1 if backward else 0
            a, b = res["naive"][i].float(), res["chunked"][i].float()
            delta = (a - b).abs().max().item()
            delta_ok = delta <= DELTA_MAX or (backward and dname == "bf16" and within_one_ulp(a, b))
            m_naive = measure_memory(args, "naive", dname, backward)
            m_chunk = measure_memory(args, "chunked", dname, backward)
            ratio, mratio = t["chunked"] / t["naive"], m_chunk / max(m_naive, 1)
            ok = ratio <= TIME_RATIO_MAX and mratio <= MEM_RATIO_MAX and delta_ok
            fails = [
                n
                for n, bad in (
                    ("time", ratio > TIME_RATIO_MAX),
                    ("mem", mratio > MEM_RATIO_MAX),
                    ("delta", not delta_ok),
                )
                if bad
            ]
            if not backward:
                all_ok &= ok
            print(
                f"{dname:5} {'fwd+bwd' if backward else 'fwd':7} {t['naive']:8.3f} {t['chunked']:8.3f} "
                f"{ratio:6.2f} {m_naive / 2**20:9.1f} {m_chunk / 2**20:9.1f} {mratio:9.3f} {delta:9.2e}  "
                f"{'PASS' if ok else 'FAIL (' + ','.join(fails) + ')'}"
            )
        del logits
    print(
        f"targets: time ratio <= {TIME_RATIO_MAX}, mem ratio <= {MEM_RATIO_MAX}, max|Δ| <= {DELTA_MAX} "
        f"(forward rows gate the exit code) -> {'PASS' if all_ok else 'FAIL'}"
    )
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
