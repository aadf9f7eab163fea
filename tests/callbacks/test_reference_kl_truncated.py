"""ReferenceKL and EntropyRegularization under truncated sampling, by exact enumeration in float64 (issue 53).

One prompt, one completion position, one row per token a of the sampler's kept set K (rows outside K are never
sampled): every expectation over the sampler π^s is the finite sum Σ_{a∈K} π^s(a)·(row a's value), so the tests
compare the callback's own outputs, weighted by π^s, with the exact KL(π‖π_ref) over the tiny model's 101 tokens
and its gradient, computed here by hand from the materialised float64 logits. The policy samples with top_k 3
(π^s ≠ π); the reference is the policy with a perturbed LM head.

Before the fix (the sampled k3 estimator, then the default, under top_k 3; KL(π‖π_ref) = 0.5270 at the position):
reward form E_π^s[k3] = 0.2080 (k1 0.5079, k2 0.3741); loss form's expected gradient at cosine 0.395 / norm
ratio 0.714 to β∇KL (k2: 0.629 / 1.789); reward form's expected policy gradient at cosine 0.815 / norm ratio
1.220 (k1: 0.816 / 1.834). After (``auto`` → ``exact``): the KL to rtol 1e-9, gradients to rtol 1e-6.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch

from lit_rl.callbacks.entropy import EntropyRegularization
from lit_rl.callbacks.reference_kl import ReferenceKL
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import PromptBatch
from lit_rl.learners import PolicyModule
from lit_rl.learners.protocols import ForwardNeeds
from lit_rl.rollout.engine import SamplingConfig
from tests._binding import bind_sampling
from tests._float64 import float64_rmsnorm

F64 = torch.float64
PROMPT = [12, 40, 7, 33, 21]
TOP_K = 3
BETA = 0.1


@pytest.fixture(autouse=True)
def _float64_norm():  # the hand-computed and the module's forwards lay rows out differently: float64 throughout
    with float64_rmsnorm():
        yield


class FakeLog:
    def __init__(self):
        self.logged = {}

    def log(self, name, value, **kw):
        self.logged[name] = value


def _module(tiny_model_dir, materialize: bool = False, top_k: int = TOP_K):
    mod = PolicyModule(model=str(tiny_model_dir), optimizer=functools.partial(torch.optim.SGD, lr=0.0))
    mod.model.double()
    head = mod.model.get_output_embeddings().weight  # tied to the embeddings: a less uniform policy
    with torch.no_grad():
        head.add_(0.08 * torch.randn(head.shape, generator=torch.Generator().manual_seed(1), dtype=F64))
    mod.materialize_logits = materialize
    bind_sampling(mod, SamplingConfig(temperature=1.0, top_k=top_k))
    return mod


def _perturbed_reference(cb: ReferenceKL, mod) -> None:
    ref = cb.build_reference(mod).double()
    g = torch.Generator().manual_seed(3)
    head = ref.get_output_embeddings().weight
    with torch.no_grad():  # another head (untied from the reference's embeddings): KL(π‖π_ref) ≈ 0.5
        ref.get_output_embeddings().weight = torch.nn.Parameter(
            head + 0.15 * torch.randn(head.shape, generator=g, dtype=F64), requires_grad=False
        )
    cb.ref = ref


def _experience(tokens: list[int]) -> Experience:
    """One row per token a: the prompt followed by a (one completion position)."""
    ids = torch.tensor([PROMPT + [a] for a in tokens], dtype=torch.long)
    B = len(tokens)
    return Experience(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.ones(B, 1, dtype=torch.bool),
        prompt_len=len(PROMPT),
        group_ids=torch.zeros(B, dtype=torch.long),
        rewards=torch.zeros(B, dtype=F64),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
    )


def _logits(model) -> torch.Tensor:
    """(V,) float64 next-token logits after the prompt (differentiable w.r.t. the model)."""
    return model(input_ids=torch.tensor([PROMPT])).logits[0, -1].to(F64)


class Exact:
    """Hand-computed float64 quantities at the position: KL(π‖π_ref) and ∇KL w.r.t. the policy's parameters,
    H(π) and ∇H, the kept set K (top-k of π), π^s on K and log π^s (differentiable, K held fixed)."""

    def __init__(self, mod, ref):
        self.params = [p for p in mod.model.parameters() if p.requires_grad]
        z = _logits(mod.model)
        with torch.no_grad():
            zr = _logits(ref)
        logp, logq = torch.log_softmax(z, -1), torch.log_softmax(zr, -1)
        kl = (logp.exp() * (logp - logq)).sum()
        h = -(logp.exp() * logp).sum()
        self.kl, self.h = float(kl.detach()), float(h.detach())
        self.grad_kl = _flat(torch.autograd.grad(kl, self.params, retain_graph=True))
        self.grad_h = _flat(torch.autograd.grad(h, self.params, retain_graph=True))
        self.kept = torch.topk(z.detach(), TOP_K).indices.tolist()
        self.log_ps = z[self.kept] - torch.logsumexp(z[self.kept], 0)  # (K,) row order = self.kept
        self.ps = self.log_ps.exp().detach()


def _flat(grads):
    return torch.cat([g.reshape(-1) for g in grads])


def _fwd(mod, exp):
    B = exp.batch_size
    fwd, _ = mod._training_forward(exp, {"num_tokens": B, "num_seqs": B, "horizon": None}, ForwardNeeds())
    return fwd


def _expectation(mod, ps) -> None:
    """The module's aggregation replaced by the expectation over a ~ π^s (row a sampled token a)."""
    mod.aggregate = lambda values, mask, f: (values[:, 0].double() * ps).sum()


def _flat_grad(loss, params):
    g = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    return torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1) for p, x in zip(params, g)])


def _cos_ratio(g, ref):
    return float(g @ ref / (g.norm() * ref.norm())), float(g.norm() / ref.norm())


def _close(g, ref):
    torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-9 * float(ref.abs().max()))


def test_reward_form_value_logged_mean_and_total_gradient_are_the_exact_kls(tiny_model_dir):
    """Value: E_{a~π^s}[KL penalty of row a] and ``kl/mean`` = KL(π‖π_ref). Gradient, what the update does with
    the reward form in expectation: the policy gradient of the penalised reward, −E[∇log π^s(a)·r(a)] (the
    ratio's gradient at ratio 1), plus the callback's loss part; minimising it must descend the KL: = β∇KL."""
    mod = _module(tiny_model_dir)
    cb = ReferenceKL(where="reward", beta=BETA)  # kind: the default
    _perturbed_reference(cb, mod)
    ex = Exact(mod, cb.ref)
    exp = _experience(ex.kept)
    cb.on_experience(None, mod, exp)
    r = exp.token_rewards[:, 0].double()
    expected = float((ex.ps * -r / BETA).sum())  # E_{a ~ π^s}: what a sampled batch averages to
    assert expected == pytest.approx(ex.kl, rel=1e-9), (expected, ex.kl)  # before: 0.2080 vs 0.5270
    fake = FakeLog()
    cb.on_train_batch_end(None, fake, None, PromptBatch([]), 0)
    assert fake.logged["kl/mean"] == pytest.approx(ex.kl, rel=1e-9)
    surrogate = -(ex.ps * ex.log_ps * r.detach()).sum()
    _expectation(mod, ex.ps)
    parts = cb.loss_terms(mod, exp, _fwd(mod, exp))
    if "kl" in parts:
        surrogate = surrogate + parts["kl"]
    g = _flat_grad(surrogate, ex.params)
    cos, ratio = _cos_ratio(g, BETA * ex.grad_kl)
    assert (cos, ratio) == pytest.approx((1.0, 1.0), rel=1e-6)  # before: cosine 0.815, norm ratio 1.220
    _close(g, BETA * ex.grad_kl)


@pytest.mark.parametrize("materialize", [False, True], ids=["chunked_head", "materialised_logits"])
def test_loss_form_and_entropy_values_and_gradients_are_exact(tiny_model_dir, materialize):
    """Loss form: the value and the expected gradient of β·KL are β·KL(π‖π_ref) and β∇KL (before: cosine 0.395,
    norm ratio 0.714). Entropy: the metric and the bonus are H(π) of the model's full softmax(z / T), not the
    entropy of π^s over K, and the bonus's gradient is −α∇H(π)."""
    mod = _module(tiny_model_dir, materialize)
    cb = ReferenceKL(where="loss", beta=BETA)
    _perturbed_reference(cb, mod)
    ex = Exact(mod, cb.ref)
    exp = _experience(ex.kept)
    cb.on_experience(None, mod, exp)
    fwd = _fwd(mod, exp)
    _expectation(mod, ex.ps)
    loss = cb.loss_terms(mod, exp, fwd)["kl"]
    assert float(loss) / BETA == pytest.approx(ex.kl, rel=1e-9)  # before: 0.2080 vs 0.5270
    g = _flat_grad(loss, ex.params)
    cos, ratio = _cos_ratio(g, BETA * ex.grad_kl)
    _close(g, BETA * ex.grad_kl)
    fake = FakeLog()
    cb.on_train_batch_end(None, fake, None, PromptBatch([]), 0)
    assert fake.logged["kl/mean"] == pytest.approx(ex.kl, rel=1e-9), (cos, ratio)
    ent = EntropyRegularization(coef=0.05)
    bonus = ent.loss_terms(mod, exp, fwd)["entropy"]
    _close(_flat_grad(bonus, ex.params), -0.05 * ex.grad_h)
    ent.on_train_batch_end(None, fake, None, None, 0)
    assert fake.logged["entropy/mean"] == pytest.approx(ex.h, rel=1e-9)


def test_sampled_estimators_warn_under_truncation_and_auto_is_k3_without(tiny_model_dir):
    """An explicit k1/k2/k3 under a truncating sampler is honoured with one warning. Sampling from softmax(z / T)
    itself, the sampled estimators are unbiased: the default keeps k3 there (cheap, GRPO's / TRL's choice)."""
    mod = _module(tiny_model_dir)
    cb = ReferenceKL(where="reward", kind="k3", beta=BETA)
    _perturbed_reference(cb, mod)
    rows = [3, 50, 77]
    exp = _experience(rows)
    with pytest.warns(UserWarning, match=r"kind='k3'.*top_k=3.*biased.*kind='exact'"):
        cb.on_experience(None, mod, exp)
    assert exp.ref_logprobs is not None  # the sampled estimator ran, as asked
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per callback
        cb.on_experience(None, mod, _experience(rows))
    bind_sampling(mod, SamplingConfig(temperature=1.0))
    auto = ReferenceKL(where="reward", beta=BETA)
    auto.ref = cb.ref
    a, b = _experience(rows), _experience(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto.on_experience(None, mod, a)
        cb.on_experience(None, mod, b)
    assert auto.resolved_kind(mod) == "k3"
    assert torch.equal(a.token_rewards, b.token_rewards)
