"""End to end: distillation actually teaches tiny students (held-out greedy accuracy, before vs after).

Teachers are tiny models trained here by supervised cross-entropy (seconds; see _distill_helpers). Printed
numbers (pytest -s) are the before/after accuracies quoted in the docs.
"""

from __future__ import annotations

import pytest
import torch
from _distill_helpers import TINY, Spy, fit, greedy_accuracy, sft_model, write_jsonl
from _learning import record, seed

from lit_rl.callbacks import RolloutCallback, Teacher, TeacherRouter
from lit_rl.data.datamodule import PromptDataModule
from lit_rl.data.tasks import get_task
from lit_rl.learners import DistillModule
from lit_rl.models.loading import load_causal_lm
from lit_rl.models.tiny import build_tiny_model
from lit_rl.rewards import ExactAnswerReward
from lit_rl.rollout.engine import SamplingConfig

pytestmark = pytest.mark.slow  # minutes each on a loaded 2-core machine (teachers are trained in fixtures)

# The quickstart task: three tally-mark operands, one-digit sums, 176 training / 44 held-out triples.
ADD_ARGS = {"answer_width": 1, "max_sum": 9, "unary": True, "num_operands": 3}
TEMPLATE = "{prompt}(answer: {answer})"
# 64 prompts x 4 samples: the quickstart's 256 rows per step, spread over more prompts — distillation needs no
# group baseline (scripts/bench_distill.py: 80% of the teacher at step 50 with 64x4 vs 90 with 16x16).
BATCH, GROUP = 64, 4


def _opt(lr):
    return lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=0.0)


def _rollout(max_new_tokens, group_size=GROUP):
    return RolloutCallback(
        rewards=[ExactAnswerReward()],
        group_size=group_size,
        sampling=SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens),
    )


@pytest.fixture(scope="module")
def tasks():
    return {"addition": get_task("addition", **ADD_ARGS), "reverse": get_task("reverse")}


@pytest.fixture(scope="module")
def add_teacher(tmp_path_factory, tasks):
    tr, he = tasks["addition"]
    path = sft_model(
        tmp_path_factory.mktemp("t_add"),
        [(p.prompt, p.answer) for p in tr],
        steps=100,
        seed=seed(1),
        decay=True,
    )
    acc = greedy_accuracy(path, he, 1)
    record("distill/add_teacher", accuracy=acc)
    assert acc >= 0.9, acc
    return str(path)


@pytest.fixture(scope="module")
def rev_teacher(tmp_path_factory, tasks):
    tr, he = tasks["reverse"]
    path = sft_model(
        tmp_path_factory.mktemp("t_rev"), [(p.prompt, p.answer) for p in tr], steps=200, seed=seed(2)
    )
    acc = greedy_accuracy(path, he, 4)
    record("distill/rev_teacher", accuracy=acc)
    # 9 runs (kernels default/avx2/avx512 x seeds 0-2, docs/learning_tests.md): 0.84 once, 0.96 twice, else 1.0
    # (25 held-out words: one word is 0.04). The bar leaves one word below the worst run; the students
    # learn from a 0.84 teacher too (routed test under default kernels).
    assert acc >= 0.8, acc
    return str(path)


def test_addition_teacher_learns(add_teacher):
    """The SFT teachers are learning runs too (asserted in their fixtures): these run them alone."""


def test_reversal_teacher_learns(rev_teacher):
    pass


@pytest.mark.parametrize("losses", [{"reverse_kl_full": 1.0}, {"topk_reverse_kl": 1.0}, {"jsd": 1.0}])
def test_distillation_brings_a_fresh_student_up(losses, add_teacher, tasks, tmp_path):
    _tr, he = tasks["addition"]
    student = build_tiny_model(tmp_path / "s", seed=seed(7), **TINY)
    before = greedy_accuracy(student, he, 1)
    m = DistillModule(model=str(student), losses=losses, topk=4, optimizer=_opt(3e-3))
    dm = PromptDataModule(task="addition", task_args=ADD_ARGS, batch_size=BATCH)
    fit(m, dm, [_rollout(1), TeacherRouter({"addition": add_teacher})], steps=40)
    after = greedy_accuracy(m.model, he, 1, m.tokenizer)
    record(f"distill/fresh_student[{'+'.join(losses)}]", before=before, after=after)
    assert before <= 0.15 and after >= before + 0.3, (before, after)


# Held-out gain required on each domain: addition exact answers, reversal per-character (whole reversed words are
# bimodal: Latin sweep at 200 steps gave 1.0 / 1.0 / 0.12 exact, 1.0 / 1.0 / 0.613 per character; addition
# 0.886 / 0.977 / 0.932; every "before" is 0.0 — docs/learning_tests.md).
BAR_ROUTED = 0.3


def test_two_domain_routed_student_improves_on_both(add_teacher, rev_teacher, tasks, tmp_path):
    """One mixed stream (100 addition + 100 reversal prompts), two SFT teachers each trained on its own domain,
    wrapped in spies: the fresh student improves on both domains, and every sequence each teacher scored
    during training was one of its own domain's prompts."""
    (a_tr, a_he), (r_tr, r_he) = tasks["addition"], tasks["reverse"]
    train = write_jsonl(
        tmp_path / "train.jsonl", a_tr[: len(r_tr)] + r_tr
    )  # balanced: reversal is the harder one
    held = write_jsonl(tmp_path / "held.jsonl", a_he + r_he)
    student = build_tiny_model(tmp_path / "s", seed=seed(8), **TINY)
    before = {
        "addition": greedy_accuracy(student, a_he, 4),
        "reverse": greedy_accuracy(student, r_he, 4),
        "reverse_chars": greedy_accuracy(student, r_he, 4, per_char=True),
    }
    spies = {
        d: Spy(load_causal_lm(p).eval().requires_grad_(False))
        for d, p in (("addition", add_teacher), ("reverse", rev_teacher))
    }
    router = TeacherRouter({d: Teacher(model=s) for d, s in spies.items()})
    # forward KL (GKD on student rollouts): from a fresh student, reverse_kl_full needed several times more steps
    # on the reversal domain (0.13 train accuracy after 60 reversal-only steps vs 0.86 with forward_kl)
    m = DistillModule(model=str(student), losses={"forward_kl": 1.0}, optimizer=_opt(3e-3))
    dm = PromptDataModule(train_files=[train], heldout_files=[held], batch_size=BATCH)
    # 200 steps: at 100 the reversal domain ended at 0.32 (default kernels) and 0.0 (avx512) held-out
    fit(m, dm, [_rollout(4), router], steps=200)
    after = {
        "addition": greedy_accuracy(m.model, a_he, 4, m.tokenizer),
        "reverse": greedy_accuracy(m.model, r_he, 4, m.tokenizer),
        "reverse_chars": greedy_accuracy(m.model, r_he, 4, m.tokenizer, per_char=True),
    }
    record(
        "distill/routed_student",
        **{f"before_{d}": v for d, v in before.items()},
        **{f"after_{d}": v for d, v in after.items()},
    )
    assert set(router.rows_total) == {"addition", "reverse"}
    assert router.rows_total["addition"] + router.rows_total["reverse"] == 200 * BATCH * GROUP
    for d in ("addition", "reverse_chars"):
        assert after[d] >= before[d] + BAR_ROUTED, (d, before, after)
    tok = m.tokenizer
    for d, spy in spies.items():  # on_experience scoring and the per-micro-batch full-vocabulary forwards
        texts = [tok.decode(r[r != tok.pad_token_id]) for batch in spy.seen for r in batch]
        assert texts, d
        own = [t.startswith("rev ") == (d == "reverse") for t in texts]
        assert all(own), (d, [t for t, o in zip(texts, own) if not o][:3])


# "self" scores with the current weights, so every update also moves the teacher; at 3e-3 the updates erode the
# privileged copying faster than the plain prompt improves (train 0.24 -> 0.16), at 3e-4 it learns (0.24 -> 0.53).
@pytest.mark.parametrize("source,lr", [("self_frozen", 3e-3), ("self", 3e-4)])
def test_opsd_privileged_context_improves_the_model(source, lr, tasks, tmp_path):
    """A model that can only copy an answer written in its prompt ("…=(answer: 5)" → "5") is its own teacher
    with that privileged context; on-policy self-distillation teaches it to answer the plain prompt."""
    tr, he = tasks["addition"]
    pairs = [(p.prompt + f"(answer: {p.answer})", p.answer) for p in tr]
    base = sft_model(tmp_path / "copy", pairs, steps=100, seed=seed(3))
    priv = [type(p)(prompt=p.prompt + f"(answer: {p.answer})", answer=p.answer) for p in tr]
    teacher_acc = greedy_accuracy(base, priv, 1)
    before_tr, before_he = greedy_accuracy(base, tr, 1), greedy_accuracy(base, he, 1)
    router = TeacherRouter({"addition": Teacher(source, template=TEMPLATE)})
    m = DistillModule(model=str(base), losses={"reverse_kl_full": 1.0}, optimizer=_opt(lr))
    dm = PromptDataModule(task="addition", task_args=ADD_ARGS, batch_size=BATCH)
    fit(m, dm, [_rollout(1), router], steps=40)
    after_tr = greedy_accuracy(m.model, tr, 1, m.tokenizer)
    after_he = greedy_accuracy(m.model, he, 1, m.tokenizer)
    record(
        f"distill/opsd[{source}]",
        teacher=teacher_acc,
        before_train=before_tr,
        after_train=after_tr,
        before_heldout=before_he,
        after_heldout=after_he,
    )
    assert teacher_acc >= 0.9 and before_tr <= 0.3
    # measured: self_frozen train 0.24 -> 0.50, held-out 0.32 -> 0.57; self train 0.24 -> 0.53, held-out 0.32 -> 0.57
    assert after_tr >= before_tr + 0.15, (before_tr, after_tr)


def test_sft_on_success_rejection_sampled_distillation(add_teacher, tasks, tmp_path):
    _tr, he = tasks["addition"]
    student = build_tiny_model(tmp_path / "s", seed=seed(9), **TINY)
    before = greedy_accuracy(student, he, 1)
    router = TeacherRouter({"addition": add_teacher}, teacher_samples=4)
    m = DistillModule(model=str(student), losses={"sft_on_success": 1.0}, optimizer=_opt(3e-3))
    dm = PromptDataModule(task="addition", task_args=ADD_ARGS, batch_size=BATCH)
    fit(m, dm, [_rollout(1, group_size=1), router], steps=40)
    after = greedy_accuracy(m.model, he, 1, m.tokenizer)
    record("distill/sft_on_success", before=before, after=after)
    assert after >= before + 0.3, (before, after)
