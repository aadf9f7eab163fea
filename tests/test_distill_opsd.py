"""On-policy self-distillation (OPSD) as ``scripts/experts_to_student.py`` runs it, checked by hand in float64 on a
tiny chat model: the ``self`` teacher reads the chat prompt with the script's privileged template appended to the
user turn, scores exactly the student's completion tokens (entry t predicts token t), and the module's gradient
is −(1/N) Σ A_t ∇log π(y_t) with A_t = (log π_T − log π_S)(y_t) minus the leave-one-out mean of the group's other
rows at t, over real completion tokens only. Every reference below is computed from unpadded single-row forwards
of hand-written ChatML text, not through the code under test."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lit_rl.callbacks.teacher_inputs import teacher_view
from lit_rl.callbacks.teachers import Teacher, TeacherRouter, _pack
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.learners.distill import DistillModule
from tests._binding import bind_sampling
from tests._float64 import float64_rmsnorm

ROOT = Path(__file__).resolve().parents[1]


def _privileged() -> str:
    spec = importlib.util.spec_from_file_location("e2s", ROOT / "scripts/experts_to_student.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.PRIVILEGED


PRIVILEGED = _privileged()
ADD = Prompt(messages=[{"role": "user", "content": "12+5?"}], answer="17", domain="addition", uid="a")
SYS = Prompt(
    messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+4?"}],
    answer="7",
    domain="addition",
    uid="b",
)
# (prompt, completion text, ends with eos): groups of 2 and 3 rows, lengths 2-5, one row cut by the budget
ROWS = [(ADD, "17", True), (ADD, "18!?", True), (SYS, "7", True), (SYS, "9", True), (SYS, "7 ok", False)]
GROUPS = [0, 0, 1, 1, 1]


class _Grads(torch.optim.Optimizer):
    """Keeps the gradient the step would apply (after the module's clipping) and leaves the weights alone."""

    def __init__(self, params):
        super().__init__(params, {})
        self.grads: list[torch.Tensor] = []

    def step(self, closure=None):
        self.grads = [p.grad.clone() for g in self.param_groups for p in g["params"]]


@pytest.fixture(autouse=True, scope="module")
def _rmsnorm_float64():
    with (
        float64_rmsnorm()
    ):  # the tiny qwen2's RMSNorm in float64: padded, packed and single rows agree to 1e-15
        yield


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    m = DistillModule(
        model=str(tiny_model_dir), losses={"reverse_kl_sampled": 1.0}, opd_baseline=True, max_grad_norm=1e9
    ).double()  # what a Trainer's precision 64-true does; no clipping so the raw gradient comes out
    m._trainer = SimpleNamespace(callbacks=[], world_size=1, strategy=None)
    m.manual_backward = lambda loss: loss.backward()
    router = TeacherRouter({"addition": Teacher("self", template=PRIVILEGED)})
    router.setup(None, m, "fit")
    bind_sampling(m, teacher_router=router)  # RolloutCallback.setup's binding: the router for the module
    m.setup("fit")
    tok = m.tokenizer
    comps = [
        tok(c, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else [])
        for _, c, eos in ROWS
    ]
    exp = _pack(
        tok, [render_prompt(p, tok) for p, _, _ in ROWS], comps, [p for p, _, _ in ROWS], torch.zeros(5)
    )
    exp.group_ids = torch.tensor(GROUPS)
    return m, router, exp, comps


def _chatml(p: Prompt, hint: bool) -> str:
    """The prompt as ChatML text, written out here: the hint goes at the end of the last user turn."""
    out = ""
    for msg in p.messages:
        text = msg["content"] + (
            f" (The correct answer is {p.answer}.)" if hint and msg["role"] == "user" else ""
        )
        out += f"<|im_start|>{msg['role']}\n{text}<|im_end|>\n"
    return out + "<|im_start|>assistant\n"


def _ref_logprobs(model, tok, p: Prompt, comp: list[int], hint: bool) -> torch.Tensor:
    """log π(y_t | prompt, y_<t) of each completion token from one unpadded forward, float64."""
    ids = tok(_chatml(p, hint), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids + comp])).logits[0].double()
    lp = logits.log_softmax(-1)[len(ids) - 1 : len(ids) - 1 + len(comp)]  # position P+t-1 predicts token t
    return lp.gather(-1, torch.tensor(comp)[:, None])[:, 0]


def test_the_self_teacher_reads_the_hinted_chat_prompt_and_scores_the_students_tokens(setup):
    m, router, exp, comps = setup
    tok = m.tokenizer
    view = teacher_view(PRIVILEGED, exp, tok)
    for i, (p, _, _) in enumerate(ROWS):
        ids = view.input_ids[i][view.attention_mask[i].bool()].tolist()
        prompt_part, completion_part = ids[: len(ids) - len(comps[i])], ids[len(ids) - len(comps[i]) :]
        assert tok.decode(prompt_part) == _chatml(
            p, hint=True
        )  # the assistant header last, no BOS, hint in user
        assert completion_part == comps[i]  # the student's tokens, unchanged, right after the header
    router.on_experience(None, m, exp)
    for i, (p, _, _) in enumerate(ROWS):
        n = len(comps[i])
        want = _ref_logprobs(m.model, tok, p, comps[i], hint=True)
        torch.testing.assert_close(exp.teacher_logprobs[i, :n].double(), want, rtol=1e-6, atol=0.0)
        assert torch.all(exp.teacher_logprobs[i, n:] == 0)  # padding columns hold nothing


def _hand_advantages(m, comps) -> list[torch.Tensor]:
    """(log π_T − log π_S) per token, minus at each position the mean over the other rows of the group that
    have a token there (0 when none)."""
    d = [
        _ref_logprobs(m.model, m.tokenizer, p, c, hint=True)
        - _ref_logprobs(m.model, m.tokenizer, p, c, hint=False)
        for (p, _, _), c in zip(ROWS, comps)
    ]
    out = []
    for i, di in enumerate(d):
        a = di.clone()
        for t in range(len(di)):
            others = [d[j][t] for j in range(len(d)) if j != i and GROUPS[j] == GROUPS[i] and t < len(d[j])]
            if others:
                a[t] -= sum(others) / len(others)
        out.append(a)
    return out


def test_opsd_advantage_and_gradient_by_hand(setup):
    m, router, exp, comps = setup
    router.on_experience(None, m, exp)
    m.compute_advantages(exp)
    adv = exp.extras["opd_advantages"]
    want = _hand_advantages(m, comps)
    for i, a in enumerate(want):
        torch.testing.assert_close(adv[i, : len(a)].double(), a, rtol=1e-6, atol=1e-12)
        assert torch.all(adv[i, len(a) :] == 0)
    # row 3 (SYS, "9", eos) at t=1: its eos minus the mean of rows 2 and 4 at t=1 (row 2's eos, row 4's " ")
    assert len(want[3]) == 2 and len(want[2]) == 2 and len(want[4]) == 4

    params = [p for p in m.parameters() if p.requires_grad]
    opt = _Grads(params)
    m._optimizer_step(opt, None, exp)
    # the objective by hand: token_mean of −A_t · log π(y_t) over the 16 real completion tokens, A detached
    n_tok = sum(len(c) for c in comps)
    assert n_tok == int(exp.loss_mask.sum()) == 16
    m.zero_grad(set_to_none=True)
    surrogate = (
        sum(-(a * _logprobs_with_grad(m, p, c)).sum() for a, (p, _, _), c in zip(want, ROWS, comps)) / n_tok
    )
    surrogate.backward()
    for got, p in zip(opt.grads, params):
        torch.testing.assert_close(got, p.grad, rtol=1e-6, atol=1e-12 * float(p.grad.abs().max()))
    m.zero_grad(set_to_none=True)
    # sign: a small step against the gradient raises log π where A > 0 (first order: Σ A_t Δlog π_t > 0)
    with torch.no_grad():
        before = [_logprobs_with_grad(m, p, c) for (p, _, _), c in zip(ROWS, comps)]
        for g, p in zip(opt.grads, params):
            p -= 1e-4 * g
        after = [_logprobs_with_grad(m, p, c) for (p, _, _), c in zip(ROWS, comps)]
        for g, p in zip(opt.grads, params):
            p += 1e-4 * g
    gain = sum(float((a * (y - x)).sum()) for a, x, y in zip(want, before, after))
    assert gain > 0, gain


def _logprobs_with_grad(m, p: Prompt, comp: list[int]) -> torch.Tensor:
    ids = m.tokenizer(_chatml(p, hint=False), add_special_tokens=False)["input_ids"]
    logits = m.model(torch.tensor([ids + comp])).logits[0]
    lp = logits.log_softmax(-1)[len(ids) - 1 : len(ids) - 1 + len(comp)]
    return lp.gather(-1, torch.tensor(comp)[:, None])[:, 0]
