"""Preference records (prompt, chosen, rejected) for reward-model training, and a synthetic set.

The synthetic set encodes a property a program can check, so the whole RLHF path (train a reward
model → use it as the reward for GRPO/PPO → its score rises) runs offline and its result is verifiable:

* ``larger``: prompts of the built-in addition task; the chosen completion is a larger digit than the
  rejected one (the ideal reward is monotone in the digit, the optimal policy answers "9").
* ``correct``: the chosen completion is the correct sum, the rejected one a wrong digit.
"""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from torch.utils.data import DataLoader

from lit_rl.jsonl import lines_note, read_jsonl

FIELDS = ("prompt", "chosen", "rejected")
PROPERTIES = ("larger", "correct")


@dataclass
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str


def parse_preferences(records: list[dict[str, Any]]) -> list[PreferencePair]:
    """Validate raw records; a missing field raises ValueError, a non-string one TypeError, naming record and field."""
    out = []
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise TypeError(
                f"preference record {i}: expected an object with fields {FIELDS}, got {type(r).__name__}"
            )
        for f in FIELDS:
            if f not in r:
                raise ValueError(f"preference record {i}: missing field {f!r}; fields present: {sorted(r)}")
            if not isinstance(r[f], str):
                raise TypeError(
                    f"preference record {i}: field {f!r} must be a string, got {type(r[f]).__name__}"
                )
        out.append(PreferencePair(r["prompt"], r["chosen"], r["rejected"]))
    return out


def load_preferences(path: str | Path) -> list[PreferencePair]:
    r"""Read a JSONL file of ``{"prompt", "chosen", "rejected"}`` objects (blank lines skipped; lines end at "\n"
    only and text with no UTF-8 form is read as U+FFFD, with a warning: ``lit_rl.jsonl``)."""
    records, replaced = [], []
    for line in read_jsonl(path):
        if line.error is not None:
            raise ValueError(f"{path}: line {line.lineno} is not valid JSON ({line.error})")
        records.append(line.value)
        if line.replaced:
            replaced.append(line.lineno)
    if replaced:
        warnings.warn(lines_note(path, replaced), UserWarning, stacklevel=2)
    if not records:
        raise ValueError(f"{path}: no preference records (the file is empty)")
    return parse_preferences(records)


def synthetic_preferences(n: int = 400, prop: str = "larger", seed: int = 0) -> list[PreferencePair]:
    """``n`` pairs over ``"a+b="`` prompts (a + b <= 9) whose preference encodes ``prop`` (see module doc)."""
    if prop not in PROPERTIES:
        raise ValueError(f"prop={prop!r}; valid values: {', '.join(PROPERTIES)}")
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10) for b in range(10) if a + b <= 9]
    out = []
    for _ in range(n):
        a, b = rng.choice(pairs)
        if prop == "larger":
            hi, lo = sorted(rng.sample(range(10), 2), reverse=True)
            chosen, rejected = str(hi), str(lo)
        else:
            chosen = str(a + b)
            rejected = str(rng.choice([d for d in range(10) if d != a + b]))
        out.append(PreferencePair(f"{a}+{b}=", chosen, rejected))
    return out


def prefers(prop: str, prompt: str, completion: str) -> float:
    """The ground-truth score behind ``synthetic_preferences`` (for checking what a reward model learned)."""
    c = completion.strip()
    if not (len(c) == 1 and c.isdigit()):
        return 0.0
    if prop == "larger":
        return int(c) / 9
    a, b = prompt.rstrip("=").split("+")
    return float(int(c) == int(a) + int(b))


class PreferenceDataModule(L.LightningDataModule):
    """Preference pairs from JSONL files or the synthetic set; a held-out split for pairwise accuracy.

    Args:
        train_files: JSONL files of preference records; None = ``synthetic_preferences(**synthetic)``.
        synthetic: keyword arguments of ``synthetic_preferences`` (n, prop, seed).
        heldout_frac: fraction of the pairs kept out of training (validation = held-out accuracy).
    """

    def __init__(
        self,
        train_files: list[str] | None = None,
        synthetic: dict[str, Any] | None = None,
        batch_size: int = 32,
        heldout_frac: float = 0.2,
        seed: int = 0,
    ):
        super().__init__()
        if not 0 <= heldout_frac < 1:
            raise ValueError(f"heldout_frac must be in [0, 1), got {heldout_frac}")
        self.train_files, self.synthetic = train_files, synthetic or {}
        self.batch_size, self.heldout_frac, self.seed = batch_size, heldout_frac, seed
        self.train_pairs: list[PreferencePair] = []
        self.heldout_pairs: list[PreferencePair] = []

    def setup(self, stage: str | None = None) -> None:
        if self.train_pairs:
            return
        if self.train_files:
            pairs = [p for f in self.train_files for p in load_preferences(f)]
        else:
            pairs = synthetic_preferences(**self.synthetic)
        rng = random.Random(self.seed)
        pairs = pairs[:]
        rng.shuffle(pairs)
        k = round(len(pairs) * self.heldout_frac)
        self.heldout_pairs, self.train_pairs = pairs[:k], pairs[k:]

    def train_dataloader(self):
        return DataLoader(self.train_pairs, batch_size=self.batch_size, shuffle=True, collate_fn=list)

    def val_dataloader(self):
        return DataLoader(self.heldout_pairs, batch_size=self.batch_size, shuffle=False, collate_fn=list)
