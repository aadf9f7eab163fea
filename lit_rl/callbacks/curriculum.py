"""`Curriculum`: track the pass rate of each prompt (or task family) and retire or down-weight the ones the
policy always or never solves.

Why: a GRPO group whose completions all pass or all fail has zero advantage and teaches nothing; spending
rollouts on such prompts only costs generation time. The state machine (``PassRateTracker``) is pure
Python; the callback feeds it each step's Experience and re-draws the next batches' prompts.

Sampling. The DataModule's sampler still draws prompts uniformly; in ``on_train_batch_start`` the
callback keeps each drawn prompt ``p`` with probability ``w(p)`` (1 for active prompts,
``retired_weight`` for retired ones) and otherwise replaces it by a prompt drawn from
``trainer.datamodule.train_prompts`` with probability ``∝ w``. For a uniform first draw over N prompts
this yields exactly ``P(p) = w(p) / Σ_q w(q)``: ``w_p/N + Σ_q (1 − w_q)/N · w_p/W = w_p/W``.
This must happen before the RolloutCallback generates from ``batch.prompts``; ``setup`` moves the
Curriculum right before the first RolloutCallback in ``trainer.callbacks`` if it sits after it (as it
does when composed with ``callbacks+:``) and says so. DAPO dynamic-sampling refills draw their own
prompts and are not filtered.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from lit_rl.callbacks._learner import prompt_data
from lit_rl.callbacks._roles import PromptEditor, RolloutProducer
from lit_rl.core.seeds import run_seed
from lit_rl.data.prompts import PromptBatch

MODES = ("window", "ema")
KEYS = ("uid", "family")
ACTIVE, SOLVED, UNSOLVED = "active", "solved", "unsolved"


class PassRateTracker:
    """Per-key pass rate and status (``active`` | ``solved`` | ``unsolved``).

    Each ``update(step, key, passed, total)`` is one *visit* (one group of completions of the key).
    Pass rate: ``mode="window"`` the mean of the last ``window`` visits' pass fractions;
    ``mode="ema"``: ``rate ← decay·rate + (1 − decay)·fraction``, started from the first fraction.
    After ``min_visits`` visits a key with ``rate >= solved_rate`` is ``solved`` and one with
    ``rate <= unsolved_rate`` is ``unsolved`` (both retired); a retired key that is still visited
    (``retired_weight > 0``: down-weighted, not removed) is re-judged on every visit and returns to
    ``active`` when its rate moves back between the thresholds. With ``retire_for=k`` a key retired at
    step ``s`` returns to ``active`` with its history cleared at step ``s + k`` (``tick``), so it has to
    earn retirement again against the current policy.
    """

    def __init__(
        self,
        mode: str = "window",
        window: int = 3,
        ema_decay: float = 0.7,
        min_visits: int = 3,
        solved_rate: float = 1.0,
        unsolved_rate: float = 0.0,
        retired_weight: float = 0.0,
        retire_for: int | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}; valid values: {', '.join(MODES)}")
        if window < 1:
            raise ValueError(f"window must be >= 1 visit, got {window}")
        if not 0.0 <= ema_decay < 1.0:
            raise ValueError(f"ema_decay must be in [0, 1), got {ema_decay}")
        if min_visits < 1:
            raise ValueError(f"min_visits must be >= 1, got {min_visits}")
        if not 0.0 <= unsolved_rate < solved_rate <= 1.0:
            raise ValueError(
                f"need 0 <= unsolved_rate < solved_rate <= 1, got unsolved_rate={unsolved_rate}, "
                f"solved_rate={solved_rate}"
            )
        if not 0.0 <= retired_weight < 1.0:
            raise ValueError(
                f"retired_weight must be in [0, 1) (0 retires, >0 down-weights), got {retired_weight}"
            )
        if retire_for is not None and retire_for < 1:
            raise ValueError(f"retire_for must be >= 1 step or None (retire for good), got {retire_for}")
        self.mode, self.window, self.ema_decay, self.min_visits = mode, window, ema_decay, min_visits
        self.solved_rate, self.unsolved_rate = solved_rate, unsolved_rate
        self.retired_weight, self.retire_for = retired_weight, retire_for
        self.stats: dict[str, dict[str, Any]] = {}

    def _new(self) -> dict[str, Any]:
        return {
            "visits": 0,
            "rate": None,
            "recent": deque(maxlen=self.window),
            "status": ACTIVE,
            "since": None,
        }

    def update(self, step: int, key: str, passed: int, total: int) -> str:
        """Record one visit (``passed`` of ``total`` valid completions passed); returns the key's status."""
        if not 0 <= passed <= total:
            raise ValueError(f"passed={passed} must be within [0, total={total}]")
        s = self.stats.setdefault(key, self._new())
        if total == 0:  # every reward unavailable: no information about the prompt, not a visit
            return s["status"]
        frac = passed / total
        s["visits"] += 1
        if self.mode == "window":
            s["recent"].append(frac)
            s["rate"] = sum(s["recent"]) / len(s["recent"])
        else:
            s["rate"] = (
                frac if s["rate"] is None else self.ema_decay * s["rate"] + (1 - self.ema_decay) * frac
            )
        status = ACTIVE
        if s["visits"] >= self.min_visits:
            status = (
                SOLVED
                if s["rate"] >= self.solved_rate
                else UNSOLVED
                if s["rate"] <= self.unsolved_rate
                else ACTIVE
            )
        if status != s["status"]:
            s["status"], s["since"] = status, (None if status == ACTIVE else step)
        return status

    def tick(self, step: int) -> list[str]:
        """Return keys whose ``retire_for`` has elapsed to ``active`` with a fresh history; lists them."""
        if self.retire_for is None:
            return []
        back = [
            k for k, s in self.stats.items() if s["status"] != ACTIVE and step - s["since"] >= self.retire_for
        ]
        for k in back:
            self.stats[k] = self._new()
        return back

    def status(self, key: str) -> str:
        s = self.stats.get(key)
        return ACTIVE if s is None else s["status"]

    def weight(self, key: str) -> float:
        """Sampling weight: 1 for active (and never seen) keys, ``retired_weight`` for retired ones."""
        return 1.0 if self.status(key) == ACTIVE else self.retired_weight

    def counts(self) -> dict[str, int]:
        out = {ACTIVE: 0, SOLVED: 0, UNSOLVED: 0}
        for s in self.stats.values():
            out[s["status"]] += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {k: dict(s, recent=list(s["recent"])) for k, s in self.stats.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.stats = {k: dict(s, recent=deque(s["recent"], maxlen=self.window)) for k, s in state.items()}


def prompt_key(prompt, key: str) -> str:
    """The tracking key of a Prompt: its ``uid`` (falling back to its text when it has none) or its
    ``metadata["family"]``."""
    if key == "family":
        fam = (prompt.metadata or {}).get("family")
        if fam is None:
            raise ValueError(f"Curriculum(key='family'): prompt {prompt.uid!r} has no metadata['family']")
        return str(fam)
    if prompt.uid is not None:
        return str(prompt.uid)
    return prompt.prompt if prompt.prompt is not None else repr(prompt.messages)


class Curriculum(PromptEditor):
    """Retire or down-weight prompts (or task families) the policy always or never solves.

    Args:
        key: ``uid`` (per prompt) or ``family`` (``Prompt.metadata["family"]``).
        pass_threshold: a completion passes when its (valid) reward is ``>= pass_threshold``.
        mode / window / ema_decay / min_visits / solved_rate / unsolved_rate / retire_for: see
            ``PassRateTracker``.
        retired_weight: sampling weight of retired keys relative to active ones: 0 removes them,
            a value in (0, 1) down-weights them (they keep being measured and can come back).
        seed: seed of the callback's own re-drawing RNG (saved in the checkpoint); None = the run's ``seed_everything``.

    Metrics: ``curriculum/solved``, ``curriculum/unsolved`` (keys retired as such), ``curriculum/replaced``
    (prompts re-drawn this step).
    """

    def __init__(
        self,
        key: str = "uid",
        pass_threshold: float = 1.0,
        mode: str = "window",
        window: int = 3,
        ema_decay: float = 0.7,
        min_visits: int = 3,
        solved_rate: float = 1.0,
        unsolved_rate: float = 0.0,
        retired_weight: float = 0.0,
        retire_for: int | None = None,
        seed: int | None = None,
    ):
        if key not in KEYS:
            raise ValueError(f"key={key!r}; valid values: {', '.join(KEYS)}")
        if not math.isfinite(pass_threshold):
            raise ValueError(f"pass_threshold must be a finite reward value, got {pass_threshold}")
        self.key, self.pass_threshold = key, pass_threshold
        self.tracker = PassRateTracker(
            mode, window, ema_decay, min_visits, solved_rate, unsolved_rate, retired_weight, retire_for
        )
        self.rng = random.Random(run_seed(seed))
        self.iteration = 0
        self.replaced = 0
        self._warned_empty = False

    # ---------------------------------------------------------------- setup
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # trainer.callbacks: set by Lightning's callback connector, not declared on the Trainer class
        cbs: list[pl.Callback] = list(trainer.callbacks)  # type: ignore[attr-defined]  # (see above)
        rc = next((i for i, c in enumerate(cbs) if isinstance(c, RolloutProducer)), None)
        if rc is None:
            raise RuntimeError(
                "Curriculum needs a RolloutCallback in trainer.callbacks (it filters its prompts)"
            )
        if cbs.index(self) > rc:
            cbs.remove(self)
            cbs.insert(rc, self)
            # a new list: Lightning is iterating the old one for this very hook
            trainer.callbacks = cbs  # type: ignore[attr-defined]  # undeclared on Trainer (see above)
            rank_zero_info(
                "Curriculum: moved before the RolloutCallback in trainer.callbacks (it must choose the "
                "prompts before they are generated from)"
            )

    # ------------------------------------------------------------- sampling
    def resample(self, prompts: list, pool: list) -> tuple[list, int]:
        """Keep each prompt with probability ``w``, else re-draw from ``pool`` ∝ ``w``; returns (prompts, replaced)."""
        if all(self.tracker.weight(prompt_key(p, self.key)) >= 1.0 for p in prompts):
            return list(prompts), 0  # the common case: no RNG draw, no O(len(pool)) pass
        weights = [self.tracker.weight(prompt_key(p, self.key)) for p in pool]
        if sum(weights) <= 0.0:
            if not self._warned_empty:
                rank_zero_warn(
                    "Curriculum: every training prompt is retired; training on the sampler's draws as-is"
                )
                self._warned_empty = True
            return list(prompts), 0
        out, n = [], 0
        for p in prompts:
            w = self.tracker.weight(prompt_key(p, self.key))
            if w >= 1.0 or (w > 0.0 and self.rng.random() < w):
                out.append(p)
            else:
                out.append(self.rng.choices(pool, weights=weights)[0])
                n += 1
        return out, n

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: PromptBatch, batch_idx: int
    ) -> None:
        if batch.experience is not None:
            raise RuntimeError(
                "Curriculum ran after the RolloutCallback (the batch already has an Experience); "
                "it must come first in trainer.callbacks"
            )
        self.tracker.tick(self.iteration)
        dm = prompt_data(trainer)
        pool = dm.train_prompts if dm is not None else None
        if not pool:
            raise ValueError(
                "Curriculum needs trainer.datamodule.train_prompts to draw replacement prompts from"
            )
        batch.prompts, self.replaced = self.resample(batch.prompts, pool)

    # ------------------------------------------------------------- tracking
    def observe(self, exp) -> None:
        """One visit per group of the Experience: passes = valid rows with reward >= pass_threshold."""
        rows: dict[int, list[int]] = {}
        for i, g in enumerate(exp.group_ids.tolist()):
            rows.setdefault(g, []).append(i)
        for idx in rows.values():
            ok = [i for i in idx if bool(exp.valid[i])]
            passed = sum(float(exp.rewards[i]) >= self.pass_threshold for i in ok)
            self.tracker.update(self.iteration, prompt_key(exp.prompts[idx[0]], self.key), passed, len(ok))

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: PromptBatch,
        batch_idx: int,
    ) -> None:
        self.observe(batch.experience)
        self.iteration += 1
        c = self.tracker.counts()
        for k, v in (("solved", c[SOLVED]), ("unsolved", c[UNSOLVED]), ("replaced", self.replaced)):
            pl_module.log(f"curriculum/{k}", float(v), on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"tracker": self.tracker.state_dict(), "rng": self.rng.getstate(), "iteration": self.iteration}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.tracker.load_state_dict(state["tracker"])
        self.rng.setstate(state["rng"])
        self.iteration = int(state["iteration"])
