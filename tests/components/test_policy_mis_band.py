"""PolicyModule's MIS band: ``correction_low`` reaches ``core.importance.rollout_correction``; default 1/cap.

Token ratios π_θ/μ of one row are set by hand to [0.4, 1.0, 1.5, 3.0] (μ = the rollout log-probs) against the
real tiny model's log-probs; with cap 2 the default band [0.5, 2] masks 0.4 (below) and 3.0 (above), an explicit
``correction_low=0.3`` keeps 0.4.
"""

import math

import lightning as L
import pytest
import torch

from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule

RATIOS = [0.4, 1.0, 1.5, 3.0]


def _experience(module):
    B, P, C = 1, 3, len(RATIOS)
    ids = torch.randint(5, 60, (B, P + C), generator=torch.Generator().manual_seed(1))
    exp = Experience(
        input_ids=ids,
        attention_mask=torch.ones(B, P + C, dtype=torch.long),
        loss_mask=torch.ones(B, C, dtype=torch.bool),
        prompt_len=P,
        group_ids=torch.zeros(B, dtype=torch.long),
        rewards=torch.ones(B, dtype=torch.float64),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )
    with torch.no_grad():
        lp = module.completion_logprobs(exp).double()  # (1, C)
    exp.rollout_logprobs = (lp - torch.tensor([RATIOS], dtype=torch.float64).log()).float()
    exp.advantages = torch.ones(B, C)
    return exp


# 0 = no lower bound (TRL's vllm_importance_sampling_clip_min=None; refused before: "0 <= correction_low < 1")
@pytest.mark.parametrize("low, masked_frac", [(None, 2 / 4), (0.3, 1 / 4), (0.0, 1 / 4)])
def test_correction_low_reaches_the_mis_band(tiny_model_dir, low, masked_frac):
    module = PolicyModule(
        model=str(tiny_model_dir), rollout_correction="mis", correction_cap=2.0, correction_low=low
    )
    module.trainer = L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    exp = _experience(module)
    module._micro_loss(exp, {"num_tokens": 4.0, "num_seqs": 1.0})
    m = module._last_metrics
    assert m["is/masked_frac"] == pytest.approx(masked_frac, rel=1e-12)
    assert m["is/max_weight"] == pytest.approx(3.0, rel=1e-5)  # float32 log-probs


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"rollout_correction": "tis", "correction_low": 0.5},
            "correction_low=0.5 needs rollout_correction='mis'",
        ),
        ({"rollout_correction": "mis", "correction_low": 1.0}, "0 <= correction_low < 1"),
        ({"rollout_correction": "mis", "correction_low": -0.1}, "0 <= correction_low < 1"),
        ({"rollout_correction": "mis", "correction_low": math.nan}, "0 <= correction_low < 1"),
        (
            {"rollout_correction": "mis", "correction_cap": 1.0},
            "correction_cap=1.0 with rollout_correction='mis' must be > 1",
        ),
    ],
)
def test_correction_band_settings_are_validated(tiny_model_dir, kwargs, match):
    with pytest.raises(ValueError, match=match):
        PolicyModule(model=str(tiny_model_dir), **kwargs)
