"""``skip_zero_advantage_rows``: a step forwards only the rows whose advantage is nonzero on some trainable
token, and that changes nothing: one (or two) AdamW steps with skipping on and off leave the same parameters
and the same optimizer state (float64, ≤ 1e-12), for every registered policy loss and loss aggregation, with
and without importance weights; a step with no signal row anywhere is one zero-weight pass, so AdamW's
momentum moves the weights exactly as without skipping. Where it would not be exact (a loss term, a loss
outside ``ADVANTAGE_LINEAR``) null turns it off and true is refused with the reason."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lit_rl.core.objective import ObjectiveSettings
from lit_rl.core.policy_losses import ADVANTAGE_LINEAR, POLICY_LOSSES, PolicyLossInputs, loss_settings
from lit_rl.data.experience import Experience
from lit_rl.learners import LossTerm, PolicyModule
from tests._float64 import float64_rmsnorm

HERE = Path(__file__).resolve().parent
AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")
LENS = [3, 1, 5, 2, 4, 2, 3, 5, 2, 4, 1, 3]  # completion tokens of the 12 rows (3 groups of 4)
# Row 0 and group 1 (rows 4-7): advantage 0; row 9: no reward (valid False) but a nonzero advantage; row 10:
# its one nonzero advantage on a padding column. The rows left with signal:
SIGNAL = [1, 2, 3, 8, 11]


@pytest.fixture(autouse=True, scope="module")
def _rmsnorm_float64():
    with float64_rmsnorm():  # the one float32 step of the tiny qwen2: no rounding flips between batch shapes
        yield


class Probe(L.Callback, LossTerm):
    """A loss term of the objective (0.1 Σ log π over the trainable tokens): it trains every row."""

    def loss_terms(self, module, micro, fwd):
        return {"probe": 0.1 * (fwd["logprobs"] * fwd["mask"]).sum() / fwd["num_tokens"]}


def _attach(m: PolicyModule, *callbacks) -> PolicyModule:
    """What ``_optimizer_step`` reads of a trainer (one process), and a plain backward."""
    m._trainer = SimpleNamespace(callbacks=list(callbacks), world_size=1, strategy=None)
    m.manual_backward = lambda loss: loss.backward()
    return m


@pytest.fixture(scope="module")
def module(tiny_model_dir):
    m = _attach(PolicyModule(model=str(tiny_model_dir))).double()  # what a Trainer's precision 64-true does
    m.initial = copy.deepcopy(m.state_dict())
    return m


def _experience(m: PolicyModule, seed: int = 0, zero_all: bool = False) -> Experience:
    g = torch.Generator().manual_seed(seed)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    B, P, C = len(LENS), 4, max(LENS)
    pad, vocab = m.tokenizer.pad_token_id, m.model.config.vocab_size
    ids = torch.full((B, P + C), pad, dtype=torch.long)
    att = torch.zeros((B, P + C), dtype=torch.long)
    mask = torch.zeros((B, C), dtype=torch.bool)
    for i, n in enumerate(LENS):
        p = prompts[i // 4]
        ids[i, P - len(p) : P] = torch.tensor(p)
        ids[i, P : P + n] = torch.randint(14, vocab, (n,), generator=g)
        att[i, P - len(p) : P + n] = 1
        mask[i, :n] = True
    valid = torch.ones(B, dtype=torch.bool)
    valid[9] = False
    adv = torch.randn((B, C), generator=g, dtype=torch.float64) * mask
    adv[[0, 4, 5, 6, 7]] = 0.0
    adv[9, 0] = 1.5
    adv[10] = 0.0
    adv[10, 3] = 0.7  # row 10 has one completion token: column 3 is padding
    if zero_all:
        adv.zero_()
    exp = Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=mask,
        prompt_len=P,
        group_ids=torch.arange(B) // 4,
        rewards=torch.where(valid, 1.0, float("nan")).double(),
        valid=valid,
        policy_version=torch.zeros(B, dtype=torch.long),
        horizon=8,
        advantages=adv,
    )
    with torch.no_grad():  # a stale policy: ratios around exp(±0.3), some clipped
        lp = m.old_logprobs_pair(exp)[0]
    exp.old_logprobs = torch.where(mask, lp + 0.3 * torch.randn(lp.shape, generator=g, dtype=lp.dtype), 0.0)
    exp.rollout_logprobs = torch.where(mask, exp.old_logprobs - 0.2 * torch.rand(lp.shape, generator=g), 0.0)
    exp.is_weights = torch.rand((B, C), generator=g, dtype=torch.float64) * 2
    return exp


def _train(m: PolicyModule, exps: list[Experience], **settings):
    """AdamW steps from the initial weights, one per Experience: (parameters, AdamW state, steps' stats)."""
    m.load_state_dict(m.initial)
    m.update_settings(**settings)
    params = [p for p in m.parameters() if p.requires_grad]
    # eps 1e-5, not 1e-8: Adam's first step is lr * g / (|g| + eps), which turns the last-bit difference of
    # a gradient entry near 0 (another summation order: other micro-batches) into ~lr / eps times it
    opt = torch.optim.AdamW(params, lr=1e-2, eps=1e-5, weight_decay=0.1)
    stats = [m._optimizer_step(opt, None, copy.deepcopy(e)) for e in exps]
    state = [opt.state[p][k] for p in params for k in ("exp_avg", "exp_avg_sq")]
    return [p.detach().clone() for p in params], [s.clone() for s in state], stats


def _assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    worst = max(float((x - y).abs().max() / y.abs().max().clamp_min(1e-30)) for x, y in zip(a, b))
    assert worst <= 1e-12, worst


def _assert_same_run(on, off) -> None:
    _assert_same(on[0], off[0])
    _assert_same(on[1], off[1])


@pytest.mark.parametrize("weights", [False, True], ids=["plain", "is_weights+tis"])
@pytest.mark.parametrize("loss_agg", AGGS)
@pytest.mark.parametrize("policy_loss", list(POLICY_LOSSES))
def test_skipping_leaves_the_step_unchanged(module, policy_loss, loss_agg, weights):
    exp = _experience(module)
    if not weights:
        exp.is_weights = exp.rollout_logprobs = None
    kw = {"policy_loss": policy_loss, "loss_agg": loss_agg, "micro_batch_size": 3}
    kw["rollout_correction"] = "tis" if weights else "none"
    on = _train(module, [exp], skip_zero_advantage_rows=None, **kw)
    off = _train(module, [exp], skip_zero_advantage_rows=False, **kw)
    assert on[2][0]["actor/signal_rows"] == len(SIGNAL)
    assert on[2][0]["actor/signal_frac"] == len(SIGNAL) / len(LENS)
    assert "actor/signal_rows" not in off[2][0]
    assert float(on[0][0].sub(module.initial["model.model.embed_tokens.weight"]).abs().max()) > 0
    _assert_same_run(on, off)
    assert on[2][0]["loss/policy"] == pytest.approx(off[2][0]["loss/policy"], rel=1e-12)


def test_micro_batch_plan_forwards_the_signal_rows_only(module):
    exp = _experience(module)
    module.update_settings(micro_batch_size=2, micro_batch_tokens=None)
    micros = module.train_micro_batches(exp, [1, 2, 3, 8, 11])
    assert [m.batch_size for m in micros] == [2, 2, 1]
    assert torch.equal(micros[2].advantages[0], exp.advantages[11, : micros[2].completion_len])
    assert module.train_micro_batches(exp, []) == [None]  # no signal anywhere: one zero-weight pass


@pytest.mark.parametrize("plan", [{"micro_batch_size": 5}, {"micro_batch_tokens": 12}])
def test_no_signal_step_moves_the_weights_as_without_skipping(module, plan):
    """Step 1 has signal, step 2 none: AdamW's momentum still moves every weight at step 2, by the same amount
    on and off (a skipped optimizer step would leave them)."""
    exps = [_experience(module), _experience(module, seed=1, zero_all=True)]
    kw = {"policy_loss": "ppo_clip", "loss_agg": "token_mean", "micro_batch_size": None, **plan}
    on = _train(module, exps, skip_zero_advantage_rows=True, **kw)
    off = _train(module, exps, skip_zero_advantage_rows=False, **kw)
    assert on[2][1]["actor/signal_rows"] == 0 and on[2][1]["loss/policy"] == 0.0
    one_step = _train(module, exps[:1], skip_zero_advantage_rows=False, **kw)
    assert float((one_step[0][0] - off[0][0]).abs().max()) > 0  # step 2 did move the weights
    _assert_same_run(on, off)


def _zero_row_adds_nothing(name: str, loss_fn=None) -> bool:
    """Numerically: row 1 of the inputs has advantage 0 on every masked-in token; its loss and its gradient
    (w.r.t. the log-probs) are exactly 0, with off-policy ratios and importance weights in play."""
    g = torch.Generator().manual_seed(3)
    lp = (-torch.rand((3, 4), generator=g, dtype=torch.float64) * 3).requires_grad_()
    adv = torch.randn((3, 4), generator=g, dtype=torch.float64)
    adv[1] = 0.0
    inputs = PolicyLossInputs(
        logprobs=lp,
        old_logprobs=lp.detach() + 0.4 * torch.randn((3, 4), generator=g, dtype=torch.float64),
        advantages=adv,
        mask=torch.ones((3, 4), dtype=torch.bool),
        is_weights=torch.rand((3, 4), generator=g, dtype=torch.float64) + 0.5,
        **loss_settings(ObjectiveSettings(policy_loss=name)),
    )
    per_token, _ = (loss_fn or POLICY_LOSSES.get(name))(inputs)
    (grad,) = torch.autograd.grad(per_token.sum(), lp)
    return bool((per_token[1] == 0).all() and (grad[1] == 0).all() and grad[0].abs().sum() > 0)


def test_the_declared_advantage_linear_set_is_the_numerical_property():
    assert {n for n in POLICY_LOSSES if _zero_row_adds_nothing(n)} == ADVANTAGE_LINEAR

    def with_a_length_penalty(inputs):  # an advantage-independent part: the check must see it
        per_token, metrics = POLICY_LOSSES.get("reinforce")(inputs)
        return per_token + 0.01 * inputs.logprobs**2, metrics

    assert not _zero_row_adds_nothing("reinforce", with_a_length_penalty)


def test_a_loss_term_turns_it_off_and_true_is_refused(module):
    exp = _experience(module)
    kw = {"policy_loss": "ppo_clip", "loss_agg": "token_mean", "micro_batch_size": 4}
    _attach(module, Probe())
    try:
        assert not module.skips_zero_advantage_rows()
        auto = _train(module, [exp], skip_zero_advantage_rows=None, **kw)
        off = _train(module, [exp], skip_zero_advantage_rows=False, **kw)
        assert "actor/signal_rows" not in auto[2][0]
        _assert_same_run(auto, off)
        module.update_settings(skip_zero_advantage_rows=True)
        with pytest.raises(
            ValueError,
            match=r"^skip_zero_advantage_rows=true is not exact here: the loss term "
            r"Probe trains zero-advantage rows too; set it to null or false$",
        ):
            module._optimizer_step(torch.optim.AdamW(module.parameters()), None, copy.deepcopy(exp))
    finally:
        _attach(module)


def test_a_loss_outside_the_set_is_off_and_true_refused(tiny_model_dir, monkeypatch):
    import lit_rl.core.signal_rows as config

    monkeypatch.setattr(config, "ADVANTAGE_LINEAR", ADVANTAGE_LINEAR - {"cispo"})
    with pytest.raises(
        ValueError,
        match=r"^skip_zero_advantage_rows=true is not exact here: policy_loss='cispo' "
        r"is not in core.policy_losses.ADVANTAGE_LINEAR; set it to null or false$",
    ):
        PolicyModule(model=str(tiny_model_dir), policy_loss="cispo", skip_zero_advantage_rows=True)
    m = _attach(PolicyModule(model=str(tiny_model_dir), policy_loss="cispo"))
    assert not m.skips_zero_advantage_rows()
    with pytest.raises(ValueError, match="skip_zero_advantage_rows must be true, false or null, got 1"):
        PolicyModule(model=str(tiny_model_dir), skip_zero_advantage_rows=1)


def test_a_critic_turns_it_off(tiny_model_dir):
    from lit_rl.learners import CriticModule

    with pytest.raises(ValueError, match="the loss term CriticModule trains zero-advantage rows too"):
        PolicyModule(model=str(tiny_model_dir), critic=CriticModule(), skip_zero_advantage_rows=True)
    m = _attach(PolicyModule(model=str(tiny_model_dir), critic=CriticModule(), advantage="gae"))
    assert not m.skips_zero_advantage_rows()
    m.update_settings(skip_zero_advantage_rows=True)
    with pytest.raises(ValueError, match="the loss term CriticModule trains zero-advantage rows too"):
        m.skips_zero_advantage_rows()


# ------------------------------------------------------------------ through the Trainer (tests/conformance)
def _conformance():
    sys.path.insert(0, str(HERE / "conformance"))
    import _conformance
    from signal_rows_runner import no_signal_in_group_1

    return _conformance, no_signal_in_group_1


@pytest.mark.parametrize("plan", [{"micro_batch_tokens": 10}, {"micro_batch_size": 2}])
def test_minibatches_and_epochs_each_filter_their_own_rows(tiny_model_dir, plan):
    """grpo recipe, 2 minibatches of 4 shuffled rows x 2 epochs (old log-probs computed once): each of the 4
    optimizer steps' gradients is the same with skipping on and off; 4 signal rows forwarded per epoch."""
    c, no_signal_in_group_1 = _conformance()
    kw = {"minibatch_size": 4, "ppo_epochs": 2, "loss_agg": "token_mean", **plan}
    got = {}
    for skip in (None, False):
        module = c.build_module("grpo", str(tiny_model_dir), skip_zero_advantage_rows=skip, **kw)
        got[skip] = [c.flat(g) for g in c.run_step(module, no_signal_in_group_1(module))]
        logged = module.trainer.callback_metrics
        if skip is None:
            assert float(logged["actor/signal_rows"]) == 8.0  # rows 0-3, once per epoch
            assert float(logged["actor/signal_frac"]) == 0.5
        else:
            assert "actor/signal_rows" not in logged
    assert len(got[None]) == 4
    for on, off in zip(got[None], got[False]):
        assert float(off.abs().max()) > 0
        assert c.max_rel_diff(on, off) <= 1e-12


def test_two_ddp_ranks_one_without_signal(tiny_model_dir, tmp_path):
    """Rank 1 has no signal row: it runs zero-weight passes while rank 0 runs its 4 rows; the averaged gradient
    equals one process on all 8 rows without skipping."""
    c, no_signal_in_group_1 = _conformance()
    from signal_rows_runner import run_ranks

    out = tmp_path / "g.pt"
    run_ranks(out, tiny_model_dir, 2, "null")
    ran = [json.loads(Path(f"{out}.rank{k}.json").read_text()) for k in range(2)]
    assert ran == [[{"real": 4, "zero_weight": 0}], [{"real": 0, "zero_weight": 4}]]
    module = c.build_module(
        "grpo", str(tiny_model_dir), loss_agg="token_mean", skip_zero_advantage_rows=False
    )
    single = c.flat(c.run_step(module, no_signal_in_group_1(module))[0])
    assert float(single.abs().max()) > 0
    assert c.max_rel_diff(torch.load(out), single) <= 1e-10


def test_by_prompt_orders_rows_by_group_stably():
    from lit_rl.core.signal_rows import by_prompt

    gid = torch.tensor([2, 0, 2, 1, 0, 1])  # a shuffled minibatch: rows of three prompts interleaved
    assert by_prompt(gid, None) == [1, 4, 3, 5, 0, 2]
    assert by_prompt(gid, [0, 3, 4]) == [4, 3, 0]  # the signal rows only, same rule
    assert by_prompt(torch.tensor([0, 0, 1, 1]), None) == [0, 1, 2, 3]  # grouped rows: unchanged plan
    assert by_prompt(gid, []) == []
