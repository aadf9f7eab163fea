"""`PolicyConfig`: the plain settings of ``PolicyModule`` as one validated object.

``PolicyModule(**settings)`` keeps its flat keyword arguments (the names users write as
``model.init_args.<field>`` in the recipes, and what Lightning stores as ``hparams``); its ``__init__`` builds a
``PolicyConfig`` from them and calls ``validate()`` before any model is loaded. The meaning of each field is
documented once, in ``PolicyModule``'s docstring (LightningCLI's ``--help`` reads it from there). Objects
(``optimizer``, ``lr_scheduler``, ``critic``) are not settings and stay ``PolicyModule`` arguments.

``PolicyModule.config`` is a typed view of the module's ``hparams`` (the one stored record: checkpoints, the
CLI's ``config.yaml``), made on demand, so a test that edits ``hparams`` sees its edit everywhere.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lit_rl.core.advantages import ADVANTAGES, STD_SCOPES
from lit_rl.core.aggregation import AGG_MODES
from lit_rl.core.importance import CORRECTION_LEVELS, CORRECTION_MODES
from lit_rl.core.objective import ObjectiveSettings
from lit_rl.core.policy_losses import LOSS_PARAMS, POLICY_LOSSES, loss_param_error
from lit_rl.models.loading import check_model_source, resolve_dtype


@dataclass
class PolicyConfig:
    """Every plain setting of ``PolicyModule`` with its default (see ``PolicyModule`` for each field)."""

    model: str
    tiny_if_missing: dict[str, Any] | None = None
    dtype: str = "float32"
    lora: dict[str, Any] | None = None
    advantage: str = "grpo"
    std_normalize: bool = True
    std_scope: str = "group"
    gamma: float = 1.0
    lam: float = 1.0
    baseline: bool = False
    policy_loss: str = "ppo_clip"
    loss_agg: str = "token_mean"
    loss_horizon: int | None = None
    whiten_advantages: bool | None = None
    disable_dropout: bool = True
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    sapo_tau_pos: float | None = None
    sapo_tau_neg: float | None = None
    vespo_k_pos: float | None = None
    vespo_lambda_pos: float | None = None
    vespo_k_neg: float | None = None
    vespo_lambda_neg: float | None = None
    ppo_epochs: int = 1
    minibatch_size: int | None = None
    micro_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    max_grad_norm: float = 1.0
    max_nonfinite_steps: int = 5
    rollout_correction: str = "none"
    correction_level: str = "token"
    correction_cap: float = 2.0
    correction_low: float | None = None
    logprob_chunk_size: int | None = None
    share_prompt_forward: bool | None = None
    padding_free: bool = False
    pack_row_tokens: int | None = None
    gradient_checkpointing: bool = False
    seed: int | None = None
    adapter: str | None = None

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PolicyConfig:
        """The config of a settings mapping (e.g. ``hparams``); keys that are not fields (a subclass's own
        settings) are ignored, missing fields take their defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def objective(self) -> ObjectiveSettings:
        """The settings ``core.objective.policy_objective`` reads."""
        return ObjectiveSettings(
            policy_loss=self.policy_loss, loss_agg=self.loss_agg, clip_low=self.clip_low, clip_high=self.clip_high,
            dual_clip=self.dual_clip, **{k: getattr(self, k) for k in LOSS_PARAMS},
            rollout_correction=self.rollout_correction,
            correction_level=self.correction_level, correction_cap=self.correction_cap,
            correction_low=self.correction_low)

    def validate(self) -> PolicyConfig:
        """Raise ``ValueError`` naming the field and its allowed values for the first invalid setting; returns
        ``self``. Cheap checks only, plus the model source's existence (before anything is loaded)."""
        ADVANTAGES.check(self.advantage, "advantage")
        POLICY_LOSSES.check(self.policy_loss, "policy_loss")
        for name, value, valid in (("loss_agg", self.loss_agg, AGG_MODES),
                                   ("std_scope", self.std_scope, STD_SCOPES),
                                   ("rollout_correction", self.rollout_correction, CORRECTION_MODES),
                                   ("correction_level", self.correction_level, CORRECTION_LEVELS)):
            if value not in valid:
                raise ValueError(f"{name}={value!r}; valid values: {', '.join(valid)}")
        if self.std_scope == "batch" and not self.std_normalize:
            raise ValueError("std_scope='batch' divides by the batch's reward std, but std_normalize is "
                             "false (no division at all); set std_normalize: true, or leave std_scope: group")
        for name, v in (("ppo_epochs", self.ppo_epochs), ("max_nonfinite_steps", self.max_nonfinite_steps)):
            if v < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        for name, v in (("minibatch_size", self.minibatch_size), ("micro_batch_size", self.micro_batch_size)):
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or null, got {v}")
        mbt = self.micro_batch_tokens
        if mbt is not None and (isinstance(mbt, bool) or not isinstance(mbt, int) or mbt < 1):
            raise ValueError(f"micro_batch_tokens must be a positive integer (padded tokens per micro-batch) or "
                             f"null, got {mbt!r}")
        if self.minibatch_size and self.micro_batch_size and self.minibatch_size % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must divide "
                             f"minibatch_size={self.minibatch_size}")
        self._validate_clipping()
        for name, v in (("gamma", self.gamma), ("lam", self.lam)):
            if not 0 <= v <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {v}")
        H = self.loss_horizon
        if H is not None and (isinstance(H, bool) or not H >= 1):
            raise ValueError(f"loss_horizon must be a positive integer (tokens) or null, got {H!r}")
        prt = self.pack_row_tokens
        if prt is not None and (isinstance(prt, bool) or not isinstance(prt, int) or prt < 1):
            raise ValueError(f"pack_row_tokens must be a positive integer (tokens per packed row) or null, got {prt!r}")
        if not isinstance(self.padding_free, bool):
            raise ValueError(f"padding_free must be true or false, got {self.padding_free!r}")
        if self.logprob_chunk_size is not None and self.logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size must be >= 1 or null, got {self.logprob_chunk_size}")
        resolve_dtype(self.dtype)
        if self.tiny_if_missing is None:
            check_model_source(self.model)
        return self

    def _validate_clipping(self) -> None:
        """Ratio clipping, gradient clipping and the engine-mismatch correction band."""
        if not 0 <= self.clip_low <= 1:
            raise ValueError(f"clip_low must be in [0, 1] (1.0 = no lower bound), got {self.clip_low}")
        if not self.clip_high > 0:  # `not >` also rejects NaN
            raise ValueError(f"clip_high must be > 0, got {self.clip_high}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"dual_clip must be > 1 or null, got {self.dual_clip}")
        for name, (owner, *_) in LOSS_PARAMS.items():  # the settings of one loss only (core.policy_losses)
            v = getattr(self, name)
            if v is not None and owner != self.policy_loss:
                raise ValueError(f"{name}={v!r} is read only by policy_loss: {owner} (policy_loss="
                                 f"{self.policy_loss!r}); set it to null")
            if (why := loss_param_error(name, v)) is not None:
                raise ValueError(why.replace("None", "null"))
        if not self.max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")
        if not self.correction_cap > 0:
            raise ValueError(f"correction_cap must be > 0, got {self.correction_cap}")
        low, mode, cap = self.correction_low, self.rollout_correction, self.correction_cap
        if low is not None and not (mode == "mis" and 0 < low < 1):
            raise ValueError(f"correction_low={low} needs rollout_correction='mis' and 0 < correction_low "
                             f"< 1 (null = 1/correction_cap); got rollout_correction={mode!r}")
        if mode == "mis" and not cap > 1:
            raise ValueError(f"correction_cap={cap} with rollout_correction='mis' must be > 1 (the kept "
                             "band [correction_low, correction_cap] must contain ratio 1)")
