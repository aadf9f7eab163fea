"""Curriculum: the pass-rate state machine, re-drawing of retired prompts, state round trip, and one short
real run (ordering fix-up, tracking from real Experiences)."""

import functools
import random

import pytest
import torch

from lit_rl.callbacks.curriculum import ACTIVE, SOLVED, UNSOLVED, Curriculum, PassRateTracker, prompt_key
from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, PromptBatch


def _visits(tr, key, seq, start=0):
    """Feed (passed, total) visits; return the status after each."""
    return [tr.update(start + i, key, p, n) for i, (p, n) in enumerate(seq)]


def test_window_retires_solved_only_after_min_visits():
    tr = PassRateTracker(mode="window", window=2, min_visits=3)
    assert _visits(tr, "a", [(4, 4), (4, 4), (4, 4)]) == [ACTIVE, ACTIVE, SOLVED]
    assert tr.stats["a"]["visits"] == 3 and tr.stats["a"]["since"] == 2
    assert tr.weight("a") == 0.0 and tr.weight("never-seen") == 1.0


def test_window_rate_forgets_old_visits_unsolved():
    tr = PassRateTracker(mode="window", window=2, min_visits=2)
    # rates: 1/4, mean(1/4, 0) = 1/8, mean(0, 0) = 0 -> unsolved at the third visit
    assert _visits(tr, "a", [(1, 4), (0, 4), (0, 4)]) == [ACTIVE, ACTIVE, UNSOLVED]
    assert tr.stats["a"]["rate"] == 0.0


def test_ema_rate_hand_computed_and_thresholds():
    tr = PassRateTracker(mode="ema", ema_decay=0.75, min_visits=2, solved_rate=0.8, unsolved_rate=0.2)
    assert _visits(tr, "a", [(2, 2), (0, 2)]) == [ACTIVE, ACTIVE]
    assert tr.stats["a"]["rate"] == 0.75  # 0.75*1 + 0.25*0
    # 0.75*0.75 + 0.25*1 = 0.8125 >= 0.8: solved
    assert tr.update(2, "a", 2, 2) == SOLVED and tr.stats["a"]["rate"] == 0.8125
    # boundary: exactly unsolved_rate counts as unsolved (0.75*0 + 0.25*0.8 = 0.2)
    assert _visits(tr, "b", [(0, 5), (4, 5)]) == [ACTIVE, UNSOLVED]


def test_all_invalid_group_is_not_a_visit():
    tr = PassRateTracker(min_visits=1)
    assert tr.update(0, "a", 0, 0) == ACTIVE
    assert tr.stats["a"]["visits"] == 0 and tr.stats["a"]["rate"] is None


def test_downweighted_key_recovers_when_rate_moves_back():
    tr = PassRateTracker(mode="window", window=2, min_visits=2, retired_weight=0.25)
    assert _visits(tr, "a", [(3, 3), (3, 3), (1, 3), (3, 3)]) == [ACTIVE, SOLVED, ACTIVE, ACTIVE]
    assert tr.stats["a"]["since"] is None
    assert tr.weight("a") == 1.0


def test_retire_for_returns_key_with_fresh_history():
    tr = PassRateTracker(min_visits=1, retire_for=3)
    assert tr.update(5, "a", 2, 2) == SOLVED
    assert tr.tick(7) == [] and tr.status("a") == SOLVED
    assert tr.tick(8) == ["a"]
    assert tr.status("a") == ACTIVE and tr.stats["a"]["visits"] == 0 and list(tr.stats["a"]["recent"]) == []


def test_retired_for_good_without_retire_for():
    tr = PassRateTracker(min_visits=1)
    tr.update(0, "a", 0, 2)
    assert tr.tick(10_000) == [] and tr.status("a") == UNSOLVED


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"mode": "linear"}, "mode='linear'; valid values: window, ema"),
        ({"window": 0}, "window"),
        ({"ema_decay": 1.0}, "ema_decay"),
        ({"min_visits": 0}, "min_visits"),
        ({"solved_rate": 0.3, "unsolved_rate": 0.3}, "unsolved_rate < solved_rate"),
        ({"retired_weight": 1.0}, "retired_weight"),
        ({"retire_for": 0}, "retire_for"),
    ],
)
def test_tracker_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PassRateTracker(**kwargs)


def test_curriculum_config_errors():
    with pytest.raises(ValueError, match="key='domain'; valid values: uid, family"):
        Curriculum(key="domain")
    with pytest.raises(ValueError, match="passed=3"):
        PassRateTracker().update(0, "a", 3, 2)


def test_prompt_key_uid_text_family():
    assert prompt_key(Prompt(prompt="1+1=", uid="u1"), "uid") == "u1"
    assert prompt_key(Prompt(prompt="1+1="), "uid") == "1+1="
    assert prompt_key(Prompt(prompt="x", metadata={"family": "add"}), "family") == "add"
    with pytest.raises(ValueError, match="metadata\\['family'\\]"):
        prompt_key(Prompt(prompt="x", uid="u9"), "family")


def test_tracker_state_round_trip_continues_exactly():
    seq = [("a", 2, 2), ("b", 0, 2), ("a", 2, 2), ("b", 1, 2), ("a", 1, 2), ("b", 0, 2), ("a", 2, 2)]
    kw = {"mode": "window", "window": 2, "min_visits": 2, "retired_weight": 0.5, "retire_for": 4}
    full = PassRateTracker(**kw)
    ref = [(full.tick(i), full.update(i, k, p, n)) for i, (k, p, n) in enumerate(seq)]
    a = PassRateTracker(**kw)
    first = [(a.tick(i), a.update(i, k, p, n)) for i, (k, p, n) in enumerate(seq[:3])]
    b = PassRateTracker(**kw)
    b.load_state_dict(a.state_dict())
    rest = [(b.tick(i + 3), b.update(i + 3, k, p, n)) for i, (k, p, n) in enumerate(seq[3:])]
    assert first + rest == ref
    assert b.state_dict() == full.state_dict()


def _pool(n=6):
    return [Prompt(prompt=f"q{i}", uid=f"p{i}") for i in range(n)]


def test_resample_retired_prompts_are_replaced_by_active_ones_in_place():
    cur = Curriculum(min_visits=1, seed=0)
    pool = _pool()
    for uid in ("p0", "p1", "p2"):
        cur.tracker.update(0, uid, 1, 1)  # solved -> retired (weight 0)
    out, n = cur.resample([pool[0], pool[3], pool[1], pool[4]], pool)
    assert n == 2
    assert out[1] is pool[3] and out[3] is pool[4]  # active prompts keep their place
    assert all(p.uid in {"p3", "p4", "p5"} for p in out)


def test_resample_distribution_is_proportional_to_weights():
    # exact: with the sampler's first draw uniform over the pool, the code's keep probability w and its
    # re-draw weights must combine to P(p) = w_p / sum(w)
    pool = _pool(3)
    cur = Curriculum(min_visits=1, retired_weight=0.5)
    cur.tracker.update(0, "p0", 1, 1)  # w = (0.5, 1, 1), W = 2.5

    class Recorder(random.Random):  # random() is scripted; choices() records the weights it was given
        def __init__(self, u):
            super().__init__(0)
            self.u, self.weights = u, None

        def random(self):
            return self.u

        def choices(self, population, weights=None, k=1):
            self.weights = list(weights)
            return [population[2]]

    prob = [0.0, 0.0, 0.0]
    for i, first in enumerate(pool):
        w = cur.tracker.weight(first.uid)
        if w < 1.0:
            cur.rng = Recorder(w - 1e-12)  # just below w: kept
            assert cur.resample([first], pool) == ([first], 0)
            cur.rng = Recorder(w)  # at w: re-drawn, with the recorded weights
            assert cur.resample([first], pool) == ([pool[2]], 1)
            redraw = [x / sum(cur.rng.weights) for x in cur.rng.weights]
        else:
            cur.rng = Recorder(0.999)  # an active prompt is kept whatever the RNG says
            assert cur.resample([first], pool) == ([first], 0)
            redraw = [0.0, 0.0, 0.0]
        prob[i] += w / 3
        for j in range(3):
            prob[j] += (1 - w) / 3 * redraw[j]
    assert prob == pytest.approx([0.5 / 2.5, 1 / 2.5, 1 / 2.5], rel=1e-12)


def test_resample_everything_retired_keeps_batch_and_warns_once():
    pool = _pool(2)
    cur = Curriculum(min_visits=1)
    for p in pool:
        cur.tracker.update(0, p.uid, 0, 1)
    with pytest.warns(UserWarning, match="every training prompt is retired"):
        assert cur.resample(pool, pool) == (pool, 0)
    assert cur._warned_empty


def _exp(prompts, rewards, valid, G):
    B = len(rewards)
    return Experience(
        input_ids=torch.zeros(B, 3, dtype=torch.long),
        attention_mask=torch.ones(B, 3, dtype=torch.long),
        loss_mask=torch.ones(B, 1, dtype=torch.bool),
        prompt_len=2,
        group_ids=torch.arange(B // G).repeat_interleave(G),
        rewards=torch.tensor(rewards),
        valid=torch.tensor(valid),
        policy_version=torch.zeros(B, dtype=torch.long),
        prompts=[p for p in prompts for _ in range(G)],
    )


def test_observe_counts_valid_passes_per_group():
    pool = _pool(2)
    cur = Curriculum(min_visits=1, pass_threshold=0.5, mode="window", window=1)
    exp = _exp(pool, [0.5, 1.0, float("nan"), 0.0, 0.49, 0.0], [True, True, False, True, True, True], G=3)
    cur.observe(exp)
    # group 0: valid rewards 0.5, 1.0 -> 2/2 pass (>= 0.5) ; group 1: 0.0, 0.49, 0.0 -> 0/3
    assert cur.tracker.stats["p0"]["rate"] == 1.0 and cur.tracker.status("p0") == SOLVED
    assert cur.tracker.stats["p1"]["rate"] == 0.0 and cur.tracker.status("p1") == UNSOLVED


def test_batch_start_rejects_running_after_rollout():
    cur = Curriculum()
    b = PromptBatch(_pool(2))
    b.experience = object()
    with pytest.raises(RuntimeError, match="after the RolloutCallback"):
        cur.on_train_batch_start(None, None, b, 0)


def test_real_run_reorders_and_tracks_and_resumes_rng(tiny_model_dir):
    import lightning as L

    from lit_rl.callbacks import RolloutCallback
    from lit_rl.data import PromptDataModule
    from lit_rl.learners import PolicyModule
    from lit_rl.rewards import ExactAnswerReward
    from lit_rl.rollout import SamplingConfig

    rc = RolloutCallback(rewards=ExactAnswerReward(), group_size=2, sampling=SamplingConfig(max_new_tokens=1))
    cur = Curriculum(min_visits=1, seed=3)
    seen = []

    class Spy(L.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append([p.uid for p in batch.prompts])

    trainer = L.Trainer(
        max_steps=2,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[rc, Spy(), cur],
    )
    mod = PolicyModule(model=str(tiny_model_dir), optimizer=functools.partial(torch.optim.AdamW, lr=1e-3))
    trainer.fit(mod, datamodule=PromptDataModule(task_args={"answer_width": 1, "max_sum": 9}, batch_size=3))
    names = [type(c).__name__ for c in trainer.callbacks]
    assert names.index("Curriculum") == names.index("RolloutCallback") - 1
    assert cur.iteration == 2
    assert sum(s["visits"] for s in cur.tracker.stats.values()) == 6  # 2 steps x 3 groups
    assert "curriculum/solved" in trainer.callback_metrics
    # with min_visits=1, every prompt with all-pass/all-fail groups was retired, so no retired uid appears
    # in a later batch drawn after its retirement
    retired_after_1 = {k for k, s in cur.tracker.stats.items() if s["status"] != ACTIVE and s["since"] == 0}
    assert not retired_after_1 & set(seen[1])
    state = cur.state_dict()
    again = Curriculum(min_visits=1, seed=99)
    again.load_state_dict(state)
    assert again.rng.random() == cur.rng.random() and again.iteration == 2
