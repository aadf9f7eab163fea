"""ReferenceKL and EntropyRegularization under truncated sampling, by exact enumeration in float64 (issue 53).

One prompt, one completion position, one row per vocabulary token a (the tiny model's 101 tokens): every
expectation over the sampler π^s is the finite sum Σ_a π^s(a)·(row a's value), so the tests compare the
callback's own outputs, weighted by π^s, with the exact full-vocabulary KL(π‖π_ref) and its gradient computed
here by hand from the materialised float64 logits. The policy samples with top_k 3 (π^s ≠ π); the reference is
the policy with a perturbed LM head.

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
from lit_rl.core.processed import LogitProcessing
from lit_rl.data.experience import Experience
from lit_rl.learners import PolicyModule
from lit_rl.learners.protocols import ForwardNeeds

F64 = torch.float64
PROMPT = [12, 40, 7, 33, 21]
TOP_K = 3
BETA = 0.1


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
    mod.processing = LogitProcessing(temperature=1.0, top_k=top_k)
    mod.temperature = 1.0
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


def _experience(V: int) -> Experience:
    """V rows: the prompt followed by token a in row a (one completion position)."""
    ids = torch.tensor([PROMPT + [a] for a in range(V)], dtype=torch.long)
    return Experience(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.ones(V, 1, dtype=torch.bool),
        prompt_len=len(PROMPT),
        group_ids=torch.zeros(V, dtype=torch.long),
        rewards=torch.zeros(V, dtype=F64),
        valid=torch.ones(V, dtype=torch.bool),
        policy_version=torch.zeros(V, dtype=torch.long),
    )


def _logits(model) -> torch.Tensor:
    """(V,) float64 next-token logits after the prompt (differentiable w.r.t. the model)."""
    return model(input_ids=torch.tensor([PROMPT])).logits[0, -1].to(F64)


def _exact(mod, ref):
    """Hand-computed float64 quantities at the position: KL(π‖π_ref), its gradient w.r.t. the policy's
    parameters, π^s (top-k renormalised, the kept set held fixed) and log π^s (differentiable)."""
    params = [p for p in mod.model.parameters() if p.requires_grad]
    z = _logits(mod.model)
    with torch.no_grad():
        zr = _logits(ref)
    logp, logq = torch.log_softmax(z, -1), torch.log_softmax(zr, -1)
    kl = (logp.exp() * (logp - logq)).sum()
    grad = torch.autograd.grad(kl, params, retain_graph=True)
    keep = torch.zeros_like(z, dtype=torch.bool)
    keep[torch.topk(z.detach(), TOP_K).indices] = True
    log_ps = torch.where(keep, z - torch.logsumexp(z[keep], 0), torch.full_like(z, -torch.inf))
    return float(kl.detach()), torch.cat([g.reshape(-1) for g in grad]), log_ps.exp().detach(), log_ps, params


def _fwd(mod, exp):
    V = exp.batch_size
    fwd, _ = mod._training_forward(exp, {"num_tokens": V, "num_seqs": V, "horizon": None}, ForwardNeeds())
    return fwd


def _flat_grad(loss, params):
    g = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if x is None else x).reshape(-1) for p, x in zip(params, g)])


def _cos_ratio(g, ref):
    return float(g @ ref / (g.norm() * ref.norm())), float(g.norm() / ref.norm())


def test_reward_form_value_and_logged_mean_are_the_exact_kl(tiny_model_dir):
    mod = _module(tiny_model_dir)
    cb = ReferenceKL(where="reward", beta=BETA)  # kind: the default
    _perturbed_reference(cb, mod)
    kl, _, ps, _, _ = _exact(mod, cb.ref)
    exp = _experience(mod.model.config.vocab_size)
    cb.on_experience(None, mod, exp)
    per_row = -exp.token_rewards[:, 0].double() / BETA  # the penalty of the row sampling token a
    expected = float((ps * per_row).sum())  # E_{a ~ π^s}: what a sampled batch averages to
    assert expected == pytest.approx(kl, rel=1e-9), (expected, kl)  # before: 0.2080 vs 0.5270
    fake = FakeLog()
    cb.on_train_batch_end(None, fake, None, object(), 0)
    assert fake.logged["kl/mean"] == pytest.approx(kl, rel=1e-9)


@pytest.mark.parametrize("materialize", [False, True], ids=["chunked_head", "materialised_logits"])
def test_loss_form_value_and_expected_gradient_are_the_exact_kl(tiny_model_dir, materialize):
    mod = _module(tiny_model_dir, materialize)
    cb = ReferenceKL(where="loss", beta=BETA)
    _perturbed_reference(cb, mod)
    kl, grad_kl, ps, _, params = _exact(mod, cb.ref)
    exp = _experience(mod.model.config.vocab_size)
    cb.on_experience(None, mod, exp)
    fwd = _fwd(mod, exp)
    # the module's aggregation replaced by the expectation over a ~ π^s (row a sampled token a)
    mod.aggregate = lambda values, mask, f: (values[:, 0].double() * ps).sum()
    loss = cb.loss_terms(mod, exp, fwd)["kl"]
    assert float(loss) / BETA == pytest.approx(kl, rel=1e-9)
    g = _flat_grad(loss, params)
    cos, ratio = _cos_ratio(g, BETA * grad_kl)
    torch.testing.assert_close(g, BETA * grad_kl, rtol=1e-6, atol=1e-9 * float(grad_kl.abs().max()))
    fake = FakeLog()
    cb.on_train_batch_end(None, fake, None, object(), 0)
    assert fake.logged["kl/mean"] == pytest.approx(kl, rel=1e-9), (cos, ratio)


def test_reward_form_total_gradient_is_beta_grad_kl(tiny_model_dir):
    """What the update does with the reward form, in expectation over a ~ π^s: the policy gradient of the
    penalised reward, −E[∇ log π^s(a) · r(a)] (the ratio's gradient at ratio 1), plus the callback's loss part.
    Minimising it must descend KL(π‖π_ref): the sum equals β∇KL."""
    mod = _module(tiny_model_dir)
    cb = ReferenceKL(where="reward", beta=BETA)
    _perturbed_reference(cb, mod)
    _, grad_kl, ps, log_ps, params = _exact(mod, cb.ref)
    exp = _experience(mod.model.config.vocab_size)
    cb.on_experience(None, mod, exp)
    r = exp.token_rewards[:, 0].double().detach()
    kept = ps > 0
    surrogate = -(ps[kept] * log_ps[kept] * r[kept]).sum()
    fwd = _fwd(mod, exp)
    mod.aggregate = lambda values, mask, f: (values[:, 0].double() * ps).sum()
    parts = cb.loss_terms(mod, exp, fwd)
    if "kl" in parts:
        surrogate = surrogate + parts["kl"]
    g = _flat_grad(surrogate, params)
    cos, ratio = _cos_ratio(g, BETA * grad_kl)
    assert (cos, ratio) == pytest.approx((1.0, 1.0), rel=1e-6)  # before: cosine 0.815, norm ratio 1.220
    torch.testing.assert_close(g, BETA * grad_kl, rtol=1e-6, atol=1e-9 * float(grad_kl.abs().max()))


def test_an_explicit_sampled_estimator_under_truncation_warns_and_is_honoured(tiny_model_dir):
    mod = _module(tiny_model_dir)
    cb = ReferenceKL(where="reward", kind="k3", beta=BETA)
    _perturbed_reference(cb, mod)
    exp = _experience(mod.model.config.vocab_size)
    with pytest.warns(UserWarning, match=r"kind='k3'.*top_k=3.*biased.*kind='exact'"):
        cb.on_experience(None, mod, exp)
    assert exp.ref_logprobs is not None  # the sampled estimator ran, as asked
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per callback
        cb.on_experience(None, mod, _experience(mod.model.config.vocab_size))


def test_auto_is_k3_when_the_sampler_is_the_model(tiny_model_dir):
    """Sampling from softmax(z / T) itself: the sampled estimators are unbiased; the default keeps k3 (cheap,
    GRPO's / TRL's choice) and says so, no warning."""
    mod = _module(tiny_model_dir, top_k=0)
    assert not mod.processing.active
    auto, k3 = ReferenceKL(where="reward", beta=BETA), ReferenceKL(where="reward", kind="k3", beta=BETA)
    _perturbed_reference(auto, mod)
    k3.ref = auto.ref
    a, b = _experience(mod.model.config.vocab_size), _experience(mod.model.config.vocab_size)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        auto.on_experience(None, mod, a)
        k3.on_experience(None, mod, b)
    assert auto.resolved_kind(mod) == "k3"
    assert torch.equal(a.token_rewards, b.token_rewards)


@pytest.mark.parametrize("materialize", [False, True], ids=["chunked_head", "materialised_logits"])
def test_entropy_is_the_full_softmax_entropy_under_truncation(tiny_model_dir, materialize):
    """The entropy metric and bonus are H(π) of the model's full softmax(z / T) at each position, not the
    entropy of the truncated sampler π^s; the bonus's gradient is −α∇H(π)."""
    mod = _module(tiny_model_dir, materialize)
    params = [p for p in mod.model.parameters() if p.requires_grad]
    z = _logits(mod.model)
    logp = torch.log_softmax(z, -1)
    h = -(logp.exp() * logp).sum()
    grad_h = torch.cat([g.reshape(-1) for g in torch.autograd.grad(h, params)])
    exp = _experience(mod.model.config.vocab_size)
    fwd = _fwd(mod, exp)
    cb = EntropyRegularization(coef=0.05)
    loss = cb.loss_terms(mod, exp, fwd)["entropy"]
    g = _flat_grad(loss, params)
    torch.testing.assert_close(g, -0.05 * grad_h, rtol=1e-6, atol=1e-9 * float(grad_h.abs().max()))
    fake = FakeLog()
    cb.on_train_batch_end(None, fake, None, None, 0)
    assert fake.logged["entropy/mean"] == pytest.approx(float(h), rel=1e-9)
