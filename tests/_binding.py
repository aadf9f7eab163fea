"""Bind a rollout's sampling settings to a learner outside a fit, as ``RolloutCallback.setup`` would.

The sampling temperature and processing the log-probs are computed with live only in the module's rollout
binding (``lit_rl/learners/binding.py``); a test that runs the learner's forward at another temperature binds
them this way instead of writing an attribute onto the module.
"""

from __future__ import annotations

from lit_rl.callbacks.rollout import RolloutCallback
from lit_rl.rollout.engine import SamplingConfig


def bind_sampling(module, sampling: SamplingConfig | None = None, teacher_router=None) -> RolloutCallback:
    """Bind ``sampling`` (default: the defaults) and ``teacher_router`` to ``module`` in place of any earlier
    binding; returns the callback."""
    rc = RolloutCallback(rewards=lambda prompt, completion: 0.0, sampling=sampling or SamplingConfig())
    if module.bound_rollout is not None:  # as a new setup after the previous one's teardown
        module.release_rollout(module.bound_rollout)
    module.bind_rollout(rc.binding(teacher_router=teacher_router))
    return rc
