"""The experts-to-student pieces without training: the chat tasks of several domains (chat_multiply_digit,
chat_compare, chat_largest, their mix chat_mixed) and HeldoutEval's per-domain accuracy (fake engine, hand-counted)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from lit_rl.callbacks.eval import HeldoutEval
from lit_rl.data.datamodule import PromptDataModule
from lit_rl.data.prompts import Prompt
from lit_rl.data.tasks import get_task
from lit_rl.rewards import LastIntReward, RewardPool
from lit_rl.rollout.engine import Completion


def _ab(p: Prompt) -> tuple[int, int]:
    a, b = p.uid.split("-")[1:]
    return int(a), int(b)


def test_chat_multiply_digit_and_compare_prompts_answers_and_fixed_splits():
    train, held = get_task("chat_multiply_digit")
    assert len(held) == 100 and len(train) + len(held) == 90 * 8  # A in 10..99, D in 2..9
    assert {p.uid for p in train}.isdisjoint({p.uid for p in held})
    p = held[0]
    a, d = _ab(p)
    assert 10 <= a <= 99 and 2 <= d <= 9 and p.answer == str(a * d) and p.domain == "multiplication"
    assert p.messages == [{"role": "user", "content": f"What is {a} x {d}? Reply with only the number."}]
    assert [q.uid for q in get_task("chat_multiply_digit")[1]] == [q.uid for q in held]  # seeded

    train, held = get_task("chat_compare", heldout=50)
    assert len(held) == 50 and len(train) + len(held) == 90 * 89  # ordered pairs of distinct numbers
    for q in held:
        a, b = _ab(q)
        assert a != b and q.answer == str(max(a, b)) and q.domain == "compare"
    assert held[0].messages[0]["content"] == "Which is larger, {} or {}? Reply with only the number.".format(
        *_ab(held[0])
    )
    with pytest.raises(ValueError, match="chat_compare: heldout=0 must be in"):
        get_task("chat_compare", heldout=0)
    with pytest.raises(ValueError, match="chat_multiply_digit: low=50 must be <= high=20"):
        get_task("chat_multiply_digit", low=50, high=20)


def test_chat_largest_prompts_answers_and_fixed_splits():
    train, held = get_task("chat_largest")
    assert len(held) == 200 and len(train) + len(held) == 8100  # `size` distinct ordered 4-tuples
    assert {p.uid for p in train}.isdisjoint({p.uid for p in held}) and len({p.uid for p in train}) == 7900
    for q in held[:50]:
        t = [int(x) for x in q.uid.split("-")[1:]]
        assert len(t) == len(set(t)) == 4 and all(10 <= x <= 99 for x in t)
        assert q.answer == str(max(t)) and q.domain == "largest"
        assert q.messages == [
            {
                "role": "user",
                "content": f"Which is the largest of {t[0]}, {t[1]}, {t[2]} and {t[3]}? Reply with only the number.",
            }
        ]
    # the maximum sits in every position: the answer is not "the last number"
    positions = {[int(x) for x in q.uid.split("-")[1:]].index(int(q.answer)) for q in held}
    assert positions == {0, 1, 2, 3}
    assert [q.uid for q in get_task("chat_largest")[1]] == [q.uid for q in held]  # seeded
    train2, held2 = get_task("chat_largest", count=2, low=1, high=3, size=6, heldout=2)
    assert sorted(q.uid for q in train2 + held2) == [
        "chatmax-1-2",
        "chatmax-1-3",
        "chatmax-2-1",
        "chatmax-2-3",
        "chatmax-3-1",
        "chatmax-3-2",
    ]  # every ordered pair of distinct numbers when size is the whole space
    a, b = held2[0].uid.split("-")[1:]
    assert (
        held2[0].messages[0]["content"] == f"Which is the largest of {a} and {b}? Reply with only the number."
    )
    with pytest.raises(ValueError, match=r"chat_largest: size=7 must be in \[2, 6\]"):
        get_task("chat_largest", count=2, low=1, high=3, size=7)
    with pytest.raises(ValueError, match="chat_largest: count=1 must be >= 2"):
        get_task("chat_largest", count=1)
    with pytest.raises(ValueError, match="fewer than count=4 numbers"):
        get_task("chat_largest", low=1, high=3)
    with pytest.raises(ValueError, match="chat_largest: heldout=8100 must be in"):
        get_task("chat_largest", heldout=8100)


def test_chat_mixed_balances_domains_and_keeps_each_domains_held_out_split():
    train, held = get_task("chat_mixed", domains=["addition", "multiplication"], heldout=16)
    by = {d: [p for p in train if p.domain == d] for d in ("addition", "multiplication")}
    assert len(by["addition"]) == len(by["multiplication"]) == 720 - 16  # cut to the smaller domain
    assert [p.domain for p in held] == ["addition"] * 16 + ["multiplication"] * 16
    # a domain's held-out prompts are its single-domain task's (same heldout and seed): an expert trained on
    # that task never saw them, and none of them is a training prompt of the mix
    assert [p.uid for p in held[16:]] == [p.uid for p in get_task("chat_multiply_digit", heldout=16)[1]]
    assert [p.uid for p in held[:16]] == [p.uid for p in get_task("chat_addition", heldout=16)[1]]
    assert {p.uid for p in train}.isdisjoint({p.uid for p in held})
    assert [p.uid for p in get_task("chat_mixed", domains=["addition", "multiplication"], heldout=16)[0]] == [
        p.uid for p in train
    ]
    with pytest.raises(
        ValueError, match=r"domains=\['poetry'\]; each must be one of addition, multiplication"
    ):
        get_task("chat_mixed", domains=["poetry"])
    train, held2 = get_task(
        "chat_mixed", domains=["addition", "multiplication"], heldout=16, train_domains=["multiplication"]
    )  # an expert's prompts: one domain trained, every domain measured
    assert {p.domain for p in train} == {"multiplication"} and len(train) == 720 - 16
    assert [p.uid for p in held2] == [p.uid for p in held]
    with pytest.raises(ValueError, match=r"train_domains=\['compare'\] must be a non-empty subset"):
        get_task("chat_mixed", domains=["addition"], train_domains=["compare"])
    train, held = get_task("chat_mixed", domains=["addition", "largest"], heldout=16)
    assert [p.domain for p in held] == ["addition"] * 16 + ["largest"] * 16
    assert [p.uid for p in held[16:]] == [p.uid for p in get_task("chat_largest", heldout=16)[1]]
    assert (
        sum(p.domain == "largest" for p in train) == sum(p.domain == "addition" for p in train) == 8100 - 16
    )
    with pytest.raises(ValueError, match="names a domain twice"):
        get_task("chat_mixed", domains=["compare", "compare"])


class _CharTok:
    """Token id = character code: the fake engine's completions decode to the text it was told to answer."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(map(chr, ids))


def _harness(heldout: list[Prompt], answers: dict[str, str], root: str = "."):
    """A HeldoutEval's collaborators, faked: the RolloutCallback renders nothing, its engine answers each
    prompt with ``answers[uid]``, and the run's reward is the last integer (LastIntReward)."""
    order: list[Prompt] = []

    def render(tok, prompts, max_new_tokens, count):
        order[:] = prompts
        return prompts, [[0] for _ in prompts]

    def eval_generate(ids, n, sp):
        return [
            [Completion([ord(c) for c in answers[p.uid]], [0.0] * len(answers[p.uid]), "stop")] for p in order
        ]

    engine = SimpleNamespace(state_dict=dict, load_state_dict=lambda s: None)
    rc = SimpleNamespace(
        settings=SimpleNamespace(sampling=SimpleNamespace(max_new_tokens=8)),
        pipeline=SimpleNamespace(render=render),
        eval_generate=eval_generate,
        rewards=RewardPool({"last_int": LastIntReward()}),
        lock=threading.Lock(),
        engine=engine,
    )  # the fields of a RolloutBinding HeldoutEval reads
    dm = PromptDataModule()  # its held-out prompts (the per-domain metrics list them)
    dm.heldout_prompts = heldout
    trainer = SimpleNamespace(
        datamodule=dm,
        global_step=0,
        global_rank=0,
        default_root_dir=root,
    )
    module = SimpleNamespace(
        trainer=trainer,
        device=torch.device("cpu"),
        tokenizer=_CharTok(),
        critic=None,
        iteration=3,
        rollout=rc,
    )
    return trainer, module


def _p(uid: str, domain: str, answer: str) -> Prompt:
    return Prompt(prompt=uid, answer=answer, domain=domain, uid=uid)


ADD = [_p(f"a{i}", "addition", str(10 + i)) for i in range(3)]
MUL = [_p(f"m{i}", "multiplication", str(20 + i)) for i in range(3)]
# a0 a1 right, a2 wrong; m0 right, m1 m2 wrong: addition 2/3, multiplication 1/3, all 3/6
ANSWERS = {"a0": "10", "a1": "7 + 4 = 11", "a2": "99", "m0": "20", "m1": "5", "m2": ""}


def test_per_domain_accuracy_is_summed_over_batches_not_averaged_per_batch():
    ev = HeldoutEval()
    trainer, module = _harness(ADD + MUL, ANSWERS)
    ev.start(module)
    # batch 1: a0 a1 m0 (3/3 correct); batch 2: a2 m1 m2 (0/3). A mean of per-batch domain means would give
    # addition (1 + 0) / 2 = 0.5; the counts give 2/3.
    ev.score_batch(trainer, module, [ADD[0], ADD[1], MUL[0]])
    ev.score_batch(trainer, module, [ADD[2], MUL[1], MUL[2]])
    out = ev.finish(trainer, module)
    assert out["eval/accuracy"] == pytest.approx(0.5)
    assert out["eval/accuracy/addition"] == pytest.approx(2 / 3)
    assert out["eval/accuracy/multiplication"] == pytest.approx(1 / 3)
    assert ev.history == [{"step": 3.0, **out}]


def test_per_domain_counts_merge_across_ranks_as_sums():
    """What torchmetrics' sync does across ranks (sum every state), done here by merging two ranks' metrics:
    rank 0 scored a0 a1 m0, rank 1 a2 m1 m2; the merged accuracy is the whole set's, 2/3 and 1/3."""
    ranks = []
    for batch in ([ADD[0], ADD[1], MUL[0]], [ADD[2], MUL[1], MUL[2]]):
        ev = HeldoutEval()
        trainer, module = _harness(ADD + MUL, ANSWERS)
        ev.start(module)
        ev.score_batch(trainer, module, batch)
        ranks.append(ev)
    for k, m in ranks[0]._metrics.items():
        m.merge_state(ranks[1]._metrics[k])
    out = ranks[0].finish(trainer, module)
    assert out["eval/accuracy/addition"] == pytest.approx(2 / 3)
    assert out["eval/accuracy/multiplication"] == pytest.approx(1 / 3)


def test_one_domain_logs_no_per_domain_keys_and_an_unscored_domain_is_left_out():
    ev = HeldoutEval()
    trainer, module = _harness(ADD, ANSWERS)
    ev.start(module)
    ev.score_batch(trainer, module, ADD)
    assert set(ev.finish(trainer, module)) == {"eval/accuracy", "eval/reward_mean"}

    ev = HeldoutEval(max_prompts=3)  # the held-out list is addition first: multiplication is never scored
    trainer, module = _harness(ADD + MUL, ANSWERS)
    ev.start(module)
    ev.score_batch(trainer, module, ADD + MUL)
    out = ev.finish(trainer, module)
    assert out["eval/accuracy/addition"] == pytest.approx(2 / 3) and "eval/accuracy/multiplication" not in out


def test_history_keeps_what_the_run_spent_wall_time_without_evaluations_and_tokens(tmp_path, monkeypatch):
    """A fake clock: fitting starts at t=0; evaluations run 10..13 and 20..25; 5 + 7 completion tokens are
    sampled before the first evaluation, 3 more before the second. The second evaluation's wall time is
    20 - 3 (the first evaluation's 3 s are not the run's budget)."""
    import json

    import lit_rl.callbacks.eval as ev_mod

    clock = iter([0.0, 10.0, 13.0, 20.0, 25.0, 30.0])
    monkeypatch.setattr(ev_mod.time, "perf_counter", lambda: next(clock))
    ev = HeldoutEval(history_path="e2s/history.json")
    trainer, module = _harness(ADD + MUL, ANSWERS, root=str(tmp_path))
    ev.on_fit_start(trainer, module)

    def batch(*rows):
        return SimpleNamespace(
            experience=SimpleNamespace(loss_mask=torch.tensor([[1] * n + [0] * (8 - n) for n in rows]))
        )

    ev.on_train_batch_end(trainer, module, None, batch(5, 7), 0)
    ev.evaluate(trainer, module)
    ev.on_train_batch_end(trainer, module, None, batch(3), 1)
    ev.evaluate(trainer, module)
    assert [(h["wall_s"], h["student_tokens"]) for h in ev.history] == [(10.0, 12.0), (17.0, 15.0)]
    assert json.loads((tmp_path / "e2s/history.json").read_text()) == ev.history
    state = ev.state_dict()  # at t=30: a resumed run continues the spending from the checkpoint
    assert (state["wall_s"], state["student_tokens"]) == (30.0 - 3 - 5, 15)
    again = HeldoutEval()
    again.load_state_dict(state)
    assert again.state_dict() == state
