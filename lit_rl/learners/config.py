"""The learners' settings, each declared once in a settings group (``core.settings``), and ``PolicyConfig``,
the one object a ``PolicyModule`` reads them from.

Groups by concept: ``ModelSettings`` and ``PrecisionSettings`` (a loaded model's source, seed and dtype: also
``RewardModelModule``'s, and a critic's dtype), ``ForwardSettings`` (how the trained model is set up and
run), ``core.advantages.AdvantageSettings``, ``core.objective.ObjectiveSettings`` (the loss, its aggregation,
the mismatch correction) and ``StepSettings`` (the optimizer steps of one iteration).

``PolicyModule(model, **settings)`` keeps the flat names users write as ``model.init_args.<name>`` in the
recipes (``flat_settings`` gives it their signature and docs); its ``__init__`` splits them into the groups
once, validates them before any model is loaded and keeps the result as ``module.config``, frozen: code reads
``module.config.<group>.<name>``; ``hparams`` only records the flat values (checkpoints,
``load_from_checkpoint``). Objects (``optimizer``, ``lr_scheduler``, ``critic``) are not settings.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from types import FrameType
from typing import Any

from lit_rl.core.advantages import ADVANTAGES, AdvantageSettings
from lit_rl.core.objective import ObjectiveSettings
from lit_rl.core.policy_losses import LOSS_PARAMS, POLICY_LOSSES, loss_param_error
from lit_rl.core.settings import check_choices, flat_values, setting, split_settings
from lit_rl.core.signal_rows import skips_rows
from lit_rl.models.loading import DTYPES, check_model_source


@dataclass(frozen=True, kw_only=True)
class ModelSettings:
    """Where a learner's initial weights come from and its RNG (the policy's and a reward model's)."""

    tiny_if_missing: dict[str, Any] | None = setting(
        None,
        "If set and model is a missing local directory, build a tiny random model there with "
        "lit_rl.models.tiny.build_tiny_model(model, **tiny_if_missing) (quickstart, tests).",
    )
    seed: int | None = setting(
        None,
        "The sampling RNG (reseeded when the model is built), minibatch shuffles and a tiny_if_missing "
        "model's weights; null = the run's seed_everything (lit_rl.core.seeds).",
    )


@dataclass(frozen=True, kw_only=True)
class PrecisionSettings:
    """The dtype of a loaded model's parameters (the policy's, a reward model's, a critic's own backbone)."""

    dtype: str = setting(
        "float32",
        "Parameter dtype of the loaded model (a critic: of its separate backbone).",
        choices=tuple(DTYPES),
    )


@dataclass(frozen=True, kw_only=True)
class ForwardSettings:
    """How the trained model is set up (adapters, dropout) and how its forwards run."""

    lora: dict[str, Any] | None = setting(
        None, "peft LoraConfig keyword arguments (e.g. {r: 8, lora_alpha: 16}); null = full fine-tune."
    )
    adapter: str | None = setting(
        None, "A PEFT adapter directory to continue training (its own LoRA settings; model is its base)."
    )
    disable_dropout: bool = setting(
        True,
        "Zero every dropout probability of the policy (and a separate critic backbone) so the rollout, "
        "old-log-prob, reference, value and training passes evaluate the same function (as TRL).",
    )
    gradient_checkpointing: bool = setting(
        False, "Recompute decoder layers in backward (non-reentrant; no shared-prompt pass)."
    )
    padding_free: bool | None = setting(
        None,
        "Run the policy, reference and old-log-prob forwards on real tokens only: each prompt once, "
        "then its rows' completions, packed into rows of pack_row_tokens with a 4-D mask (models/packed.py); "
        "needs sdpa or eager attention and no sliding-window layer. null = packed wherever the model allows "
        "it (same function, faster at every completion fill measured), padded for a float64 model (as "
        "share_prompt_forward) or one it cannot pack; true = packed, refusing a model it cannot pack.",
    )
    pack_row_tokens: int | None = setting(None, "Tokens per packed row of padding_free; null = 256.")
    share_prompt_forward: bool | None = setting(
        None,
        "Run each distinct prompt of a micro-batch once and let its group's completions reuse its "
        "key/value cache (models/shared_prompt.py; ~3/8 fewer FLOPs at G=4); null = on except for a float64 "
        "model (the exact invariance checks: RMSNorm's float32 inside differs by ~1e-7).",
    )
    logprob_chunk_size: int | None = setting(
        None, "Rows per chunk of the log-softmax (bounds memory for large vocabularies); null = all at once."
    )


@dataclass(frozen=True, kw_only=True)
class StepSettings:
    """The optimizer steps of one RL iteration: epochs, minibatches, micro-batches, gradient clipping."""

    ppo_epochs: int = setting(1, "Passes over each Experience.")
    minibatch_size: int | None = setting(None, "Rows per optimizer step; null = the whole Experience.")
    micro_batch_size: int | None = setting(
        None,
        "Rows per forward/backward (gradient accumulation; also the no-grad passes over the "
        "Experience); null = the minibatch. With micro_batch_tokens it caps a token-budget micro-batch's "
        "rows.",
    )
    micro_batch_tokens: int | None = setting(
        None,
        "Token budget per training forward/backward instead of a row count: rows sorted by length and "
        "cut so rows x trimmed width <= budget (core.microbatch); same minibatch loss, same count on every "
        "rank.",
    )
    max_grad_norm: float = setting(1.0, "Gradient clipping; a non-finite norm skips the step.")
    skip_zero_advantage_rows: bool | None = setting(
        None,
        "Forward only the rows with a nonzero advantage on some trainable token (the others add exactly 0 to "
        "the gradient; the denominators stay the minibatch's); null = on where exact: policy_loss in "
        "core.policy_losses.ADVANTAGE_LINEAR and no active loss term (critic, reference KL or entropy in the "
        "loss, distillation); true = on, refused where not exact; false = off.",
    )
    max_nonfinite_steps: int = setting(5, "This many skipped (non-finite) steps in a row raise.")


# PolicyModule's groups in the order of its flat signature: PolicyConfig's fields, named here for
# ``flat_settings`` and for the CLI's early check (cli/precheck.py reads this tuple from the source)
POLICY_GROUPS = (
    ModelSettings,
    PrecisionSettings,
    ForwardSettings,
    AdvantageSettings,
    ObjectiveSettings,
    StepSettings,
)


@dataclass(frozen=True)
class PolicyConfig:
    """``PolicyModule``'s settings: the model path and one instance of each group, built once and frozen."""

    model: str
    load: ModelSettings = field(default_factory=ModelSettings)
    precision: PrecisionSettings = field(default_factory=PrecisionSettings)
    forward: ForwardSettings = field(default_factory=ForwardSettings)
    advantages: AdvantageSettings = field(default_factory=AdvantageSettings)
    objective: ObjectiveSettings = field(default_factory=ObjectiveSettings)
    step: StepSettings = field(default_factory=StepSettings)

    @classmethod
    def groups(cls) -> tuple[type, ...]:
        """The settings groups, in the order of the flat signature (a subclass may add its own)."""
        hints = typing.get_type_hints(cls)
        return tuple(hints[f.name] for f in fields(cls) if f.name != "model")

    @classmethod
    def of(cls, model: str, owner: str = "PolicyModule", **settings: Any) -> PolicyConfig:
        """The config of the flat ``settings`` (missing ones take their defaults); an unknown name is a
        one-line ``TypeError`` naming the closest setting. Not validated: call ``validate()``."""
        groups = {type(g): g for g in split_settings(owner, cls.groups(), settings)}
        hints = typing.get_type_hints(cls)
        return cls(model=model, **{f.name: groups[hints[f.name]] for f in fields(cls) if f.name != "model"})

    def flat(self) -> dict[str, Any]:
        """``{"model": ..., <every setting>: value}``: what ``save_hyperparameters`` records."""
        return {"model": self.model, **flat_values(*(getattr(self, f.name) for f in fields(self)[1:]))}

    def replace(self, **settings: Any) -> PolicyConfig:
        """A copy with the flat ``settings`` changed (each routed to its group), validated."""
        flat = self.flat()
        model = flat.pop("model")
        # the model source was checked when this config was built
        return type(self).of(model, type(self).__name__, **{**flat, **settings}).validate(source=False)

    def validate(self, source: bool = True) -> PolicyConfig:
        """Raise ``ValueError`` naming the field and its allowed values for the first invalid setting; returns
        ``self``. Cheap checks only, plus (``source``) the model source's existence (before anything
        loads)."""
        a, o, s, fw = self.advantages, self.objective, self.step, self.forward
        # the registries' own message (also the CLI precheck's): "advantage='x' is not a known advantage; ..."
        ADVANTAGES.check(a.advantage, "advantage")
        POLICY_LOSSES.check(o.policy_loss, "policy_loss")
        for f in fields(self)[1:]:
            check_choices(getattr(self, f.name))
        if a.std_scope == "batch" and not a.std_normalize:
            raise ValueError(
                "std_scope='batch' divides by the batch's reward std, but std_normalize is "
                "false (no division at all); set std_normalize: true, or leave std_scope: group"
            )
        for name, v in (("ppo_epochs", s.ppo_epochs), ("max_nonfinite_steps", s.max_nonfinite_steps)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, size in (("minibatch_size", s.minibatch_size), ("micro_batch_size", s.micro_batch_size)):
            if size is not None and size < 1:
                raise ValueError(f"{name} must be >= 1 or null, got {size}")
        _positive_int_or_null("micro_batch_tokens", s.micro_batch_tokens, "padded tokens per micro-batch")
        if s.minibatch_size and s.micro_batch_size and s.minibatch_size % s.micro_batch_size:
            raise ValueError(
                f"micro_batch_size={s.micro_batch_size} must divide minibatch_size={s.minibatch_size}"
            )
        if not s.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {s.max_grad_norm}")
        if not isinstance(s.skip_zero_advantage_rows, bool | None):
            raise ValueError(
                f"skip_zero_advantage_rows must be true, false or null, got {s.skip_zero_advantage_rows!r}"
            )
        skips_rows(s.skip_zero_advantage_rows, o.policy_loss)  # true with a loss outside ADVANTAGE_LINEAR
        _validate_objective(o)
        for name, x in (("gamma", a.gamma), ("lam", a.lam)):
            if not 0 <= x <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {x}")
        H = o.loss_horizon
        if H is not None and (isinstance(H, bool) or not H >= 1):
            raise ValueError(f"loss_horizon must be a positive integer (tokens) or null, got {H!r}")
        _positive_int_or_null("pack_row_tokens", fw.pack_row_tokens, "tokens per packed row")
        if not isinstance(fw.padding_free, bool | None):
            raise ValueError(f"padding_free must be true, false or null, got {fw.padding_free!r}")
        if fw.logprob_chunk_size is not None and fw.logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size must be >= 1 or null, got {fw.logprob_chunk_size}")
        if source and self.load.tiny_if_missing is None:
            check_model_source(self.model)
        return self


def record_settings(module: Any, values: dict[str, Any]) -> None:
    """``module.save_hyperparameters(values)``: the flat settings as Lightning's record (checkpoints,
    ``load_from_checkpoint``), without its walk up the ``__init__`` frames, which reads each frame's locals
    by its class's signature: ``flat_settings`` made that the flat settings', which live in ``**settings``
    (a KeyError)."""
    module.save_hyperparameters(values, frame=_frame_without_callers())


def _frame_without_callers() -> FrameType:
    """A suspended generator's frame: it has no caller, so the walk stops there."""

    def suspended():
        yield

    gen = suspended()
    next(gen)
    return gen.gi_frame


def _positive_int_or_null(name: str, v: Any, unit: str) -> None:
    if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
        raise ValueError(f"{name} must be a positive integer ({unit}) or null, got {v!r}")


def _validate_objective(o: ObjectiveSettings) -> None:
    """Ratio clipping, the one-loss settings and the engine-mismatch correction band."""
    if not 0 <= o.clip_low <= 1:
        raise ValueError(f"clip_low must be in [0, 1] (1.0 = no lower bound), got {o.clip_low}")
    if not o.clip_high > 0:  # `not >` also rejects NaN
        raise ValueError(f"clip_high must be > 0, got {o.clip_high}")
    if o.dual_clip is not None and not o.dual_clip > 1:
        raise ValueError(f"dual_clip must be > 1 or null, got {o.dual_clip}")
    for name, (owner, *_) in LOSS_PARAMS.items():  # the settings of one loss only (core.policy_losses)
        v = getattr(o, name)
        if v is not None and owner != o.policy_loss:
            raise ValueError(
                f"{name}={v!r} is read only by policy_loss: {owner} (policy_loss="
                f"{o.policy_loss!r}); set it to null"
            )
        if (why := loss_param_error(name, v)) is not None:
            raise ValueError(why.replace("None", "null"))
    if not o.correction_cap > 0:
        raise ValueError(f"correction_cap must be > 0, got {o.correction_cap}")
    low, mode, cap = o.correction_low, o.rollout_correction, o.correction_cap
    if low is not None and not (mode == "mis" and 0 <= low < 1):
        raise ValueError(
            f"correction_low={low} needs rollout_correction='mis' and 0 <= correction_low "
            f"< 1 (null = 1/correction_cap, 0 = no lower bound); got rollout_correction={mode!r}"
        )
    if mode == "mis" and not cap > 1:
        raise ValueError(
            f"correction_cap={cap} with rollout_correction='mis' must be > 1 (the kept "
            "band [correction_low, correction_cap] must contain ratio 1)"
        )
