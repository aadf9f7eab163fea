"""``ObservationLoss`` trains observation tokens of training rows only (issue 28 §6a).

A row whose reward failed (``valid`` False) or that the overlong filter excluded (``trainable`` False) is out of
every loss term; its observation tokens must not be trained either. Float64, hand-aggregated.
"""

import pytest
import torch

from lit_rl.callbacks.agent_rollout import ObservationLoss
from lit_rl.core.logprobs import token_logprobs
from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule


def _experience() -> Experience:
    """Completion layout A = action (loss_mask), O = observation (obs_mask), . = padding. Row 1 is filtered
    (trainable False), row 2 has no reward (valid False); both have observation tokens."""
    layout = ["AAOOA.", "AOOOAA", "AOA..."]
    B, P, C = len(layout), 2, len(layout[0])
    ids = torch.randint(5, 60, (B, P + C), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.tensor([[c == "A" for c in row] for row in layout])
    obs = torch.tensor([[c == "O" for c in row] for row in layout])
    att = torch.ones(B, P + C, dtype=torch.long)
    att[:, P:] = (loss_mask | obs).long()
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss_mask,
        prompt_len=P,
        group_ids=torch.zeros(B, dtype=torch.long),
        rewards=torch.tensor([1.0, 0.0, float("nan")], dtype=torch.float64),
        valid=torch.tensor([True, True, False]),
        policy_version=torch.zeros(B, dtype=torch.long),
        trainable=torch.tensor([True, False, True]),
        extras={"obs_mask": obs},
    )


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_observation_tokens_of_untrained_rows_do_not_train(tiny_model_dir, loss_agg):
    module = PolicyModule(model=str(tiny_model_dir), loss_agg=loss_agg)
    module.model.double()
    exp = _experience()
    tm = exp.train_mask  # only row 0: 3 action tokens
    assert tm.sum() == 3 and tm.any(-1).tolist() == [True, False, False]
    common = {"num_tokens": float(tm.sum()), "num_seqs": float(tm.any(-1).sum())}  # what PolicyModule passes
    module.model.zero_grad(set_to_none=True)
    logits = module.forward_logits(exp)  # (B, C, V) float64
    lp = token_logprobs(logits, exp.completion_ids)
    loss = ObservationLoss(0.5).loss_terms(module, exp, dict(common, logprobs=lp, mask=tm))["world_model"]
    nll = -lp.detach()
    # row 0's observation tokens are completion positions 2 and 3
    expected = 0.5 * (float(nll[0, 2]) + float(nll[0, 3])) / (3 if loss_agg == "token_mean" else 2)
    assert float(loss) == pytest.approx(expected, rel=1e-12)
    # the gradient is row 0's alone: rows 1 and 2 changed arbitrarily leave it unchanged
    loss.backward()
    g = {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None}
    other = _experience()
    other.input_ids[1:, 2:] = torch.randint(5, 60, (2, 6), generator=torch.Generator().manual_seed(1))
    module.model.zero_grad(set_to_none=True)
    lp2 = token_logprobs(module.forward_logits(other), other.completion_ids)
    ObservationLoss(0.5).loss_terms(module, other, dict(common, logprobs=lp2, mask=tm))[
        "world_model"
    ].backward()
    for n, p in module.model.named_parameters():
        if n in g:
            torch.testing.assert_close(p.grad, g[n], rtol=1e-10, atol=1e-14)
