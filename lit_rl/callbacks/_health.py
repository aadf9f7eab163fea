"""Pure detection logic behind `RLHealthMonitor`: no Lightning, no torch — plain floats in, events out.

Every trigger follows the same *episode* rule: when its condition becomes true it fires once; while the
condition stays true it stays quiet; once the condition is observed false again it re-arms and the next
time it becomes true it fires again. A missing or NaN reading leaves the episode state untouched (a step
without an importance weight neither starts nor ends an "IS spike" episode).

Each trigger keeps its state in ``state_dict``/``load_state_dict`` so a resumed run continues exactly
(a warning already raised before the checkpoint is not raised again after resume).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HealthEvent:
    """One warning: which check fired, at which step, with the reading that tripped it."""

    check: str
    step: int
    value: float
    message: str


def _reading(metrics: Mapping[str, float], key: str) -> float | None:
    """The metric as a float, or None when it is absent or NaN (an unknown reading)."""
    v = metrics.get(key)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


class Latch:
    """Once-per-episode edge detector: ``update(True)`` returns True only on a False → True transition."""

    def __init__(self) -> None:
        self.active = False

    def update(self, condition: bool | None) -> bool:
        if condition is None:  # unknown this step: neither starts nor ends an episode
            return False
        fire = condition and not self.active
        self.active = condition
        return fire


class ThresholdCheck:
    """Fires when ``metrics[key]`` drops below ``low`` or rises above ``high`` (each bound its own episode).

    Args:
        name: the check's name in events (``entropy``, ``is_weight``, ...); the bound appends ``_low``/``_high``.
        key: the metric read each step.
        low / high: bounds; None disables that side. ``inf`` readings count as above any finite ``high``.
        what: a short human description used in the message.
    """

    def __init__(
        self, name: str, key: str, low: float | None = None, high: float | None = None, what: str = ""
    ):
        if low is None and high is None:
            raise ValueError(f"ThresholdCheck {name!r}: set at least one of low, high")
        if low is not None and high is not None and low >= high:
            raise ValueError(f"ThresholdCheck {name!r}: low={low} must be < high={high}")
        self.name, self.key, self.low, self.high, self.what = name, key, low, high, what or key
        self.low_latch, self.high_latch = Latch(), Latch()

    def update(self, step: int, metrics: Mapping[str, float]) -> list[HealthEvent]:
        v = _reading(metrics, self.key)
        out = []
        # (the latch fires only on a reading: v is not None when it does)
        if (
            self.low is not None
            and self.low_latch.update(None if v is None else v < self.low)
            and v is not None
        ):
            out.append(
                HealthEvent(
                    f"{self.name}_low",
                    step,
                    v,
                    f"{self.what} {v:.4g} fell below {self.low:g} ({self.key}) at step {step}",
                )
            )
        if (
            self.high is not None
            and self.high_latch.update(None if v is None else v > self.high)
            and v is not None
        ):
            out.append(
                HealthEvent(
                    f"{self.name}_high",
                    step,
                    v,
                    f"{self.what} {v:.4g} rose above {self.high:g} ({self.key}) at step {step}",
                )
            )
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"low": self.low_latch.active, "high": self.high_latch.active}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.low_latch.active, self.high_latch.active = bool(state["low"]), bool(state["high"])


class LengthBlowupCheck:
    """Mean response length growing past ``factor`` × its running baseline.

    The baseline is an exponential moving average ``b ← decay·b + (1 − decay)·len`` started from the first
    reading. It only arms after ``warmup`` readings (early lengths move fast while the format is learnt),
    and it is frozen during a blow-up episode so a sustained blow-up cannot become its own baseline.
    """

    def __init__(
        self, factor: float = 2.0, warmup: int = 5, decay: float = 0.9, key: str = "rollout/response_len_mean"
    ):
        if factor <= 1.0:
            raise ValueError(f"length factor must be > 1, got {factor}")
        if warmup < 1:
            raise ValueError(f"length warmup must be >= 1 reading, got {warmup}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"length baseline decay must be in [0, 1), got {decay}")
        self.factor, self.warmup, self.decay, self.key = factor, warmup, decay, key
        self.baseline: float | None = None
        self.seen = 0
        self.latch = Latch()

    def update(self, step: int, metrics: Mapping[str, float]) -> list[HealthEvent]:
        v = _reading(metrics, self.key)
        if v is None:
            return []
        out = []
        if self.seen >= self.warmup and self.baseline is not None:
            blown = v > self.factor * self.baseline
            if self.latch.update(blown):
                out.append(
                    HealthEvent(
                        "length_blowup",
                        step,
                        v,
                        f"mean response length {v:.4g} exceeds {self.factor:g}x its running baseline "
                        f"{self.baseline:.4g} at step {step}",
                    )
                )
            if blown:
                return out  # baseline frozen for the episode
        self.baseline = v if self.baseline is None else self.decay * self.baseline + (1 - self.decay) * v
        self.seen += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "seen": self.seen, "active": self.latch.active}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.baseline, self.seen, self.latch.active = (
            state["baseline"],
            int(state["seen"]),
            bool(state["active"]),
        )


class RewardHackingCheck:
    """Training reward rising while held-out reward falls — the reward-hacking signature.

    Over the last ``window`` training rewards, ``rise = mean(second half) − mean(first half)`` (odd windows
    leave the middle reading out); over the last ``heldout_window`` held-out points (they arrive far less
    often), ``drop = first − last``. Fires when ``rise > min_rise`` and ``drop > min_drop``; it is silent
    until both windows are full.
    """

    def __init__(
        self, window: int = 20, heldout_window: int = 3, min_rise: float = 0.05, min_drop: float = 0.05
    ):
        if window < 2:
            raise ValueError(f"reward-hacking window must be >= 2 steps, got {window}")
        if heldout_window < 2:
            raise ValueError(f"reward-hacking heldout_window must be >= 2 evaluations, got {heldout_window}")
        if min_rise < 0 or min_drop < 0:
            raise ValueError(f"min_rise and min_drop must be >= 0, got {min_rise}, {min_drop}")
        self.window, self.heldout_window, self.min_rise, self.min_drop = (
            window,
            heldout_window,
            min_rise,
            min_drop,
        )
        self.train: deque[float] = deque(maxlen=window)
        self.heldout: deque[float] = deque(maxlen=heldout_window)
        self.latch = Latch()

    def add_heldout(self, value: float) -> None:
        if not math.isnan(value):
            self.heldout.append(float(value))

    def trends(self) -> tuple[float, float] | None:
        """``(rise, drop)`` once both windows are full, else None."""
        if len(self.train) < self.window or len(self.heldout) < self.heldout_window:
            return None
        t, h = list(self.train), self.window // 2
        rise = sum(t[-h:]) / h - sum(t[:h]) / h
        return rise, self.heldout[0] - self.heldout[-1]

    def update(self, step: int, metrics: Mapping[str, float]) -> list[HealthEvent]:
        v = _reading(metrics, "reward/mean")
        if v is not None:
            self.train.append(v)
        tr = self.trends()
        if tr is None:
            return []
        rise, drop = tr
        if self.latch.update(rise > self.min_rise and drop > self.min_drop):
            return [
                HealthEvent(
                    "reward_hacking",
                    step,
                    rise,
                    f"training reward rose by {rise:.4g} over {self.window} steps while held-out reward "
                    f"fell by {drop:.4g} over {self.heldout_window} evaluations at step {step} "
                    "(possible reward hacking: inspect completions)",
                )
            ]
        return []

    def state_dict(self) -> dict[str, Any]:
        return {"train": list(self.train), "heldout": list(self.heldout), "active": self.latch.active}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.train = deque(state["train"], maxlen=self.window)
        self.heldout = deque(state["heldout"], maxlen=self.heldout_window)
        self.latch.active = bool(state["active"])


class HealthChecks:
    """A named set of checks run together on one step's metrics.

    ``update(step, metrics)`` returns the events that fired this step; ``events`` keeps them all.
    """

    def __init__(self, checks: Mapping[str, Any]):
        self.checks = dict(checks)
        self.events: list[HealthEvent] = []

    def update(self, step: int, metrics: Mapping[str, float]) -> list[HealthEvent]:
        fired = [e for c in self.checks.values() for e in c.update(step, metrics)]
        self.events.extend(fired)
        return fired

    def state_dict(self) -> dict[str, Any]:
        return {
            "checks": {k: c.state_dict() for k, c in self.checks.items()},
            "events": [vars(e).copy() for e in self.events],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for k, s in state["checks"].items():
            if k in self.checks:  # a check disabled on resume just drops its saved state
                self.checks[k].load_state_dict(s)
        self.events = [HealthEvent(**e) for e in state["events"]]
