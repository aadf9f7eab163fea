"""The on-policy invariants over two pairwise covering arrays of the settings space (float64, real loop).

``FULL``: every dimension of ``_grid.DIMENSIONS``; ``EXACT``: the same with the four truncation settings off,
so that the pairs of the other dimensions are all checked where every invariant must hold today. Each
combination runs once (``_run``, cached); three tests read it: ``structure`` (all rows), ``distribution``
(the truncated-sampling rows included: issue 36), ``one_step_gradient`` (the rows with a conformance
reference). ``-s`` prints the arrays as tables (the same tables as docs/invariants.md).
"""

from __future__ import annotations

import pytest
from _float64 import float64_rmsnorm

from invariants import _checks, _grid, _harness, _reference

FULL = _grid.covering_array()
EXACT = _grid.covering_array(exact=True, start=len(FULL))
_RUNS: dict[str, _harness.Run] = {}


def _run(combo: _grid.Combo, model_dir) -> _harness.Run:
    # RMSNorm in float64 (tests/_float64.py): the padding-free pass sums a prompt's gradients before the norm,
    # the reference after it; with transformers' float32-internal norm they differ by ~1e-7, not float64
    # rounding.
    if combo.id not in _RUNS:
        with float64_rmsnorm():
            _RUNS[combo.id] = _harness.run(combo.settings, str(model_dir))
    return _RUNS[combo.id]


def test_the_arrays_cover_every_pair():
    assert _grid.uncovered_pairs(FULL) == []
    assert _grid.uncovered_pairs(EXACT, exact=True) == []
    print(f"\nFULL: {len(FULL)} rows (pairwise over {len(_grid.DIMENSIONS)} dimensions)\n{_grid.table(FULL)}")
    print(f"\nEXACT: {len(EXACT)} rows (truncation off)\n{_grid.table(EXACT)}")


@pytest.mark.parametrize("combo", [pytest.param(c, id=c.id) for c in FULL + EXACT])
def test_structure(combo, tiny_model_dir):
    """Ratio 1, no clipping, loss-form KL 0, finite loss parts and gradients: holds for every row today (the
    ratio's two sides and the loss-form KL's are the trainer's own full-softmax log-probs)."""
    run = _run(combo, tiny_model_dir)
    bad = _checks.structure(run)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("combo", _grid.params(FULL) + _grid.params(EXACT))
def test_distribution(combo, tiny_model_dir):
    """Reward-form KL 0, importance weights 1 with every token kept, engine/trainer mismatch KL 0."""
    run = _run(combo, tiny_model_dir)
    bad = _checks.distribution(run)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "combo", [pytest.param(c, id=c.id) for c in EXACT if _reference.checkable(c.settings)]
)
def test_one_step_gradient(combo, tiny_model_dir):
    """Every optimizer step's gradient equals the documented objective's (float64, rtol 1e-9)."""
    run = _run(combo, tiny_model_dir)
    with float64_rmsnorm():
        diffs = _reference.step_diffs(run)
    print(f"\n{combo.id}: {len(diffs)} step(s), max rel diff {max(diffs):.1e}")
    assert max(diffs) <= _reference.GRAD_RTOL, diffs
