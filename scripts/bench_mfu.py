"""How close the update and generation phases come to this machine's own matmul peak (a model-FLOPs utilisation).

Peak: ``torch.mm`` at the model's own GEMM shapes (tokens × H @ H × H, H × F, H × V, with F the MLP's
intermediate width: the projections of a decoder layer and the LM head), fp32, best of ``--reps``; the peak is
the best of those shapes, so it is what this CPU and this torch build reach on exactly the matrices the model
multiplies.

Update: one forward + backward of the policy over ``--rows`` × (``--prompt`` + ``--completion``) tokens with the
loss of lit_rl's default path (last hidden states → ``core.fused_logprobs.linear_logprobs`` through the LM head,
chunked, recomputed in backward; no (B, T, V) logits). FLOPs = 6 · N · tokens (N = parameters in matmuls: every
Linear plus the LM head once; embeddings are a gather) plus attention 12 · L · H · T² · rows / 2 (QKᵀ and AV,
causal half, forward + backward).

Generation: ``model.generate`` of ``--completion`` new tokens for ``--rows`` rows from ``--prompt``-token prompts
(greedy, KV cache). FLOPs = 2 · N per generated token, plus the prompt's 2 · N per prefill token.

    python scripts/bench_mfu.py --model tiny18m                 # the 18M Qwen2 of bench_vs_trl
    python scripts/bench_mfu.py --model ~/.cache/lit_rl/smollm2-135m-instruct   # SmolLM2-135M (lit-rl models smollm2)

Decode floor: a decode step reads every weight once (``weight_read_seconds``: the memory bandwidth) and does
2 · N · rows FLOPs; it cannot take less than the larger of the two. Generation cannot take less than the
prompts' prefill at the peak plus that per new token. ``decode_sweep_seconds`` (one step's matmuls alone, at
their real shapes) says how close torch's own kernels come to it at a few rows.

Prints a table: phase, seconds (median of --reps), achieved GFLOP/s, the matmul peak, the fraction. Threads:
``--threads`` (default: torch's). The machine is shared: run it quiet, and read the fraction, not the seconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def matmul_params(model) -> int:
    """Parameters that take part in a matmul per token: every nn.Linear's weight (the LM head once, even when
    tied to the embedding, which itself is a gather and costs no FLOPs)."""
    seen, n = set(), 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and id(m.weight) not in seen:
            seen.add(id(m.weight))
            n += m.weight.numel()
    return n


def matmul_peak(cfg, tokens: int, reps: int) -> tuple[float, str]:
    """Best fp32 GFLOP/s of torch.mm over the model's GEMM shapes at ``tokens`` rows."""
    H, F, V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size  # F: the MLP's intermediate width
    best, where = 0.0, ""
    for k, n in ((H, H), (H, F), (F, H), (H, min(V, 32768))):
        a, b = torch.randn(tokens, k), torch.randn(k, n)
        torch.mm(a, b)  # warm-up
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - t)
        g = 2 * tokens * k * n / min(times) / 1e9
        if g > best:
            best, where = g, f"{tokens}x{k} @ {k}x{n}"
    return best, where


def decode_shapes(cfg) -> list[tuple[int, int]]:
    """(in, out) of every weight one decode step multiplies, as vLLM fuses them: per layer q|k|v in one
    projection, o, gate|up in one, down; then the LM head."""
    H, F, V, L = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or H // heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    layer = [(H, (heads + 2 * kv) * head_dim), (heads * head_dim, H), (H, 2 * F), (F, H)]
    return layer * L + [(H, V)]


def decode_sweep_seconds(cfg, rows: int, reps: int) -> float:
    """Seconds of one decode step's matmuls alone: ``rows`` x in @ in x out over every weight of the model at
    its real (fused) shape, each layer with its own weights, so they stream from memory as a real decode step's
    do (the model's weights are far larger than the caches: at a few rows a decode step reads every weight once
    for few FLOPs each, and the GEMM peak above does not apply). No attention, sampling or framework: what this
    torch build's float32 kernels need for one decode step of ``rows`` rows (not a floor: see
    ``weight_read_seconds``). Median of ``reps`` after one warm-up."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(o, i, generator=g) * 0.02 for i, o in decode_shapes(cfg)]
    xs = {i: torch.randn(rows, i, generator=g) for i, _ in decode_shapes(cfg)}
    times = []
    with torch.no_grad():
        for _ in range(reps + 1):
            t = time.perf_counter()
            for w in weights:
                torch.nn.functional.linear(xs[w.shape[1]], w)
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def weight_read_seconds(n_params: int, reps: int) -> float:
    """Seconds to read ``n_params`` float32 values once from memory (a sum over a tensor that size: far larger
    than the caches, so it runs at the memory bandwidth). A decode step reads every weight at least once, so
    no decode step can take less, however few rows it has. Median of ``reps`` after one warm-up."""
    x = torch.ones(int(n_params))
    times = []
    for _ in range(reps + 1):
        t = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def update_seconds(model, rows: int, prompt: int, completion: int, reps: int) -> float:
    from lit_rl.core.fused_logprobs import linear_logprobs

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (rows, prompt + completion), generator=g)
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    times = []
    for _ in range(reps + 1):  # the first is a warm-up
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        h = decoder(input_ids=ids).last_hidden_state[:, prompt - 1 : -1]  # (rows, C, H) predicting completion
        lp, _ = linear_logprobs(h, head.weight, ids[:, prompt:], bias=head.bias)
        (-lp.mean()).backward()
        times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def generate_seconds(model, rows: int, prompt: int, completion: int, reps: int) -> float:
    from transformers import GenerationConfig

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (rows, prompt), generator=g)
    cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=completion,
        min_new_tokens=completion,
        eos_token_id=None,
        pad_token_id=0,
    )
    times = []
    with torch.no_grad():
        for _ in range(reps + 1):
            t = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def load(model_arg: str):
    from transformers import AutoModelForCausalLM

    if model_arg == "tiny18m":  # the Qwen2 size bench_vs_trl uses
        from lit_rl.models.tiny import build_tiny_model

        path = build_tiny_model(
            tempfile.mkdtemp(),
            arch="qwen2",
            layers=4,
            hidden=512,
            heads=8,
            intermediate=2304,
            tokenizer="char",
            seed=0,
        )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_arg, dtype=torch.float32)
    return model.train().requires_grad_(True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny18m", help="tiny18m, or a Hugging Face model directory")
    ap.add_argument("--rows", type=int, default=32, help="rows (prompts x samples)")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--completion", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model = load(args.model)
    cfg = model.config
    N, L, H = matmul_params(model), cfg.num_hidden_layers, cfg.hidden_size
    T = args.prompt + args.completion
    tokens = args.rows * T
    peak, shape = matmul_peak(cfg, tokens, args.reps)

    upd = update_seconds(model, args.rows, args.prompt, args.completion, args.reps)
    upd_flops = 6 * N * tokens + 12 * L * H * T * T * args.rows / 2
    model.eval()
    gen = generate_seconds(model, args.rows, args.prompt, args.completion, args.reps)
    gen_flops = 2 * N * args.rows * T  # prefill tokens + generated tokens, 2N each

    print(
        f"model {args.model}: {N / 1e6:.1f}M matmul params, {L} layers, hidden {H}, vocab {cfg.vocab_size}; "
        f"{args.rows} rows x ({args.prompt} + {args.completion}) tokens; threads {torch.get_num_threads()}"
    )
    print(f"matmul peak (fp32 torch.mm, best of the model's shapes): {peak:.1f} GFLOP/s at {shape}")
    print("| phase | seconds | GFLOP | GFLOP/s | fraction of peak |")
    print("|---|---|---|---|---|")
    for name, s, f in (("update (fwd+bwd)", upd, upd_flops), ("generation", gen, gen_flops)):
        print(f"| {name} | {s:.3f} | {f / 1e9:.1f} | {f / s / 1e9:.1f} | {f / s / 1e9 / peak:.2f} |")
    # Decoding is not GEMM-bound: each step reads every weight for 2 x rows FLOPs, so a step takes at least the
    # longer of one read of the weights and its FLOPs at the peak; torch's own matmuls of it show what kernels reach.
    sweep = decode_sweep_seconds(cfg, args.rows, args.reps)
    read = weight_read_seconds(N, args.reps)
    step_floor = max(read, 2 * N * args.rows / (peak * 1e9))
    gen_floor = 2 * N * args.rows * args.prompt / (peak * 1e9) + args.completion * step_floor
    print(
        f"one decode step at {args.rows} rows: reading the weights once {read * 1e3:.1f} ms "
        f"({4 * N / read / 1e9:.1f} GB/s), its FLOPs at the peak {2 * N * args.rows / peak / 1e6:.1f} ms, torch's "
        f"own matmuls at those shapes (decode_sweep_seconds) {sweep * 1e3:.1f} ms "
        f"({2 * N * args.rows / sweep / 1e9 / peak:.2f} of peak); generation floor {gen_floor:.3f} s, "
        f"generation / floor {gen / gen_floor:.2f}"
    )


if __name__ == "__main__":
    main()
