"""Resident memory per component of a real-checkpoint fit (policy, optimizer, reference, engine, KV cache).

One fresh subprocess per configuration builds, in order, what ``lit-rl fit`` builds for a GRPO recipe such as
``configs/smollm2_addition.yaml`` and reads the process's resident set size (Linux ``/proc/self/status``
VmRSS) after each stage; the step's transient peak is VmHWM above the RSS before it (the high-water mark is
reset through ``/proc/self/clear_refs``):

* ``imports``  torch, transformers, lightning (and vllm with ``--engine vllm``): the floor of any run;
* ``policy``   ``PolicyModule`` loading the checkpoint (``--lora R``: a peft LoRA of rank R on all linears);
* ``reference`` a frozen reference copy, only with ``--reference`` (the smollm2 recipe has no KL term: none);
* ``engine``   ``VLLMEngine.bind`` (vLLM's own model copy, its KV cache, workspace) or ``HFEngine``
  (shares the policy's weights);
* ``generate`` one rollout: ``--prompts`` chat prompts x ``--group`` samples, ``--new-tokens`` tokens;
* ``sync``     one weight sync (a LoRA policy is merged on the fly);
* ``step``     one policy-gradient step on those rows (forward + backward through the chunked LM head, AdamW):
  ``step peak`` = transient high-water mark, ``optimizer`` = what stays (Adam's two moments + gradients).

    python scripts/bench_memory_real.py --model ~/.cache/lit_rl/smollm2-135m-instruct \
        --configs full,lora,full_gc,lora_kv32

Configurations (``--configs``, comma-separated): ``full`` / ``lora`` (rank 16, all linears), then any of:
``kvN`` a KV cache of N MiB (default ``--kv-mib`` 256, the recipe's), ``kvdefault`` ``kv_cache_memory_bytes`` unset
(lit_rl's CPU default, ``rollout/_vllm_memory.py``), ``kvvllm`` vLLM's own CPU default instead
(``gpu_memory_utilization`` (0.3) x RAM minus what the process holds: the 8.8 GB of issue 25), ``bf16`` vLLM's
copy of the weights in bfloat16 (the trainer stays float32), ``mbN`` micro-batches of N rows
(``micro_batch_size``; default: all rows at once), ``gc`` ``gradient_checkpointing``, ``hf`` ``HFEngine`` instead
of vLLM, and allocator settings: ``trim`` ``malloc_trim(0)`` after every stage, weight sync and step (what an
engine could call), ``mmap`` ``MALLOC_MMAP_THRESHOLD_=65536`` (glibc serves every block >= 64 KiB by mmap and
returns it on free), ``arena2`` ``MALLOC_ARENA_MAX=2``. ``--iterations K`` repeats rollout + step + sync K times.
Prints one table (MiB), the anonymous / file-backed split and high-water mark after each stage, and writes JSON
with ``--json``. Numbers are RSS of the trainer's process: pages vLLM touches in its in-process engine count,
pages it only reserves do not; ``autograd_saved`` is the bytes of the distinct storages autograd saves in the
first micro-batch's forward (``saved_tensors_hooks``; inside a checkpointed layer, only what checkpointing keeps).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

STAGES = (
    "imports",
    "policy",
    "reference",
    "engine",
    "first_sync",
    "generate",
    "fwd_saved",
    "step_peak",
    "optimizer",
    "sync",
    "total",
)


def _rss(field: str = "VmRSS") -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _trim() -> None:
    """Hand freed heap pages of every glibc arena back to the OS (``malloc_trim(0)``)."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def _parse(name: str, args) -> dict:
    parts = name.split("_")
    if parts[0] not in ("full", "lora"):
        raise SystemExit(f"configuration {name!r} must start with full or lora")
    kv = args.kv_mib * 2**20
    for x in parts[1:]:
        if x.startswith("kv") and x[2:].isdigit():
            kv = int(x[2:]) * 2**20
    known = {"gc", "hf", "kvdefault", "kvvllm", "bf16", "trim", "arena2", "mmap"}
    bad = [x for x in parts[1:] if x not in known and not re.fullmatch(r"(kv|mb)\d+", x)]
    if bad:
        raise SystemExit(f"configuration {name!r}: unknown part(s) {bad}; allowed: {sorted(known)}, kvN, mbN")
    return {
        "lora": parts[0] == "lora",
        "gc": "gc" in parts,
        "engine": "hf" if "hf" in parts else "vllm",
        "kv": None if ("kvdefault" in parts or "kvvllm" in parts) else kv,
        "vllm_default": "kvvllm" in parts,
        "micro": next((int(x[2:]) for x in parts if x.startswith("mb") and x[2:].isdigit()), None),
        "dtype": "bfloat16" if "bf16" in parts else None,
        "trim": "trim" in parts,
        "arena2": "arena2" in parts,
    }


def _child(name: str, args) -> dict:
    cfg = _parse(name, args)
    out = {"name": name}
    base = _rss()
    import lightning  # noqa: F401
    import torch
    import transformers  # noqa: F401

    if cfg["engine"] == "vllm":
        from lit_rl.rollout.vllm import VLLMEngine, import_vllm

        import_vllm()
    from lit_rl.data.experience import Experience, pad_prompts_completions
    from lit_rl.data.prompts import render_prompt
    from lit_rl.data.tasks import get_task
    from lit_rl.learners import PolicyModule
    from lit_rl.models.loading import merged_state_items
    from lit_rl.rollout.engine import HFEngine, SamplingConfig

    torch.set_num_threads(
        args.threads
    )  # memory does not depend on it; 1 avoids OpenMP spin-waits on a busy machine
    mark = _rss()
    out["imports"] = mark - base

    out["anon_file"], out["stage_peak"] = {}, {}

    def stage(key):
        nonlocal mark
        if cfg["trim"]:
            _trim()
        now = _rss()
        out[key] = now - mark
        # anonymous (heap, tensors) vs file-backed (mapped safetensors, libraries) resident MiB after the stage
        out["anon_file"][key] = (_rss("RssAnon"), _rss("RssFile"))
        out["stage_peak"][key] = _rss("VmHWM")  # the process's high-water mark so far
        mark = now

    lora = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear"} if cfg["lora"] else None
    mod = PolicyModule(model=args.model, lora=lora, gradient_checkpointing=cfg["gc"])
    n_params = sum(p.numel() for n, p in mod.model.named_parameters() if "lora_" not in n)
    stage("policy")
    ref = None
    if args.reference:
        from lit_rl.models.loading import load_causal_lm

        ref = load_causal_lm(args.model).eval().requires_grad_(False)  # noqa: F841 - held: its memory is the point
    stage("reference")
    if cfg[
        "vllm_default"
    ]:  # vLLM's own CPU default: gpu_memory_utilization x RAM (what lit_rl no longer uses)
        import lit_rl.rollout.vllm as vllm_mod

        vllm_mod.cpu_kv_cache_bytes = lambda *a, **k: None
    if cfg["engine"] == "vllm":
        eng = VLLMEngine(kv_cache_memory_bytes=cfg["kv"], max_model_len=128, seed=0, dtype=cfg["dtype"])
    else:
        eng = HFEngine()
    eng.bind(mod)
    stage("engine")
    # what the engine stage holds by construction: vLLM's copy of the weights and its KV cache
    wbytes = 2 if cfg["dtype"] == "bfloat16" else 4
    out["engine_weights"] = n_params * wbytes if cfg["engine"] == "vllm" else 0
    out["engine_kv"] = (cfg["kv"] or 0) if cfg["engine"] == "vllm" else 0
    train, _ = get_task("chat_addition")
    prompt_ids = [render_prompt(p, mod.tokenizer) for p in train[: args.prompts]]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=args.new_tokens)
    if cfg["engine"] == "vllm":
        eng.update_weights(merged_state_items(mod.model))  # the first sync happens before the first rollout
    stage("first_sync")
    groups = eng.generate(prompt_ids, args.group, sampling)
    stage("generate")
    rows_p = [p for p, g in zip(prompt_ids, groups) for _ in g]
    rows_c = [list(c.token_ids) for g in groups for c in g]
    ids, att, mask, P = pad_prompts_completions(mod.tokenizer.pad_token_id, rows_p, rows_c)
    B = len(rows_p)
    exp = Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.arange(B) // args.group,
        rewards=torch.zeros(B),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )
    trainable = [p for p in mod.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=5e-6)
    adv = torch.randn(B, 1, generator=torch.Generator().manual_seed(0))
    step = cfg["micro"] or B  # rows per forward/backward (PolicyModule's micro_batch_size)
    out["per_iter_total"], peak = [], 0
    for it in range(args.iterations):
        if it:  # later iterations: rollout with the updated weights, as a fit does
            eng.update_weights(merged_state_items(mod.model))
            if cfg["trim"]:
                _trim()
            eng.generate(prompt_ids, args.group, sampling)
        peak = max(peak, _rss("VmHWM"))
        _reset_peak()
        before = _rss()
        mod.model.train()
        for i in range(0, B, step):
            sl = slice(i, i + step)
            if i == 0 and it == 0:  # what the first micro-batch's forward keeps for its backward
                storages: dict[int, int] = {}
                weights = {p.untyped_storage().data_ptr() for p in mod.model.parameters()}

                def pack(t):  # bytes of every distinct non-parameter storage autograd saves for the backward
                    st = t.untyped_storage()
                    if st.data_ptr() not in weights:
                        storages[st.data_ptr()] = st.nbytes()
                    return t

                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    lp = mod.completion_logprobs(exp.select(torch.arange(B)[sl]))
                out["fwd_saved"] = _rss() - before
                out["autograd_saved"] = sum(storages.values())
            else:
                lp = mod.completion_logprobs(exp.select(torch.arange(B)[sl]))
            (-(lp * adv[sl] * mask[sl]).sum() / mask.sum()).backward()
            del lp
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it == 0:
            out["step_peak"] = _rss("VmHWM") - before
            stage("optimizer")
            eng.update_weights(merged_state_items(mod.model))  # the sync after the step
            stage("sync")
        elif cfg["trim"]:
            _trim()
        out["per_iter_total"].append(_rss())
    out["total"] = _rss()
    out["peak_total"] = max(peak, _rss("VmHWM"))
    out["rows"], out["width"] = B, ids.shape[1]
    out["trainable"] = sum(p.numel() for p in trainable)
    # AdamW's two moments (the gradients are freed by zero_grad(set_to_none=True))
    out["adam_state"] = 2 * 4 * out["trainable"]
    out["params"] = n_params
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default=None, help="checkpoint directory (default: the smollm2 cache, built if missing)"
    )
    ap.add_argument("--configs", default="full,lora,lora_kvdefault,lora_kv32,full_gc")
    ap.add_argument("--kv-mib", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument(
        "--iterations",
        type=int,
        default=1,
        help="rollout + step + sync rounds (later rounds show whether memory keeps growing)",
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each measured process")
    ap.add_argument("--reference", action="store_true", help="also hold a frozen reference copy")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.model is None:
        from lit_rl.models.smollm2 import build

        args.model = str(build())
    if args.child:
        print("RESULT " + json.dumps(_child(args.child, args)), flush=True)
        return
    rows = []
    for name in args.configs.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--child",
            name,
            *(
                arg
                for k, v in (
                    ("model", args.model),
                    ("kv_mib", args.kv_mib),
                    ("prompts", args.prompts),
                    ("group", args.group),
                    ("new_tokens", args.new_tokens),
                    ("iterations", args.iterations),
                    ("threads", args.threads),
                )
                for arg in (f"--{k.replace('_', '-')}", str(v))
            ),
        ] + (["--reference"] if args.reference else [])
        parts = name.split("_")
        env = dict(
            os.environ,
            OMP_NUM_THREADS=str(args.threads),
            **({"MALLOC_ARENA_MAX": "2"} if "arena2" in parts else {}),
            **({"MALLOC_MMAP_THRESHOLD_": "65536"} if "mmap" in parts else {}),
        )
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
        if p.returncode or not res:
            print(f"{name}: failed (rc {p.returncode})\n{p.stderr[-3000:]}", file=sys.stderr)
            continue
        rows.append(json.loads(res[-1][7:]))
        print(f"{name}: done", file=sys.stderr, flush=True)
    mib = 2**20
    head = ["config"] + list(STAGES) + ["peak_total"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(
            "| "
            + " | ".join(
                [r["name"]]
                + [f"{r.get(k, 0) / mib:,.0f}" for k in STAGES[:-1]]
                + [f"{r['total'] / mib:,.0f}", f"{r['peak_total'] / mib:,.0f}"]
            )
            + " |"
        )
    print("\nresident MiB after each stage, anonymous + file-backed (high-water mark so far):")
    for r in rows:
        print(
            f"  {r['name']}: "
            + "; ".join(
                f"{k} {a / mib:,.0f}+{f / mib:,.0f} ({r['stage_peak'][k] / mib:,.0f})"
                for k, (a, f) in r["anon_file"].items()
            )
        )
    if any(len(r["per_iter_total"]) > 1 for r in rows):
        print(
            "\nresident MiB after each iteration: "
            + "; ".join(
                f"{r['name']}: " + ", ".join(f"{x / mib:,.0f}" for x in r["per_iter_total"]) for r in rows
            )
        )
    print(
        "by construction: "
        + "; ".join(
            f"{r['name']}: engine weights {r['engine_weights'] / mib:,.0f}, KV {r['engine_kv'] / mib:,.0f}, "
            f"Adam state {r['adam_state'] / mib:,.0f} ({r['trainable'] / 1e6:.2f}M trainable), tensors autograd saved "
            f"in the first micro-batch's forward {r['autograd_saved'] / mib:,.0f}"
            for r in rows
        )
    )
    print(
        f"(MiB of resident memory; rows per step = {rows[0]['rows'] if rows else '?'}, "
        f"sequence width = {rows[0]['width'] if rows else '?'})"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
