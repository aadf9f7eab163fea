"""ReferenceKL and EntropyRegularization: hand-computed terms, hook order, controller state, YAML composition."""

import functools
import math

import lightning as L
import pytest
import torch

from lit_rl.callbacks import RolloutCallback
from lit_rl.callbacks.entropy import EntropyRegularization
from lit_rl.callbacks.reference_kl import ReferenceKL
from lit_rl.core.aggregation import aggregate
from lit_rl.core.processed import LogitProcessing
from lit_rl.data import PromptDataModule
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import PromptBatch
from lit_rl.learners import PolicyModule
from lit_rl.learners.config import PolicyConfig
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout import SamplingConfig

TASK = {"answer_width": 1, "max_sum": 9}


def _trainer(callbacks, steps=1):
    return L.Trainer(
        max_steps=steps,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )


def _rollout():
    return RolloutCallback(
        rewards=ExactAnswerReward(), group_size=4, sampling=SamplingConfig(max_new_tokens=2)
    )


def _module(path, **kw):
    kw.setdefault("optimizer", functools.partial(torch.optim.AdamW, lr=1e-2))
    return PolicyModule(model=str(path), **kw)


def _experience(B=3, P=3, C=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 40, (B, P + C), generator=g)
    loss_mask = torch.ones(B, C, dtype=torch.bool)
    loss_mask[1, 2:] = False  # row 1 is shorter: padding columns
    att = torch.ones(B, P + C, dtype=torch.long)
    att[1, P + 2 :] = 0
    ids[1, P + 2 :] = 0
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss_mask,
        prompt_len=P,
        group_ids=torch.zeros(B, dtype=torch.long),
        rewards=torch.ones(B, dtype=torch.float64),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )


class FakeModule:
    """Just what the controllers' end-of-batch hooks touch."""

    def __init__(self):
        self.logged = {}

    def log(self, name, value, **kw):
        self.logged[name] = value


# ------------------------------------------------------------------------------ ReferenceKL
def test_reference_is_a_frozen_copy_and_matches_the_initial_policy(tiny_model_dir):
    mod = _module(tiny_model_dir)
    cb = ReferenceKL()
    exp = _experience()
    cb.on_experience(None, mod, exp)
    assert exp.ref_logprobs.shape == (3, 4) and exp.ref_logprobs.dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(exp.ref_logprobs, mod.completion_logprobs(exp).float())
    assert all(not p.requires_grad for p in cb.ref.parameters())
    with torch.no_grad():  # training the policy must not move the reference
        next(mod.model.parameters()).add_(1.0)
    assert not torch.equal(next(mod.model.parameters()), next(cb.ref.parameters()))


def test_reference_copy_follows_the_policy_into_float64_under_64_true(tiny_model_dir):
    """The copy is taken at setup, before Lightning converts the policy to float64: the reference must follow
    (a float32 reference rounded every ref_logprobs to float32; seen as a 2e-8 gradient difference)."""
    seen = {}

    class Spy(L.Callback):  # after ReferenceKL: the Experience already carries ref_logprobs
        def on_experience(self, trainer, module, exp):
            with torch.no_grad():
                seen["policy"] = module.completion_logprobs(exp)
            seen["ref"] = exp.ref_logprobs

    mod = _module(tiny_model_dir)
    cb = ReferenceKL(where="loss", kind="k3", beta=0.1)
    trainer = L.Trainer(
        max_steps=1,
        max_epochs=-1,
        accelerator="cpu",
        precision="64-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_rollout(), cb, Spy()],
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
    assert {p.dtype for p in cb.ref.parameters()} == {torch.float64}
    assert seen["ref"].dtype == torch.float64 and seen["policy"].dtype == torch.float64
    # reference == initial policy, both float64: equal to float64 rounding, not float32's 1e-7
    assert float((seen["ref"] - seen["policy"]).abs().max()) < 1e-12


def test_explicit_reference_dtype_is_kept(tiny_model_dir):
    mod = _module(tiny_model_dir)  # float32 policy
    cb = ReferenceKL(dtype="bfloat16")  # also for the copy of the policy (path=None)
    exp = _experience()
    cb.on_experience(None, mod, exp)
    assert {p.dtype for p in cb.ref.parameters()} == {
        torch.bfloat16
    } and exp.ref_logprobs.dtype == torch.float32
    with torch.no_grad():
        gap = float((exp.ref_logprobs - mod.completion_logprobs(exp)).abs().max())
    assert 0 < gap < 0.5  # a bf16 copy of the same weights: close, not equal


@pytest.mark.parametrize("kind, k", [("k1", 0.25), ("k2", 0.5 * 0.25**2), ("k3", math.exp(-0.25) - 1 + 0.25)])
def test_where_reward_adds_exactly_minus_beta_k(tiny_model_dir, kind, k):
    mod = _module(tiny_model_dir)
    cb = ReferenceKL(kind=kind, where="reward", beta=0.1)
    exp = _experience()
    cb.ref = cb.build_reference(mod)
    ref = cb.reference_logprobs(mod, exp).double()
    # the rollout policy puts log-prob +0.25 above the reference on every token: log r = -0.25 exactly
    exp.rollout_logprobs = ref + 0.25
    base = torch.arange(12, dtype=torch.float64).reshape(3, 4) / 10
    exp.token_rewards = base.clone()
    cb.on_experience(None, mod, exp)
    expected = torch.where(exp.loss_mask, base - 0.1 * k, base)  # padding columns untouched
    torch.testing.assert_close(exp.token_rewards, expected, rtol=1e-12, atol=1e-15)
    # without prior token rewards they start from zero
    exp.token_rewards = None
    cb.on_experience(None, mod, exp)
    torch.testing.assert_close(
        exp.token_rewards.double(), torch.where(exp.loss_mask, -0.1 * k, 0.0).double(), rtol=1e-6, atol=0
    )


def test_where_loss_term_is_beta_times_aggregated_k3(tiny_model_dir):
    mod = _module(tiny_model_dir, loss_agg="seq_mean_token_mean")
    cb = ReferenceKL(kind="k3", where="loss", beta=0.2)
    exp = _experience()
    exp.ref_logprobs = torch.zeros(3, 4, dtype=torch.float64)
    d = torch.tensor(
        [[0.1, -0.2, 0.3, 0.0], [0.5, 0.4, 9.0, 9.0], [-0.1, 0.2, -0.3, 0.6]], dtype=torch.float64
    )
    lp = d.clone().requires_grad_(True)  # log r = -d
    fwd = {"logprobs": lp, "mask": exp.loss_mask, "num_tokens": 10, "num_seqs": 3}
    out = cb.loss_terms(mod, exp, fwd)
    k3 = [[math.exp(-x) - 1 + x for x in row] for row in d.tolist()]
    per_seq = [sum(k3[0]) / 4, (k3[1][0] + k3[1][1]) / 2, sum(k3[2]) / 4]
    assert float(out["kl"].detach()) == pytest.approx(0.2 * sum(per_seq) / 3, rel=1e-12)
    out["kl"].backward()
    assert lp.grad[1, 2:].abs().max() == 0  # padding gets no gradient
    assert ReferenceKL(where="reward").loss_terms(mod, exp, fwd) == {}


def test_adaptive_beta_moves_toward_target_and_state_round_trips():
    cb = ReferenceKL(beta=0.1, target_kl=0.1, horizon=10)
    cb._accumulate(torch.tensor([[0.5, 0.5, 7.0]]), torch.tensor([[True, True, False]]), rows=2)
    fake = FakeModule()
    cb.on_train_batch_end(None, fake, None, PromptBatch([]), 0)
    assert fake.logged == {"kl/mean": 0.5, "kl/beta": 0.1}
    assert cb.beta == pytest.approx(0.1 * (1 + 0.2 * 2 / 10), rel=1e-12)  # error 4 clipped to 0.2
    other = ReferenceKL(beta=0.1, target_kl=0.1, horizon=10)
    other.load_state_dict(cb.state_dict())
    assert other.beta == cb.beta


def test_k1_in_the_loss_is_rejected_with_the_reason_and_the_alternatives():
    """k1's expected gradient as a loss is 0 (tests/core/test_kl_gradients.py): a silent no-op penalty."""
    with pytest.raises(
        ValueError, match=r"kind='k1', where='loss'.*zero expected gradient.*where='reward'.*'k2' / 'k3'"
    ):
        ReferenceKL(kind="k1", where="loss")
    with pytest.raises(ValueError, match="kind='k1', where='loss'"):
        ReferenceKL(kind="k1")  # where defaults to "loss"
    assert ReferenceKL(kind="k1", where="reward").kind == "k1"
    assert ReferenceKL(kind="k2", where="loss").kind == "k2"


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"kind": "k4"}, "kind='k4'.*k1, k2, k3"),
        ({"where": "advantage"}, "where='advantage'.*reward, loss"),
        ({"beta": -1.0}, "beta"),
        ({"target_kl": 0.0}, "target_kl"),
    ],
)
def test_reference_kl_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReferenceKL(**kwargs)


def test_ref_logprobs_are_set_before_advantages_in_a_real_run(tiny_model_dir):
    seen = []

    class Spy(L.Callback):  # after ReferenceKL in trainer.callbacks: sees its annotation, before advantages
        def on_experience(self, trainer, module, exp):
            seen.append((exp.ref_logprobs is not None, exp.token_rewards is not None, exp.advantages is None))

    class Probe(PolicyModule):
        def training_step(self, batch, batch_idx):
            e = batch.experience
            seen.append(("train", e.ref_logprobs.shape == e.loss_mask.shape, e.advantages is not None))
            return super().training_step(batch, batch_idx)

    mod = Probe(model=str(tiny_model_dir), optimizer=functools.partial(torch.optim.AdamW, lr=1e-2))
    trainer = _trainer(
        [
            _rollout(),
            ReferenceKL(where="reward", kind="k1", target_kl=0.01),
            Spy(),
            EntropyRegularization(coef=0.01, band=(10.0, 20.0), step=0.001, coef_max=0.1),
        ]
    )
    trainer.fit(mod, datamodule=PromptDataModule(task_args=TASK, batch_size=2))
    assert seen == [(True, True, True), ("train", True, True)]
    m = trainer.callback_metrics
    assert {"kl/mean", "kl/beta", "entropy/mean", "entropy/coef"} <= set(m)
    # reference == policy at the first rollout (the engine's generate() log-probs differ only by rounding)
    assert abs(float(m["kl/mean"])) < 1e-6
    assert float(m["entropy/coef"]) == pytest.approx(0.01)
    ent_cb = next(cb for cb in trainer.callbacks if isinstance(cb, EntropyRegularization))
    assert ent_cb.coef == pytest.approx(0.011, rel=1e-12)  # entropy < 10 nats: the bonus was raised


# ---------------------------------------------------------------------------- Entropy
def test_entropy_term_is_minus_coef_times_aggregated_entropy():
    logits = torch.tensor(
        [[[0.0, 0.0], [math.log(3.0), 0.0]], [[1.0, -1.0], [5.0, 5.0]]], dtype=torch.float64
    )
    mask = torch.tensor([[True, True], [True, False]])

    class Mod:
        temperature = 1.0
        config = PolicyConfig.of("m")

        def aggregate(self, values, m, fwd):
            return aggregate(values, m, "token_mean", num_tokens=fwd["num_tokens"], num_seqs=fwd["num_seqs"])

    def h(p):
        return -(p * math.log(p) + (1 - p) * math.log(1 - p))

    expected_mean = (math.log(2) + h(0.75) + h(1 / (1 + math.exp(-2)))) / 3
    lg = logits.clone().requires_grad_(True)
    fwd = {"logits": lg, "mask": mask, "num_tokens": 3, "num_seqs": 2}
    cb = EntropyRegularization(coef=0.05)
    out = cb.loss_terms(Mod(), type("M", (), {"batch_size": 2})(), fwd)
    assert float(out["entropy"]) == pytest.approx(-0.05 * expected_mean, rel=1e-12)
    out["entropy"].backward()
    assert lg.grad[1, 1].abs().max() == 0  # masked position: no gradient
    fake = FakeModule()
    cb.on_train_batch_end(None, fake, None, None, 0)
    assert fake.logged["entropy/mean"] == pytest.approx(expected_mean, rel=1e-12)
    assert fake.logged["entropy/coef"] == 0.05 and cb.coef == 0.05  # fixed coefficient never moves


@pytest.mark.parametrize("ent, expected", [(0.2, 0.006), (0.9, 0.004), (0.5, 0.005)])
def test_adaptive_entropy_coef_each_direction(ent, expected):
    cb = EntropyRegularization(coef=0.005, band=(0.3, 0.8), step=0.001, coef_max=0.01)
    cb._accumulate(torch.tensor([ent, 99.0], dtype=torch.float64), torch.tensor([True, False]), rows=1)
    cb.on_train_batch_end(None, FakeModule(), None, None, 0)
    assert cb.coef == pytest.approx(expected, rel=1e-12)
    restored = EntropyRegularization(coef=0.0, band=(0.3, 0.8), step=0.001, coef_max=0.01)
    restored.load_state_dict(cb.state_dict())
    assert restored.coef == cb.coef


# ------------------------------------------------------------------ YAML fragments + CLI
def test_fragments_compose_with_grpo_config(tiny_model_dir, tmp_path):
    from lit_rl.cli import main

    main(
        [
            "fit",
            "-c",
            "configs/grpo.yaml",
            "-c",
            "callbacks/reference_kl.yaml",
            "-c",
            "callbacks/entropy.yaml",
            "--trainer.max_steps",
            "2",
            "--trainer.logger",
            "false",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.default_root_dir",
            str(tmp_path),
            "--model.init_args.model",
            str(tiny_model_dir),
            "--data.init_args.batch_size",
            "2",
        ]
    )
    saved = (tmp_path / "config.yaml").read_text()
    assert "lit_rl.callbacks.reference_kl.ReferenceKL" in saved
    assert (
        "lit_rl.callbacks.entropy.EntropyRegularization" in saved and "\nrollout:\n" in saved
    )  # its own section


class AggModule:
    temperature = 1.0
    processing = LogitProcessing()  # a learner's sampler (PolicyModule reads it from its rollout binding)
    config = PolicyConfig.of("m")

    def aggregate(self, values, m, fwd):
        return aggregate(
            values, m, "seq_mean_token_mean", num_tokens=fwd["num_tokens"], num_seqs=fwd["num_seqs"]
        )


def test_kl_and_entropy_terms_are_padding_invariant():
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    ref = -torch.rand(2, 3, generator=g, dtype=torch.float64)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    micro = type("M", (), {"batch_size": 2})()

    def terms(lp, ref, logits, mask):
        fwd = {"logprobs": lp, "logits": logits, "mask": mask, "num_tokens": int(mask.sum()), "num_seqs": 2}
        micro.ref_logprobs = ref
        return (
            float(ReferenceKL(kind="k3", beta=0.3).loss_terms(AggModule(), micro, fwd)["kl"]),
            float(EntropyRegularization(coef=0.2).loss_terms(AggModule(), micro, fwd)["entropy"]),
        )

    base = terms(lp, ref, logits, mask)
    pad = torch.full((2, 2), -50.0, dtype=torch.float64)  # garbage in two appended padding columns
    padded = terms(
        torch.cat([lp, pad], 1),
        torch.cat([ref, -pad], 1),
        torch.cat([logits, 40 * torch.randn(2, 2, 5, generator=g, dtype=torch.float64)], 1),
        torch.cat([mask, torch.zeros(2, 2, dtype=torch.bool)], 1),
    )
    assert padded == pytest.approx(base, rel=1e-12, abs=0)
