"""Each rollout stage on its own (lit_rl/rollout/: render, generate, score, filter/refill, build, pipeline), with
hand-computed expectations. The tokenizer is the real char tokenizer (one token per character); rewards go
through a real ``RewardPool``; the engine is a small ``EngineBase`` that returns scripted completions."""

from __future__ import annotations

import math
import random
import threading
import time

import pytest
import torch

from lit_rl.data.prompts import Prompt
from lit_rl.models.tiny import build_tokenizer
from lit_rl.rewards.pool import RewardBatch, RewardPool
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.build import ExperienceBuilder
from lit_rl.rollout.engine import Completion, SamplingConfig
from lit_rl.rollout.filter import DynamicSampling, informative_groups, overlong_trainable, zero_std_frac
from lit_rl.rollout.generate import Generator, decode_with
from lit_rl.rollout.pipeline import RolloutPipeline
from lit_rl.rollout.render import PromptRenderer
from lit_rl.rollout.rollouts import Rollouts
from lit_rl.rollout.score import OverlongShaping, Scorer
from lit_rl.rollout.settings import FilterSettings, RolloutSettings


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer("char")


class TextEngine(EngineBase):
    """An engine whose completion j of a prompt is ``script[prompt text][j]`` (text, finish reason), with
    log-prob -0.25 per token."""

    policy_version = 3

    def __init__(self, tokenizer, script: dict[str, list[tuple[str, str]]]):
        self.tokenizer, self.script, self.calls = tokenizer, script, []

    def bind(self, module, rollout=None):
        pass

    def update_weights(self, named_tensors):
        self.policy_version += 1

    def generate(self, prompt_ids, n, sampling):
        self.calls.append([self.tokenizer.decode(p) for p in prompt_ids])
        out = []
        for p in prompt_ids:
            outs = self.script[self.tokenizer.decode(p)]
            assert len(outs) == n
            out.append([Completion(self.tokenizer.encode(t), [-0.25] * len(t), f) for t, f in outs])
        return out


def _rb(total, valid=None, comps=None):
    total = torch.tensor(total, dtype=torch.float64)
    valid = torch.ones(len(total), dtype=torch.bool) if valid is None else torch.tensor(valid)
    total = torch.where(valid, total, torch.full_like(total, float("nan")))
    return RewardBatch(
        total,
        valid,
        comps or {"r": total.clone()},
        [None if v else "boom" for v in valid.tolist()],
        {"reward/infra_errors": float((~valid).sum())},
    )


# ---------------------------------------------------------------------------------------------------- render
def test_render_truncates_to_the_last_tokens_and_counts(tok):
    r = PromptRenderer(max_prompt_len=5, overlong="truncate")
    kept, ids = r(tok, [Prompt(prompt="1+1="), Prompt(prompt="123456789+1=")])
    assert [tok.decode(i) for i in ids] == ["1+1=", "89+1="]  # the end holds the question
    assert len(kept) == 2 and r.counters == {"prompts_truncated": 1, "prompts_dropped": 0}


def test_render_drops_and_counts_then_refuses_an_empty_batch(tok):
    r = PromptRenderer(max_prompt_len=5, overlong="drop")
    a, b = Prompt(prompt="1+1=", uid="a"), Prompt(prompt="123456789+1=", uid="b")
    kept, ids = r(tok, [b, a, b])
    assert [p.uid for p in kept] == ["a"] and ids == [tok.encode("1+1=")]
    assert r.counters == {"prompts_truncated": 0, "prompts_dropped": 2}
    with pytest.raises(ValueError, match="every prompt of the batch exceeded max_prompt_len=5"):
        r(tok, [b])


def test_render_error_and_bad_arguments(tok):
    with pytest.raises(ValueError, match="prompt 'b' has 12 tokens > max_prompt_len=5"):
        PromptRenderer(5, "error")(tok, [Prompt(prompt="123456789+1=", uid="b")])
    with pytest.raises(ValueError, match="overlong_prompts='cut'; valid values: truncate, drop, error"):
        PromptRenderer(5, "cut")
    with pytest.raises(ValueError, match="max_prompt_len must be >= 1, got 0"):
        PromptRenderer(0, "truncate")


def test_render_uses_the_chat_template_for_messages(tok):
    p = Prompt(messages=[{"role": "user", "content": "2+2="}])
    _, (ids,) = PromptRenderer(512, "truncate")(tok, [p])
    assert tok.decode(ids) == tok.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)


# -------------------------------------------------------------------------------------------------- generate
def test_generate_waits_for_the_engine_lock(tok):
    """A generation never overlaps a weight load: it waits while another thread holds the engine lock."""
    lock = threading.RLock()
    eng = TextEngine(tok, {"q": [("a", "stop"), ("bc", "length")]})
    gen = Generator(eng, RolloutSettings(group_size=2), lock)
    out = {}
    with lock:
        t = threading.Thread(target=lambda: out.setdefault("r", gen(None, [tok.encode("q")])))
        t.start()
        time.sleep(0.2)
        assert "r" not in out and eng.calls == []
    t.join(5)
    groups, seconds = out["r"]
    assert [[(tok.decode(c.token_ids), c.finish_reason) for c in g] for g in groups] == [
        [("a", "stop"), ("bc", "length")]
    ]
    assert seconds >= 0.0 and eng.calls == [["q"]]


# ----------------------------------------------------------------------------------------------------- score
def test_score_rows_are_group_major_and_use_the_decoded_text(tok):
    eng = TextEngine(tok, {})
    pool = RewardPool({"len": lambda p, c: float(len(c)) + (10.0 if p.uid == "b" else 0.0)})
    groups = [
        [Completion(tok.encode("x"), [0.0], "stop"), Completion(tok.encode("xyz"), [0.0] * 3, "stop")],
        [Completion(tok.encode("xy"), [0.0] * 2, "stop"), Completion([], [], "length")],
    ]
    rb = Scorer(pool, decode_with(eng))([Prompt(prompt="p", uid="a"), Prompt(prompt="q", uid="b")], groups)
    assert rb.total.tolist() == [1.0, 3.0, 12.0, 10.0] and rb.valid.all()
    pool.close()


def test_overlong_shaping_hand_computed():
    """L_max=5, L_cache=2, factor 1: lengths <= 3 are not punished, 4 → (3-4)/2 = -0.5, 5 → -1; an invalid row
    keeps NaN and gets a NaN penalty."""
    shaping = OverlongShaping(max_new_tokens=5, buffer=2, factor=1.0)
    rb = shaping(_rb([1.0, 1.0, 0.0, 2.0, 7.0], [True, True, True, True, False]), [2, 3, 4, 5, 5])
    assert rb.total[:4].tolist() == [1.0, 1.0, -0.5, 1.0]
    assert math.isnan(rb.total[4]) and math.isnan(rb.components["overlong_penalty"][4])
    assert rb.components["overlong_penalty"][:4].tolist() == [0.0, 0.0, -0.5, -1.0]
    assert rb.components["r"][:4].tolist() == [1.0, 1.0, 0.0, 2.0]  # the reward itself is kept apart
    with pytest.raises(ValueError, match=r"overlong_buffer must be in \[1, sampling.max_new_tokens=5\]"):
        OverlongShaping(5, 6)
    with pytest.raises(ValueError, match="overlong_penalty_factor must be >= 0"):
        OverlongShaping(5, 2, -1.0)


# ---------------------------------------------------------------------------------------------------- filter
def test_overlong_filter_masks_exactly_the_cut_off_rows():
    assert overlong_trainable(["stop", "length", "stop", "length"]).tolist() == [True, False, True, False]


def test_informative_groups_need_two_different_valid_rewards():
    # G=3: [0,1,1] informative; [1,1,1] flat; [0,·,1] with one invalid still informative; [5,·,·] one valid only
    rb = _rb(
        [0, 1, 1, 1, 1, 1, 0, 9, 1, 5, 0, 0],
        [True, True, True, True, True, True, True, False, True, True, False, False],
    )
    assert informative_groups(rb, 3) == [0, 2]
    assert zero_std_frac(rb, 3) == 0.5


def _flat_then_table(table, seconds=0.25):
    """sample(prompts): group of each prompt gets the rewards ``table[uid]`` (a fixed reward function)."""
    calls = []

    def sample(prompts):
        calls.append([p.uid for p in prompts])
        rewards = [r for p in prompts for r in table[p.uid]]
        G = len(table[prompts[0].uid])
        groups = [[f"{p.uid}{j}" for j in range(G)] for p in prompts]
        return Rollouts(list(prompts), [[i] for i in range(len(prompts))], groups, _rb(rewards), seconds)

    return sample, calls


def test_refill_returns_kept_groups_then_refilled_ones():
    table = {"a": [1, 0], "b": [1, 1], "c": [0, 1], "x": [2, 0], "y": [3, 3]}
    sample, calls = _flat_then_table(table)
    P = {u: Prompt(prompt=u, uid=u) for u in table}
    batch = sample([P["a"], P["b"], P["c"]])
    batch.generate_s = 0.5
    pool = [P["y"], P["x"]]
    rng = random.Random(7)
    expect_draw = [random.Random(7).choice(pool) for _ in range(1)]
    refill = DynamicSampling(RolloutSettings(group_size=2), FilterSettings(max_resample_tries=5))
    out, tries = refill(batch, sample, pool, rng)
    # one draw per missing group per try; the draws follow the stream: y (flat) is rejected, x fills the batch
    draws = calls[1:]
    assert draws[0] == [p.uid for p in expect_draw]
    assert [p.uid for p in out.prompts[:2]] == ["a", "c"]
    assert out.prompts[2].uid == "x" and tries == len(draws)
    assert out.rewards.total.tolist() == [1.0, 0.0, 0.0, 1.0, 2.0, 0.0]
    assert out.groups == [["a0", "a1"], ["c0", "c1"], ["x0", "x1"]]
    assert out.generate_s == pytest.approx(0.5 + 0.25 * tries)  # every try's generation counts
    assert out.rewards.metrics == {
        "reward/infra_errors": 0.0
    }  # the reward pool's metrics of the step's batch


def test_refill_raises_after_max_resample_tries():
    table = {"a": [1, 0], "b": [1, 1]}
    sample, calls = _flat_then_table(table)
    P = {u: Prompt(prompt=u, uid=u) for u in table}
    with pytest.raises(RuntimeError, match="max_resample_tries=2 extra generations only 1 of 2 groups"):
        DynamicSampling(RolloutSettings(group_size=2), FilterSettings(max_resample_tries=2))(
            sample([P["a"], P["b"]]), sample, [P["b"]], random.Random(0)
        )
    assert calls[1:] == [["b"], ["b"]]  # exactly two extra generations


def test_refill_stream_is_keyed_by_seed_rank_iteration():
    ds = DynamicSampling(RolloutSettings(group_size=2, seed=4), FilterSettings(max_resample_tries=1))
    assert ds.rng(1, 9).random() == random.Random("lit_rl.refill:4:1:9").random()
    assert ds.rng(0, 9).random() != ds.rng(1, 9).random() != ds.rng(1, 10).random()
    with pytest.raises(ValueError, match="dynamic_sampling needs group_size >= 2"):
        DynamicSampling(RolloutSettings(group_size=1), FilterSettings())
    with pytest.raises(ValueError, match="max_resample_tries must be >= 0, got -1"):
        FilterSettings(max_resample_tries=-1)


def test_rollouts_select_and_concat_keep_rows_aligned():
    a = Rollouts(
        [Prompt(prompt="a"), Prompt(prompt="b")],
        [[1], [2]],
        [["a0", "a1"], ["b0", "b1"]],
        _rb([1, 2, 3, 4], [True, True, True, False]),
        1.0,
    )
    s = a.select([1])
    assert (
        s.prompt_ids == [[2]]
        and s.rewards.valid.tolist() == [True, False]
        and s.rewards.errors == [None, "boom"]
    )
    c = Rollouts.concat([s, a.select([0])])
    assert c.rows() == ["b0", "b1", "a0", "a1"] and c.rewards.components["r"][[0, 2, 3]].tolist() == [
        3.0,
        1.0,
        2.0,
    ]
    assert c.generate_s == 2.0


# ----------------------------------------------------------------------------------------------------- build
def test_build_layout_group_ids_and_versions(tok):
    eng = TextEngine(tok, {})
    b = ExperienceBuilder(eng, decode_with(eng), horizon=4)
    comps = [
        [Completion([30, 31], [-0.5, -1.0], "stop"), Completion([32], [-2.0], "length")],
        [Completion([], [], "length"), Completion([33, 34, 35], [-0.1, -0.2, -0.3], "stop")],
    ]
    batch = Rollouts(
        [Prompt(prompt="p", uid="p"), Prompt(prompt="q", domain="math", uid="q")],
        [[10, 11], [12]],
        comps,
        _rb([1, 0, 1, 1]),
    )
    exp = b(batch, pad_id=0, trainable=torch.tensor([True, False, False, True]))
    pad = 0
    assert exp.input_ids.tolist() == [
        [10, 11, 30, 31, pad],
        [10, 11, 32, pad, pad],
        [pad, 12, pad, pad, pad],
        [pad, 12, 33, 34, 35],
    ]
    assert exp.attention_mask.tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0], [0, 1, 0, 0, 0], [0, 1, 1, 1, 1]]
    assert exp.loss_mask.tolist() == [[True, True, False], [True, False, False], [False] * 3, [True] * 3]
    assert torch.equal(
        exp.rollout_logprobs, torch.tensor([[-0.5, -1.0, 0], [-2.0, 0, 0], [0, 0, 0], [-0.1, -0.2, -0.3]])
    )
    assert exp.group_ids.tolist() == [0, 0, 1, 1] and exp.policy_version.tolist() == [3] * 4
    assert exp.domains == ["default", "default", "math", "math"] and exp.horizon == 4
    assert exp.trainable.tolist() == [True, False, False, True] and exp.finish_reasons[1] == "length"
    assert exp.texts[3] == tok.decode([33, 34, 35])
    assert b(batch, pad_id=0).group_ids.tolist() == [2, 2, 3, 3] and b.next_group == 4  # run-wide numbering


# -------------------------------------------------------------------------------------------------- pipeline
def test_pipeline_run_filters_overlong_rows_and_reports(tok):
    """render → generate → score → filter → build on two prompts x 2 samples; the overlong filter marks exactly
    the rows that finished on ``length``; rewards are 1 for the text "4"."""
    script = {"2+2=": [("4", "stop"), ("44", "length")], "1+2=": [("3", "length"), ("3", "stop")]}
    eng = TextEngine(tok, script)
    pool = RewardPool(lambda p, c: float(c == p.answer))
    settings = RolloutSettings(group_size=2, sampling=SamplingConfig(max_new_tokens=2))
    pipe = RolloutPipeline(
        PromptRenderer(512, "truncate"),
        Generator(eng, settings),
        Scorer(pool, decode_with(eng)),
        ExperienceBuilder(eng, decode_with(eng), 2),
        settings,
        FilterSettings(overlong_filter=True),
    )
    exp, m = pipe.run(tok, [Prompt(prompt="2+2=", answer="4"), Prompt(prompt="1+2=", answer="3")])
    assert exp.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert exp.trainable.tolist() == [True, False, False, True]
    assert m["rollout/overlong_filtered"] == 2.0 and m["rollout/zero_std_frac"] == 0.5
    assert m["rollout/truncation_rate"] == 0.5 and m["rollout/prompts_truncated"] == 0.0
    assert "rollout/resample_tries" not in m
    pool.close()


def test_pipeline_refill_draws_from_the_pool_with_the_rank_iteration_stream(tok):
    script = {
        "a": [("1", "stop"), ("0", "stop")],
        "b": [("1", "stop"), ("1", "stop")],
        "c": [("0", "stop"), ("1", "stop")],
    }
    eng = TextEngine(tok, script)
    pool = RewardPool(lambda p, c: float(c))
    settings = RolloutSettings(group_size=2, seed=1)
    pipe = RolloutPipeline(
        PromptRenderer(512, "truncate"),
        Generator(eng, settings),
        Scorer(pool, decode_with(eng)),
        ExperienceBuilder(eng, decode_with(eng), 16),
        settings,
        FilterSettings(dynamic_sampling=True),
    )
    train = [Prompt(prompt=u, uid=u) for u in "abc"]
    exp, m = pipe.run(tok, [train[0], train[1]], pool=train, rank=1, iteration=5)
    rng = random.Random("lit_rl.refill:1:1:5")
    draws, need = [], 1
    while need:  # the refill's own schedule, replayed: one draw per missing group per try
        d = [rng.choice(train) for _ in range(need)]
        draws += d
        need -= sum(p.uid != "b" for p in d)
    assert eng.calls == [["a", "b"]] + [[p.uid] for p in draws]
    assert [p.uid for p in exp.prompts[::2]] == ["a", draws[-1].uid]
    assert m["rollout/resample_tries"] == float(len(draws)) and m["rollout/zero_std_frac"] == 0.5
    pool.close()
