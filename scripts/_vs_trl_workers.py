"""The worker side of ``scripts/bench_vs_trl.py`` and the setup both of its sides share.

The bench's constants (``CACHE``, the TRL version, the 18M model's shape, prompts x group, new tokens,
lr), its prompts, its reward, the local model and the TRL virtualenv; ``Gate``, which holds a worker at the
top of each iteration and reports that iteration's times; ``token_counts`` (a rollout's real tokens, for the
compute floor); and each side's training run inside its worker process (``run_lit``, ``run_trl``). The
script keeps the controller, the compute floor's arithmetic, the table and the command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_mfu import matmul_params  # this directory: the same FLOP count as bench_mfu

CACHE = Path(os.environ.get("LIT_RL_BENCH_CACHE", "~/.cache/lit_rl")).expanduser()
TRL_VERSION = "1.16.0"
MODEL_SHAPE = {"hidden": 512, "layers": 4, "heads": 8, "intermediate": 2304}  # 18.4M parameters
PROMPTS, GROUP, NEW_TOKENS, LR = 8, 4, 32, 1e-6


# ------------------------------------------------------------------ shared setup (both sides)
def prompt_records(n: int = 64) -> list[dict]:
    """Fixed addition prompts (plain text, no chat template: both sides feed the text as-is)."""
    out = []
    for i in range(n):
        a, b = (i * 37) % 90 + 10, (i * 53) % 90 + 10
        out.append({"prompt": f"What is {a} + {b}? Answer:", "answer": str(a + b)})
    return out


def reward(answer: str, completion: str) -> float:
    """The same cheap reward on both sides: 1 for the right number, plus a small bonus per digit emitted."""
    digits = sum(ch.isdigit() for ch in completion)
    return float(answer in completion) + 0.01 * digits


def ensure_model() -> Path:
    from lit_rl.models.tiny import ensure_tiny_model

    return ensure_tiny_model(CACHE / "bench_vs_trl" / "qwen2_18m", **MODEL_SHAPE)


def ensure_trl_venv() -> Path:
    """The TRL virtualenv's python; created (with this environment's site packages visible) on first use."""
    venv = CACHE / "trl_venv"
    py = venv / "bin" / "python"
    if (
        py.exists()
        and subprocess.run(
            [py, "-c", f"import trl; assert trl.__version__ == '{TRL_VERSION}'"], capture_output=True
        ).returncode
        == 0
    ):
        return py
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    import torch

    # Never let pip pull a CUDA torch: pin the CPU build this environment already has.
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    subprocess.run([py, "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}", torch_pin], check=True)
    return py


# ------------------------------------------------------------------ worker side
class Gate:
    """Stops the training loop at the top of each iteration until the controller writes a line on stdin; reports
    the previous iteration's wall and CPU seconds on stdout (``ITER {...}``)."""

    def __init__(self, total: int, profile: str | None = None, phases=None):
        self.total, self.k, self.t0, self.c0 = total, 0, None, None
        self.profile, self.prof = profile, None  # cProfile of every iteration after the first
        self.phases = phases  # () -> {phase: seconds} of the iteration just ended (lit_rl's perf/* metrics)

    def stop(self, final: bool = False) -> None:
        now, cpu = time.perf_counter(), time.process_time()
        if self.t0 is not None:
            row = {"wall": now - self.t0, "cpu": cpu - self.c0, **(self.phases() if self.phases else {})}
            print("ITER " + json.dumps(row), flush=True)
            self.t0 = None
        self.k += 1
        if final or self.k > self.total:  # the measured iterations are done: skip the unmeasured extra one
            if self.prof is not None:
                self.prof.disable()
                self.prof.dump_stats(self.profile)
            sys.stdout.flush()
            os._exit(0)
        print("READY", flush=True)
        if sys.stdin.readline().strip() != "go":
            os._exit(1)
        if self.profile and self.k == 2:
            import cProfile

            self.prof = cProfile.Profile(time.process_time)  # CPU seconds: robust on a shared machine
            self.prof.enable()
        self.t0, self.c0 = time.perf_counter(), time.process_time()


def token_counts(exp) -> dict[str, float]:
    """Real (unpadded) tokens of one rollout: each prompt once (one row per group: lit_rl's shared prompt
    forward, and what a prefix cache prefills), every generated completion token, and the decode steps the
    rollout needed at least (its longest completion: one step per token of it)."""
    P = exp.prompt_len
    first = [int((exp.group_ids == g).nonzero()[0]) for g in exp.group_ids.unique()]
    return {
        "work_prompt_tokens": float(exp.attention_mask[first, :P].sum()),
        "work_completion_tokens": float(exp.attention_mask[:, P:].sum()),
        "work_decode_steps": float(exp.attention_mask[:, P:].sum(1).max()),
    }


# TRL GRPOConfig settings both benches share: on the CPU in float32, no logging backends, checkpoints or
# dataloader workers (bench_time_to_accuracy.py imports it, so the two TRL sides cannot drift apart).
TRL_CPU_ARGS = {
    "use_cpu": True,
    "bf16": False,
    "fp16": False,
    "logging_steps": 1,
    "report_to": "none",
    "save_strategy": "no",
    "dataloader_num_workers": 0,
}


def run_lit(
    model_dir: str,
    engine: str,
    beta: float,
    total: int,
    prompts_file: str,
    profile: str | None,
    new_tokens: int = NEW_TOKENS,
    gc: bool = False,
    micro_batch_tokens: int | None = None,
    padding_free: bool | None = None,
) -> None:
    import functools

    import lightning as L
    import torch

    from lit_rl.callbacks import RolloutCallback
    from lit_rl.callbacks.reference_kl import ReferenceKL
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.rollout import HFEngine, SamplingConfig

    def phases() -> dict[str, float]:  # the module's own timers of the iteration that just ended
        m = trainer.callback_metrics
        return {
            k[5:-2]: float(v)
            for k, v in m.items()
            if k.startswith("perf/") and k.endswith("_s") and not k.endswith("per_s")
        }

    work: dict[str, float] = {}  # the iteration's real token counts, for the controller's compute floor
    gate = Gate(total, profile, lambda: {**phases(), **work})

    class GateCb(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            gate.stop()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if "work_matmul_params" not in work:  # a constant of the model: counted once
                work["work_matmul_params"] = float(matmul_params(pl_module.model))
            work.update(token_counts(batch.experience))

        def on_train_end(self, trainer, pl_module):
            gate.stop(final=True)

    if engine == "vllm":
        from lit_rl.rollout.vllm import VLLMEngine

        eng = VLLMEngine(max_model_len=128, kv_cache_memory_bytes=256 << 20)
    else:
        eng = HFEngine()
    module = PolicyModule(
        model=model_dir,
        optimizer=functools.partial(torch.optim.AdamW, lr=LR, weight_decay=0.0),
        gradient_checkpointing=gc,
        micro_batch_tokens=micro_batch_tokens,
        padding_free=padding_free,
    )
    rc = RolloutCallback(
        engine=eng,
        rewards={"r": lambda p, c: reward(p.answer, c)},
        group_size=GROUP,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=new_tokens),
    )
    cbs = [GateCb(), rc] + ([ReferenceKL(kind="k3", where="loss", beta=beta)] if beta > 0 else [])
    trainer = L.Trainer(
        max_steps=total + 1,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=cbs,
    )
    dm = PromptDataModule(train_files=[prompts_file], batch_size=PROMPTS, seed=0)
    trainer.fit(module, datamodule=dm)


def run_trl(
    model_dir: str,
    engine: str,
    beta: float,
    total: int,
    prompts_file: str,
    profile: str | None,
    new_tokens: int = NEW_TOKENS,
    mode: str = "like-for-like",
    gc: bool = False,
) -> None:
    import warnings

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    warnings.filterwarnings("ignore")
    gate = Gate(total, profile)

    class GateCb(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            gate.stop()

        def on_train_end(self, args, state, control, **kw):
            gate.stop(final=True)

    rows = [json.loads(line) for line in Path(prompts_file).read_text().splitlines()]

    def reward_fn(prompts, completions, answer, **kw):
        return [reward(a, c) for a, c in zip(answer, completions)]

    extra = {}
    if engine == "vllm":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        extra = {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": 128}
        if mode == "like-for-like":  # no extra no-grad forward for old_per_token_logps (lit_rl runs none)
            extra["vllm_importance_sampling_correction"] = False
    if mode == "like-for-like":  # TRL's default is True; lit_rl's False: the same setting on both sides
        extra["gradient_checkpointing"] = gc
    cfg = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_bench_"),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
        max_completion_length=new_tokens,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=LR,
        weight_decay=0.0,
        beta=beta,
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_steps=total + 1,
        **TRL_CPU_ARGS,
        seed=0,
        disable_tqdm=True,
        **extra,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[reward_fn],
        args=cfg,
        train_dataset=Dataset.from_list(rows),
        callbacks=[GateCb()],
    )
    trainer.train()
