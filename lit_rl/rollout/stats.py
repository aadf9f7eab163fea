"""Completion-length statistics of one rollout batch (the ones TRL logs as ``completions/*``).

Pure: lengths and finish reasons in, named floats out; no Lightning, no engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NAN = float("nan")


def completion_length_stats(lengths: torch.Tensor, finish_reasons: Sequence[str]) -> dict[str, float]:
    """min / mean / max generated tokens per completion, and the same over the completions that *stopped* on
    their own (TRL's "terminated" lengths).

    Args:
        lengths: (B,) generated tokens per row (any numeric dtype; ``Experience.loss_mask.sum(-1)``).
        finish_reasons: B strings; a row stopped on its own when it did not stop at the budget (finish reason
            other than ``"length"``: it ended with EOS or a stop string, or an agent episode finished).

    Returns ``rollout/response_len_{min,mean,max}``, the veRL aliases ``response_length/{min,mean,max}``,
    and ``rollout/response_len_stopped_{min,mean,max}`` (NaN when no row stopped: nothing is logged then, instead
    of TRL's 0, which reads like a real length; the stopped fraction is 1 - ``rollout/truncation_rate``). Over
    ranks the extremes reduce with min / max (declared in ``core.metrics.METRICS``), the means with mean. Means
    are computed in float64. An empty batch gives NaN everywhere.
    """
    lens = lengths.detach().to("cpu", torch.float64).reshape(-1)  # (B,)
    if len(finish_reasons) != lens.numel():
        raise ValueError(f"{lens.numel()} lengths but {len(finish_reasons)} finish reasons")
    stopped = torch.tensor([f != "length" for f in finish_reasons], dtype=torch.bool)  # (B,)
    out: dict[str, float] = {}
    for suffix, sel in (("", lens), ("_stopped", lens[stopped])):
        empty = sel.numel() == 0
        out[f"rollout/response_len{suffix}_min"] = NAN if empty else float(sel.min())
        out[f"rollout/response_len{suffix}_mean"] = NAN if empty else float(sel.mean())
        out[f"rollout/response_len{suffix}_max"] = NAN if empty else float(sel.max())
    for k in ("min", "mean", "max"):  # the names veRL users search for
        out[f"response_length/{k}"] = out[f"rollout/response_len_{k}"]
    return out
