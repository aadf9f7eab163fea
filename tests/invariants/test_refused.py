"""Combinations refused by design are refused at construction, with an error naming the reason, and are not in
the covering arrays (allpairspy's filter, ``_grid.REFUSED``)."""

from __future__ import annotations

import re

import pytest

from invariants import _grid, _harness


@pytest.mark.parametrize(
    "rule,match", _grid.REFUSED, ids=[" ".join(f"{k}={v}" for k, v in r.items()) for r, _ in _grid.REFUSED]
)
def test_refused_at_construction(rule, match, tiny_model_dir):
    from lit_rl.learners import PolicyModule

    settings = {k: v[0] for k, v in _grid.DIMENSIONS.items()} | rule
    with pytest.raises(ValueError, match=re.escape(match)):
        _harness.reference_kl(settings)
        PolicyModule(model=str(tiny_model_dir), **_harness.module_kwargs(settings))


def test_no_refused_combination_is_in_the_arrays():
    rows = _grid.covering_array() + _grid.covering_array(exact=True)
    assert not [c.id for c in rows if _grid._refused(c.settings)]
    assert "loss/k1" in _grid.DIMENSIONS["kl"]  # the filter, not the value list, keeps it out
