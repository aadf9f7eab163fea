"""The rollout settings, each declared once (``core.settings.setting``) in a group per concept.

- ``RolloutSettings``: what the pipeline generates (``group_size``, ``sampling``, the prompt-length policy and
  the refill seed); the pipeline, its generate stage, the refill and the server engines' checks read it.
- ``FilterSettings``: which rows train and how rewards are shaped (DAPO dynamic sampling, overlong filter and
  soft overlong punishment).
- ``SyncSettings``: when the engine gets the learner's weights and how far generation may run ahead of it.

``RolloutCallback`` takes them as flat keyword arguments (``rollout.group_size`` in a recipe) through
``core.settings.flat_settings``, and so does ``AgentRolloutCallback``; ``cli/precheck.py`` reads the same
fields from the source. Each group checks its own fields when it is built (a one-line error naming the
field); the checks that need two groups (``queue_size`` against ``group_size``, dynamic sampling against
``group_size``, ``overlong_buffer`` against ``sampling.max_new_tokens``) run where both are known
(``callbacks/_async.py``, ``rollout/filter.py``, ``rollout/score.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from lit_rl.core.group_size import check_group_size
from lit_rl.core.names import OverlongPrompts, RolloutMode, StalePolicy
from lit_rl.core.settings import check_choices, field_docs, setting
from lit_rl.core.shaping import check_penalty_factor
from lit_rl.rollout.sampling import SamplingConfig


@dataclass(frozen=True, kw_only=True)
class RolloutSettings:
    """What the rollout pipeline generates."""

    group_size: int = setting(8, "Completions per prompt (G).")
    sampling: SamplingConfig = setting(
        doc="How completions are sampled: temperature / top-p / top-k / max_new_tokens ... (SamplingConfig).",
        factory=SamplingConfig,
    )
    max_prompt_len: int = setting(512, "Prompts longer than this many tokens: see overlong_prompts.")
    overlong_prompts: OverlongPrompts = setting(
        "truncate",
        "An overlong prompt: truncate (keep the last tokens), drop (counted) or error.",
        choices=get_args(OverlongPrompts),
    )
    seed: int | None = setting(
        None, "Key of the dynamic-sampling refill stream (with rank and iteration); None = the run's seed."
    )

    def __post_init__(self) -> None:
        check_group_size(None, self.group_size)
        if not isinstance(self.sampling, SamplingConfig):
            raise TypeError(f"sampling must be a SamplingConfig, got {type(self.sampling).__name__}")
        if self.max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1, got {self.max_prompt_len}")
        check_choices(self)


@dataclass(frozen=True, kw_only=True)
class FilterSettings:
    """Which rollout rows train, and how their rewards are shaped (DAPO, arXiv 2503.14476)."""

    dynamic_sampling: bool = setting(
        False,
        "DAPO dynamic sampling: drop groups whose rewards have zero variance and refill from "
        "freshly drawn prompts until the batch again holds data.batch_size informative groups; each "
        "rank draws refills from its own stream keyed by (seed, rank, iteration), so a resumed run "
        "draws the same.",
    )
    max_resample_tries: int = setting(
        3,
        "Dynamic sampling: extra generations per step before the step raises (a short batch would give "
        "ranks unequal rows).",
    )
    overlong_filter: bool = setting(
        False,
        "DAPO overlong filtering: completions cut off by max_new_tokens (finish reason length) keep "
        "their reward in their group's statistics but do not train.",
    )
    overlong_buffer: int | None = setting(
        None,
        "DAPO soft overlong punishment: a penalty falling linearly from 0 to -overlong_penalty_factor "
        "over the last overlong_buffer tokens of the generation budget, added to every valid reward; "
        "None = off.",
    )
    overlong_penalty_factor: float = setting(1.0, "Largest soft overlong penalty (see overlong_buffer).")

    def __post_init__(self) -> None:
        # overlong_buffer is checked against sampling.max_new_tokens where both are known (the score stage)
        if self.max_resample_tries < 0:  # checked even while dynamic sampling is off: a config error
            raise ValueError(f"max_resample_tries must be >= 0, got {self.max_resample_tries}")
        check_penalty_factor(self.overlong_penalty_factor)


@dataclass(frozen=True, kw_only=True)
class SyncSettings:
    """When the engine gets the learner's weights, and how far generation may run ahead of the learner."""

    sync_every: int = setting(1, "Push weights to the engine every this many optimizer steps.")
    mode: RolloutMode = setting(
        "sync",
        "sync: generate, then train, every iteration; async: a background producer generates while "
        "the trainer updates (needs an engine with its own copy of the weights: "
        "HFEngine(share_weights=False), the default engine in async mode, or a vLLM engine).",
        choices=get_args(RolloutMode),
    )
    max_staleness: int = setting(
        1,
        "Async: a row generated by weights more than this many weight pushes behind the learner is never "
        "trained on; 0 reproduces sync exactly.",
    )
    queue_size: int | None = setting(
        None,
        "Async: most finished rows waiting for the trainer, at least one iteration "
        "(data.batch_size x group_size); None = max_staleness + 1 iterations.",
    )
    stale_policy: StalePolicy = setting(
        "drop",
        "Async: a too-stale Experience is dropped (take the next one) or regenerated (same prompts, "
        "current weights); both counted in rows (async/dropped, async/regenerated).",
        choices=get_args(StalePolicy),
    )

    def __post_init__(self) -> None:
        if self.sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {self.sync_every}")
        check_choices(self)
        if self.max_staleness < 0:
            raise ValueError(
                f"max_staleness must be an integer >= 0 (0 = exactly synchronous), got {self.max_staleness}"
            )


for _group in (RolloutSettings, FilterSettings, SyncSettings):  # each field's doc in its docstring (help())
    _group.__doc__ = (_group.__doc__ or "") + field_docs(_group)
