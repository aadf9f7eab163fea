"""The ``LossTerm`` contract (``learners/protocols.py``) as ``PolicyModule._micro_loss`` applies it to every
term, a callback's as the module's own: declared forward needs are honoured, ``trains_alone`` zeroes the other
parts, two parts of one name and an undeclared term are errors. The policy part is hand-computed: advantages
1, no old log-probs (ratio 1), ppo_clip with token_mean over the C trainable tokens gives L_policy = −1."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lit_rl.data.experience import Experience
from lit_rl.learners import CriticModule, DistillModule, LossTerm, PolicyModule
from lit_rl.learners.distill import STUDENT_DISTILLATION
from lit_rl.learners.protocols import ForwardNeeds, forward_needs

C = 4


class Probe(L.Callback, LossTerm):
    """``{name: coef · Σ log π}`` over the trainable tokens; records the ``fwd`` it was handed."""

    def __init__(self, coef: float = 1.0, name: str = "probe", hidden: bool = False, alone: bool = False):
        self.coef, self.name, self.hidden, self.alone = coef, name, hidden, alone
        self.seen: list[dict] = []

    def needs(self) -> ForwardNeeds:
        return ForwardNeeds(hidden=self.hidden)

    def trains_alone(self, module) -> bool:
        return self.alone

    def loss_terms(self, module, micro, fwd):
        self.seen.append(dict(fwd))
        return {self.name: self.coef * (fwd["logprobs"] * fwd["mask"]).sum()}


def _module(tiny_model_dir, *callbacks) -> PolicyModule:
    m = PolicyModule(model=str(tiny_model_dir))
    m._trainer = SimpleNamespace(callbacks=list(callbacks), world_size=1)  # what _micro_loss reads
    return m


def _micro() -> Experience:
    ids = torch.randint(5, 60, (1, 3 + C), generator=torch.Generator().manual_seed(1))
    exp = Experience(
        input_ids=ids,
        attention_mask=torch.ones(1, 3 + C, dtype=torch.long),
        loss_mask=torch.ones(1, C, dtype=torch.bool),
        prompt_len=3,
        group_ids=torch.zeros(1, dtype=torch.long),
        rewards=torch.ones(1),
        valid=torch.ones(1, dtype=torch.bool),
        policy_version=torch.zeros(1, dtype=torch.long),
    )
    exp.advantages = torch.ones(1, C)
    return exp


COMMON = {"num_tokens": float(C), "num_seqs": 1.0}


def test_a_callback_term_declaring_hidden_states_gets_them(tiny_model_dir):
    """On the materialised-logits path hidden states are returned only when some term declares it needs them
    (the chunked path always has them: its head projects them)."""
    wants, plain = Probe(hidden=True, name="a"), Probe(name="b")
    m = _module(tiny_model_dir, plain, wants)
    m.materialize_logits = True
    m._micro_loss(_micro(), COMMON)
    hidden = wants.seen[0]["hidden"]
    assert hidden is not None and tuple(hidden.shape) == (1, C, m.model.config.hidden_size)
    assert plain.seen[0]["hidden"] is hidden  # one shared forward for every term

    alone = Probe()
    m = _module(tiny_model_dir, alone)
    m.materialize_logits = True
    m._micro_loss(_micro(), COMMON)
    assert alone.seen[0]["hidden"] is None  # nobody declared it: the forward keeps no hidden states


def test_a_term_that_trains_alone_zeroes_every_other_part(tiny_model_dir):
    parts = _module(tiny_model_dir, Probe(coef=2.0))._micro_loss(_micro(), COMMON)
    assert float(parts["policy"].detach()) == pytest.approx(-1.0, abs=1e-6)
    probe = float(parts["probe"].detach())
    assert probe < 0  # 2 · Σ log π of 4 tokens

    m = _module(tiny_model_dir, Probe(coef=2.0, alone=True), Probe(name="other"))
    parts = m._micro_loss(_micro(), COMMON)
    assert float(parts["policy"].detach()) == 0.0 and float(parts["other"].detach()) == 0.0
    assert float(parts["probe"].detach()) == pytest.approx(probe, rel=1e-6)
    assert parts["policy"].requires_grad  # still in the graph, multiplied by 0


def test_two_parts_of_one_name_are_an_error(tiny_model_dir):
    m = _module(tiny_model_dir, Probe(name="kl"), Probe(name="kl"))
    with pytest.raises(ValueError, match="Probe adds the loss part 'kl', which another term"):
        m._micro_loss(_micro(), COMMON)
    with pytest.raises(ValueError, match="loss part 'policy'"):
        _module(tiny_model_dir, Probe(name="policy"))._micro_loss(_micro(), COMMON)


def test_a_callback_with_loss_terms_that_is_no_loss_term_is_an_error(tiny_model_dir):
    class Undeclared(L.Callback):
        def loss_terms(self, module, micro, fwd):
            return {"x": fwd["logprobs"].sum()}

    with pytest.raises(TypeError, match="Undeclared defines loss_terms but is not a LossTerm: subclass"):
        _module(tiny_model_dir, Undeclared())._micro_loss(_micro(), COMMON)


def test_a_loss_term_must_implement_loss_terms():
    class Empty(LossTerm):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Empty()


def test_the_critic_declares_what_it_reads_from_the_shared_forward():
    reg, tok = CriticModule(head="regression"), CriticModule(head="token")
    own = CriticModule(head="regression", share_backbone=False)
    assert reg.needs() == ForwardNeeds(hidden=True, cache=False)
    assert tok.needs() == ForwardNeeds(hidden=False, cache=True)
    assert own.needs() == ForwardNeeds()  # its own backbone runs its own forward
    assert forward_needs([reg, tok]) == ForwardNeeds(hidden=True, cache=True)
    assert forward_needs([Probe(), own]) == ForwardNeeds()


def test_default_hooks_do_nothing():
    p = Probe()
    assert p.advantage_metrics(None) == {} and p.bootstrap_rows(None) is None
    assert p.bind(None) is None and p.on_experience(None, None, None) is None


def test_distill_module_owns_its_student_distillation_first(tiny_model_dir):
    m = DistillModule(model=str(tiny_model_dir))
    assert m.own_loss_terms == [STUDENT_DISTILLATION]
    assert PolicyModule(model=str(tiny_model_dir)).own_loss_terms == []
