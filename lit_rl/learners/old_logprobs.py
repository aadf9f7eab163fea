"""The PPO ratio's denominator log π_old: when ``PolicyModule`` computes it, and for which rows.

Several optimizer steps per Experience (``minibatch_size`` set, or ``ppo_epochs`` > 1) make every step after the
first off-policy: its ratio π_θ / π_old needs the log-probs of the weights that generated the rollout, taken
before any update. That is a no-grad forward over the Experience (``perf/old_logprob_s``).

Where nothing reads them at rollout time (no ``ExperienceHook`` callback: reference KL, teachers; no loss term of
the module's own, i.e. no critic), the pass waits for the training step, where the weights are still the same
and the advantages are known, and forwards only the rows a later step reads (``core.signal_rows.
old_logprob_rows``):
- not the zero-advantage rows that ``skip_zero_advantage_rows`` leaves out of every step (no step reads them);
- not the first minibatch's rows when each row is trained once (``ppo_epochs`` 1): that step runs on the rollout's
  weights, so its denominator is its own forward's detached log-probs (ratio exactly 1, as with one step per
  iteration), the same values a separate pass gives up to floating-point rounding.
On the SmolLM2 chat-addition recipe (64 rows, two minibatches) this leaves the pass a quarter to a half of the
rows. With a hook or a critic the pass runs as before, over every row, in ``on_experience``.
"""

from __future__ import annotations

import time

import torch

from lit_rl.core.signal_rows import old_logprob_rows, signal_rows
from lit_rl.data.experience import Experience
from lit_rl.learners.assembly import advantages_of, store_dtype
from lit_rl.learners.host import PolicyHost
from lit_rl.learners.protocols import experience_hooks


class OldLogprobs(PolicyHost):
    """Mixin of ``PolicyModule`` (uses ``self.config``, ``old_logprobs_pair``, ``own_loss_terms``,
    ``skips_zero_advantage_rows``, ``_all_reduce_sum``, ``_zero_weight_micro``: declared in ``PolicyHost``)."""

    _old_logprob_s: float = 0.0

    @property
    def needs_old_logprobs(self) -> bool:
        """Several optimizer steps per Experience make later steps off-policy: the ratio's denominator
        must then be the pre-update policy, computed once before any update."""
        return self.config.step.ppo_epochs > 1 or self.config.step.minibatch_size is not None

    def defers_old_logprobs(self, trainer) -> bool:
        """True when nothing reads log π_old before the training step (see the module doc)."""
        return self.needs_old_logprobs and not self.own_loss_terms and not experience_hooks(trainer)

    @torch.no_grad()
    def fill_old_logprobs(self, exp: Experience, rows: list[int] | None = None) -> None:
        """``exp.old_logprobs`` (and ``old_full_logprobs`` with processed sampling: the model's full softmax,
        which KL-type quantities read) of ``rows`` (default: every row), one no-grad forward per micro-batch;
        rows not computed hold 0 and must not be read. Every rank runs the same number of forwards (zero-weight
        ones where it has fewer rows): a sharded model's forward is a collective."""
        t0 = time.perf_counter()
        # on the Experience's device, like every other field: a field left on another device breaks the next
        # select (index_select with a CPU index)
        dev = exp.input_ids.device
        sub = exp if rows is None else exp.select(rows) if rows else None
        micros = [] if sub is None else list(sub.micro_batches(self.config.step.micro_batch_size))
        pairs = [self.old_logprobs_pair(m) for m in micros]
        if rows is not None:  # the ranks' counts differ: pad with zero-weight forwards up to the largest
            n = int(self._all_reduce_sum(torch.tensor([float(len(micros))]), op="max")[0])
            for _ in range(n - len(micros)):
                self.old_logprobs_pair(self._zero_weight_micro(exp))
        sampled, full = _stack(exp, rows, [p[0] for p in pairs], dev), None
        fulls = [p[1] for p in pairs if p[1] is not None]  # all or none: processed sampling or not
        if pairs and len(fulls) == len(pairs):
            full = _stack(exp, rows, fulls, dev)
        exp.old_logprobs = store_dtype(sampled)  # the sampler's (core.processed)
        exp.old_full_logprobs = None if full is None else store_dtype(full)
        self._old_logprob_s = time.perf_counter() - t0

    def deferred_old_logprobs(self, exp: Experience, first_step: list[int]) -> bool:
        """The deferred pass of the training step (``exp.old_logprobs`` None though needed): the rows a later step
        reads. ``first_step``: the rows of the first optimizer step. Returns True when the first step must take
        its own forward's detached log-probs (they were not computed)."""
        if not self.needs_old_logprobs or exp.old_logprobs is not None:
            return False
        epochs = self.config.step.ppo_epochs
        signal = signal_rows(advantages_of(exp), exp.train_mask) if self.skips_zero_advantage_rows() else None
        self.fill_old_logprobs(exp, old_logprob_rows(exp.batch_size, signal, first_step, epochs))
        return epochs == 1


def _stack(exp: Experience, rows: list[int] | None, chunks: list[torch.Tensor], dev) -> torch.Tensor:
    """(B, C) from the micro-batches' (b, C) chunks of ``rows`` (all rows when None), zeros elsewhere."""
    if rows is None:
        return torch.cat([c.to(dev) for c in chunks])
    out = torch.zeros(exp.loss_mask.shape, dtype=chunks[0].dtype if chunks else torch.float32, device=dev)
    if rows:
        out[torch.tensor(rows, device=dev)] = torch.cat([c.to(dev) for c in chunks])
    return out
