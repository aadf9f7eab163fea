"""Conformance harness: a hand-built Experience through the real module step, against float64 references.

``run_step`` trains one RL iteration of a real ``PolicyModule`` / ``DistillModule`` inside a real Lightning
``Trainer`` (precision 64-true) whose batch carries a fixed, hand-built Experience (the module's own
ExperienceHooks, the callbacks' hooks and ``compute_advantages`` run as the RolloutCallback runs them), and
records the parameter gradient of every optimizer step with an optimizer that does not move the weights.

The references (``reference_*``) are written from the papers' objectives with a plain full-sequence forward
(no ``logits_to_keep``, no chunking, none of lit_rl's aggregation / advantage / loss code), so they are an
independent check of the assembled loop: masks, denominators, horizon, group statistics, whitening, IS
weights, value loss and distillation terms.
"""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import lightning as L
import torch
import yaml

from lit_rl.data import PromptDataModule
from lit_rl.data.experience import Experience

ROOT = Path(__file__).resolve().parents[2]
TASK = {"answer_width": 1, "max_sum": 9, "unary": True}
RECIPES = ("grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce", "ppo", "async", "distill")


# ----------------------------------------------------------------------------------------- recipes
def recipe(name: str) -> dict:
    """The recipe's YAML as a dict (model section and the RolloutCallback's init_args)."""
    cfg = yaml.safe_load((ROOT / "configs" / f"{name}.yaml").read_text())
    rollout = {}
    for cb in cfg.get("trainer", {}).get("callbacks", []) or []:
        if cb["class_path"].endswith("RolloutCallback"):
            rollout = cb.get("init_args", {})
    if "rollout" in cfg:  # a first-class rollout section, if the CLI has one
        rollout = cfg["rollout"].get("init_args", cfg["rollout"])
    return {"model": cfg["model"], "rollout": rollout}


def _instantiate(spec):
    if isinstance(spec, dict) and "class_path" in spec:
        mod, _, cls = spec["class_path"].rpartition(".")
        kw = {k: _instantiate(v) for k, v in (spec.get("init_args") or {}).items()}
        return getattr(importlib.import_module(mod), cls)(**kw)
    return spec


class NoStep(torch.optim.Optimizer):
    """Records each step's gradients (clones) and leaves the parameters alone: every optimizer step of an
    iteration then sees the same weights, so each recorded gradient is comparable with one reference."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads: list[list[torch.Tensor]] = []

    @torch.no_grad()
    def step(self, closure=None):
        self.grads.append(
            [
                p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                for g in self.param_groups
                for p in g["params"]
            ]
        )


def build_module(name: str, model_dir: str, **override):
    """The recipe's module with its own settings (model path replaced, gradient clipping out of the way)."""
    spec = copy.deepcopy(recipe(name)["model"])
    args = spec["init_args"]
    args.pop("optimizer", None), args.pop("tiny_if_missing", None), args.pop("lr_scheduler", None)
    args["model"] = model_dir
    args["max_grad_norm"] = 1e30  # clipping multiplies by exactly 1.0: the raw gradient is recorded
    args.update(override)
    if isinstance(args.get("critic"), dict):
        args["critic"] = _instantiate(args["critic"])
    mod, _, cls = spec["class_path"].rpartition(".")
    module = getattr(importlib.import_module(mod), cls)(optimizer=NoStep, **args)
    return module


# --------------------------------------------------------------------------------------- experience
def hand_experience(
    pad_id: int, vocab: int, horizon: int = 5, seed: int = 0, extra_pad: tuple[int, int] = (0, 0)
) -> Experience:
    """8 rows in two groups of 4: prompts of 2-3 tokens, completions of 1-5 tokens (one cut off at the
    horizon, finish "length"), row 5's reward failed (valid False, NaN), mixed 0/1 rewards.

    ``extra_pad=(p, c)`` adds p left-padding prompt columns and c right-padding completion columns: the same
    rows at another width (padding invariance). Float64 rewards and rollout log-probs.
    """
    g = torch.Generator().manual_seed(seed)
    prompts = [[5, 6, 7], [8, 9]]
    lens = [3, 1, 5, 2, 4, 2, 3, 5]
    finish = ["stop", "stop", "length", "stop", "stop", "stop", "stop", "length"]
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, float("nan"), 0.0, 0.0], dtype=torch.float64)
    valid = ~rewards.isnan()
    P, C = 3 + extra_pad[0], max(lens) + extra_pad[1]
    B = len(lens)
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    att = torch.zeros((B, P + C), dtype=torch.long)
    mask = torch.zeros((B, C), dtype=torch.bool)
    for i, n in enumerate(lens):
        p = prompts[i // 4]
        ids[i, P - len(p) : P] = torch.tensor(p)
        ids[i, P : P + n] = torch.randint(10, vocab, (n,), generator=g)
        att[i, P - len(p) : P + n] = 1
        mask[i, :n] = True
    rlp = torch.where(mask, -torch.rand((B, C), generator=g, dtype=torch.float64) * 4 - 0.5, 0.0)
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.tensor([0] * 4 + [1] * 4),
        rewards=rewards,
        valid=valid,
        policy_version=torch.zeros(B, dtype=torch.long),
        rollout_logprobs=rlp,
        finish_reasons=finish,
        horizon=horizon,
        prompts=[None] * B,
        domains=["default"] * B,
        texts=[""] * B,
    )


class FixedExperience(L.Callback):
    """Stands in for the RolloutCallback: attaches a copy of ``exp`` to every batch and runs steps 6-7 of the
    rollout contract (the module's own hook, every callback's ``on_experience``, then advantages)."""

    def __init__(self, exp: Experience, temperature: float = 1.0, transform=None):
        self.exp, self.temperature, self.transform = exp, temperature, transform

    def setup(self, trainer, pl_module, stage):
        from lit_rl.callbacks.teachers import TeacherRouter
        from lit_rl.rollout.engine import SamplingConfig
        from tests._binding import bind_sampling

        # as RolloutCallback.setup: the sampling settings and the trainer's teacher router, in one binding
        router = next((cb for cb in trainer.callbacks if isinstance(cb, TeacherRouter)), None)
        bind_sampling(pl_module, SamplingConfig(temperature=self.temperature), teacher_router=router)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        from lit_rl.learners.protocols import experience_hooks

        exp = copy.deepcopy(self.exp)
        if self.transform is not None:
            exp = self.transform(exp, trainer)
        exp = exp.to(pl_module.device)
        pl_module.on_experience(trainer, pl_module, exp)
        for hook in experience_hooks(trainer):
            hook.on_experience(trainer, pl_module, exp)
        batch.metrics = pl_module.compute_advantages(exp)
        batch.experience = exp


def run_step(
    module,
    exp: Experience,
    callbacks=(),
    temperature: float = 1.0,
    strategy="auto",
    devices=1,
    transform=None,
) -> list[list[torch.Tensor]]:
    """One RL iteration in a real Trainer (float64); returns the recorded gradient of every optimizer step."""
    L.seed_everything(0)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        precision="64-true",
        max_steps=1,
        max_epochs=-1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FixedExperience(exp, temperature, transform), *callbacks],
    )
    trainer.fit(module, datamodule=PromptDataModule(task="addition", task_args=TASK, batch_size=4))
    return trainer.optimizers[0].grads


def flat(grads: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([g.reshape(-1) for g in grads])


def max_rel_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max |got − ref| / max |ref|: one number per comparison, scale-free."""
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


# ----------------------------------------------------------------------------------------- references
def full_logprobs(model, exp: Experience, temperature: float = 1.0, with_hidden: bool = False):
    """log π(y_t | y_<t) of every completion slot from a plain full forward (B, C), [hidden (B, C, H)],
    logits (B, C, V) — no logits_to_keep, no chunking."""
    att = exp.attention_mask
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=exp.input_ids,
        attention_mask=att,
        position_ids=pos,
        output_hidden_states=with_hidden,
        use_cache=False,
    )
    P, C = exp.prompt_len, exp.completion_len
    logits = out.logits[:, P - 1 : P - 1 + C].double() / temperature  # position P+t-1 predicts token t
    lp_all = torch.log_softmax(logits, -1)
    lp = lp_all.gather(-1, exp.input_ids[:, P:].unsqueeze(-1)).squeeze(-1)
    hidden = out.hidden_states[-1][:, P - 1 : P - 1 + C] if with_hidden else None
    return lp, hidden, lp_all


def trained(exp: Experience) -> torch.Tensor:
    """(B, C) the paper's sum range: generated tokens of rows whose reward exists (and not filtered)."""
    rows = exp.valid.clone()
    if exp.trainable is not None:
        rows &= exp.trainable
    return exp.loss_mask & rows[:, None]


def group_advantage(exp: Experience, std_normalize: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO (arXiv 2402.03300 §4.1.2): (r − mean_group) / std_group over the group's valid rows (unbiased
    std, eps as documented); Dr. GRPO (arXiv 2503.20783): r − mean_group. (B,), 0 for invalid rows and for
    groups with all-equal rewards."""
    adv = torch.zeros(exp.batch_size, dtype=torch.float64)
    for g in exp.group_ids.unique():
        rows = ((exp.group_ids == g) & exp.valid).nonzero().flatten().tolist()
        r = torch.tensor([float(exp.rewards[i]) for i in rows], dtype=torch.float64)
        if len(rows) < 2 or float(r.max() - r.min()) == 0:
            continue
        a = r - r.mean()
        if std_normalize:
            a = a / (r.std(unbiased=True) + eps)
        adv[rows] = a
    return adv


def agg(per_token: torch.Tensor, m: torch.Tensor, mode: str, horizon: int | None = None) -> torch.Tensor:
    """The four aggregations written out (sums over the trained tokens only)."""
    rows = m.any(-1)
    if mode == "token_mean":
        return per_token[m].sum() / m.sum()
    per_row = torch.stack([per_token[i][m[i]].sum() for i in range(len(m)) if rows[i]])
    lens = m.sum(-1)[rows].double()
    if mode == "seq_mean_token_mean":
        return (per_row / lens).mean()
    if mode == "seq_mean_token_sum":
        return per_row.mean()
    return (per_row / horizon).mean()  # seq_mean_token_sum_norm


def reference_grad(module, loss_fn) -> torch.Tensor:
    params = [p for p in module.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    loss = loss_fn()
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return flat([g if g is not None else torch.zeros_like(p) for g, p in zip(grads, params)])


def clip_objective(ratio: torch.Tensor, adv: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    """−min(ρA, clip(ρ, 1−lo, 1+hi)A) per token (PPO, arXiv 1707.06347 eq. 7; asymmetric: DAPO)."""
    return -torch.minimum(ratio * adv, ratio.clamp(1 - lo, 1 + hi) * adv)


# ------------------------------------------------------------------------- the papers' losses (shared)
# One place for the per-family reference losses, so the invariants suite (tests/invariants/) checks its
# on-policy steps against the very formulas the recipe conformance tests use. Each returns a closure for
# ``reference_grad``; ``adv`` is (B, 1) per row or (B, C) per token; ``weights(lp)``: optional per-token IS
# weights.
def clip_reference(
    module,
    exp: Experience,
    adv,
    mode: str,
    lo: float,
    hi: float,
    horizon=None,
    weights=None,
    temperature: float = 1.0,
):
    """Clipped surrogate (PPO / GRPO / Dr. GRPO / DAPO) at θ = θ_old: ρ = exp(lp − sg(lp))."""

    def loss():
        lp, _, _ = full_logprobs(module.model, exp, temperature)
        ratio = torch.exp(lp - lp.detach())
        per_tok = clip_objective(ratio, adv.expand_as(lp), lo, hi)
        if weights is not None:
            per_tok = per_tok * weights(lp)
        return agg(per_tok, trained(exp), mode, horizon)

    return loss


def gspo_reference(module, exp: Experience, adv, lo: float, hi: float, temperature: float = 1.0):
    """GSPO (arXiv 2507.18071): s_i = exp(mean_t log ρ_t) clipped at (1 − lo, 1 + hi), mean over sequences."""
    adv = adv.reshape(-1)

    def loss():
        lp, _, _ = full_logprobs(module.model, exp, temperature)
        m = trained(exp)
        terms = []
        for i in m.any(-1).nonzero().flatten().tolist():
            s = torch.exp((lp[i] - lp[i].detach())[m[i]].mean())
            terms.append(-torch.minimum(s * adv[i], s.clamp(1 - lo, 1 + hi) * adv[i]))
        return torch.stack(terms).mean()

    return loss


def cispo_reference(module, exp: Experience, adv, lo: float, hi: float, temperature: float = 1.0):
    """CISPO (arXiv 2506.13585): −sg(clip(ρ, 1 − lo, 1 + hi)) · A · log π, token mean."""

    def loss():
        lp, _, _ = full_logprobs(module.model, exp, temperature)
        w = torch.exp(lp - lp.detach()).clamp(1 - lo, 1 + hi).detach()
        return agg(-w * adv * lp, trained(exp), "token_mean")

    return loss


def reinforce_reference(module, exp: Experience, adv, temperature: float = 1.0):
    """REINFORCE (Williams 1992): −A · log π, token mean."""

    def loss():
        lp, _, _ = full_logprobs(module.model, exp, temperature)
        return agg(-adv * lp, trained(exp), "token_mean")

    return loss
