"""The same invariants in float32 (``precision="32-true"``, the default dtype) on a few EXACT rows, against
the measured bounds of ``_checks.Float32Bounds`` (float64 runs check the exact values: ``test_on_policy``)."""

from __future__ import annotations

import pytest

from invariants import _checks, _grid, _harness

# every family, both engines, every correction, every KL, each structural setting on in some row
ROWS = list(_grid.covering_array(exact=True, start=len(_grid.covering_array())))[:8]


@pytest.mark.parametrize("combo", [pytest.param(c, id=c.id) for c in ROWS])
def test_float32_on_policy(combo, tiny_model_dir):
    run = _harness.run(combo.settings, str(tiny_model_dir), precision="32-true")
    bad = _checks.structure(run, _checks.FLOAT32) + _checks.distribution(run, _checks.FLOAT32)
    assert not bad, "\n".join(bad)
