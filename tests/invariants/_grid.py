"""The settings space and its pairwise covering array.

``DIMENSIONS`` lists every setting a user can change that the on-policy invariants must survive, each with the
values tried (the default first). ``covering_array()`` asks allpairspy for rows such that every pair of values
of any two dimensions appears in some row; ``REFUSED`` are combinations lit_rl refuses by design: the filter
keeps them out of the array and ``test_refused.py`` asserts each is refused at construction with a clear error.

Rows with truncated / penalised sampling (top_p, top_k, min_p, repetition_penalty) check that the trainer compares
the sampler's distribution with itself in every ratio and the full softmax in every KL (docs/invariants.md).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import pytest

# frequent characters in the tiny model's samples: some row of every stop run ends on one (checked)
STOP = ["G", "e", "w", "=", "z"]

# Largest dimensions first: allpairspy then needs fewer rows (its greedy pass starts from the first columns).
DIMENSIONS: OrderedDict[str, list] = OrderedDict(
    [
        ("family", ["grpo", "dr_grpo", "gspo", "cispo", "rloo"]),
        ("correction", ["none", "tis/token", "tis/sequence", "mis/token", "mis/sequence"]),
        ("kl", ["none", "loss/k2", "loss/k3", "reward/k1", "reward/k3", "loss/k1"]),  # loss/k1: refused
        ("temperature", [1.0, 0.7]),
        ("top_p", [1.0, 0.8]),
        ("top_k", [0, 3]),
        ("min_p", [0.0, 0.1]),
        ("repetition_penalty", [1.0, 1.3]),
        ("stop", [None, STOP]),
        ("engine", ["hf_shared", "hf_copy"]),
        ("padding_free", [False, True]),
        ("micro_batch_tokens", [None, 24]),
        ("lora", [False, True]),
        ("gradient_checkpointing", [False, True]),
        ("ppo_epochs", [1, 2]),
    ]
)

# advantage + policy loss + aggregation + clip bounds of each family (the recipes' settings, configs/*.yaml)
FAMILIES = {
    "grpo": {
        "advantage": "grpo",
        "policy_loss": "ppo_clip",
        "loss_agg": "seq_mean_token_mean",
        "clip_low": 0.2,
        "clip_high": 0.2,
    },
    "dr_grpo": {
        "advantage": "dr_grpo",
        "policy_loss": "ppo_clip",
        "loss_agg": "seq_mean_token_sum_norm",
        "clip_low": 0.2,
        "clip_high": 0.2,
    },
    "gspo": {
        "advantage": "grpo",
        "policy_loss": "gspo",
        "loss_agg": "seq_mean_token_mean",
        "clip_low": 3e-4,
        "clip_high": 4e-4,
    },
    "cispo": {
        "advantage": "grpo",
        "policy_loss": "cispo",
        "loss_agg": "token_mean",
        "clip_low": 1.0,
        "clip_high": 0.28,
    },
    "rloo": {"advantage": "rloo", "policy_loss": "reinforce", "loss_agg": "token_mean"},
}

# Refused by design: (settings that together are refused, the error's text). ReferenceKL(k1, loss) has zero
# expected gradient; MIS needs a band around ratio 1. Kept out of the array, asserted in test_refused.py.
REFUSED = [
    ({"kl": "loss/k1"}, "k1 = log π − log π_ref in the loss has zero expected gradient"),
    ({"correction": "mis/token", "correction_cap": 1.0}, "must be > 1"),
    ({"correction": "tis/token", "correction_low": 0.5}, "needs rollout_correction='mis'"),
]


def _refused(row: dict) -> bool:
    return any(all(row.get(k) == v for k, v in rule.items()) for rule, _ in REFUSED)


def _keep(values: list) -> bool:
    """allpairspy's filter: called with partial rows (the first len(values) dimensions)."""
    return not _refused(dict(zip(DIMENSIONS, values)))


@dataclass(frozen=True)
class Combo:
    index: int
    settings: dict

    @property
    def truncated(self) -> bool:
        """Sampling from a processed distribution other than softmax(logits / T): the issue-36 rows."""
        s = self.settings
        return s["top_p"] < 1 or s["top_k"] > 0 or s["min_p"] > 0 or s["repetition_penalty"] != 1

    @property
    def id(self) -> str:
        s = self.settings
        sampling = (
            "+".join(
                f"{short}{s[name]}"
                for name, short in (
                    ("temperature", "T"),
                    ("top_p", "top_p"),
                    ("top_k", "top_k"),
                    ("min_p", "min_p"),
                    ("repetition_penalty", "rep"),
                )
                if s[name] != DIMENSIONS[name][0]
            )
            or "plain"
        )
        flags = [
            n
            for n, on in (
                ("stop", s["stop"]),
                ("pf", s["padding_free"]),
                ("mbt", s["micro_batch_tokens"]),
                ("lora", s["lora"]),
                ("ckpt", s["gradient_checkpointing"]),
                ("ep2", s["ppo_epochs"] == 2),
            )
            if on
        ]
        return "-".join(
            [
                f"{self.index:02d}",
                s["family"],
                s["correction"].replace("/", "_"),
                "kl_" + s["kl"].replace("/", "_"),
                s["engine"],
                sampling,
                *flags,
            ]
        )


TRUNCATION_DIMS = ("top_p", "top_k", "min_p", "repetition_penalty")


def covering_array(exact: bool = False, start: int = 0) -> list[Combo]:
    """Pairwise rows over ``DIMENSIONS``. ``exact``: the truncation dimensions held at their defaults (off),
    i.e. the pairwise array of the space where every invariant must hold today; the full array's rows are
    mostly truncated (any of 4 settings on), so without it the distribution invariants would run on 2 rows."""
    from allpairspy import AllPairs

    dims = OrderedDict((k, v[:1] if exact and k in TRUNCATION_DIMS else v) for k, v in DIMENSIONS.items())
    pairs = AllPairs(list(dims.values()), filter_func=_keep)
    return [Combo(start + i, dict(zip(dims, r))) for i, r in enumerate(pairs)]


def uncovered_pairs(rows: list[Combo], exact: bool = False) -> list[tuple]:
    """Every value pair of two dimensions that no row holds (empty for a pairwise covering array)."""
    names = list(DIMENSIONS)
    vals = {k: v[:1] if exact and k in TRUNCATION_DIMS else v for k, v in DIMENSIONS.items()}
    missing = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            seen = {(repr(c.settings[a]), repr(c.settings[b])) for c in rows}
            for va in vals[a]:
                for vb in vals[b]:
                    if (repr(va), repr(vb)) not in seen and not _refused({a: va, b: vb}):
                        missing.append((a, va, b, vb))
    return missing


def params(rows: list[Combo]) -> list:
    """pytest params, one per row, named by the row's id."""
    return [pytest.param(c, id=c.id) for c in rows]


def table(rows: list[Combo], where: dict[int, str] | None = None) -> str:
    """The array as a markdown table (one row per combination), for the -s print and docs/invariants.md;
    ``where``: an extra column (by row index), e.g. the suites a row also runs in."""
    short = {
        "temperature": "T",
        "repetition_penalty": "rep",
        "micro_batch_tokens": "mbt",
        "padding_free": "pf",
        "gradient_checkpointing": "ckpt",
        "ppo_epochs": "epochs",
    }
    head = ["#", *[short.get(n, n) for n in DIMENSIONS], "issue 36", *(["also"] if where else [])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in rows:
        vals = [
            "/".join(v) if isinstance(v, list) else "–" if v is None else str(v) for v in c.settings.values()
        ]
        extra = [where.get(c.index, "")] if where else []
        lines.append(
            "| " + " | ".join([str(c.index), *vals, "truncated" if c.truncated else "", *extra]) + " |"
        )
    return "\n".join(lines)
