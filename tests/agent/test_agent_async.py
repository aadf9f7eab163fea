"""Asynchronous episodes (issue 56): no episode waits for another, weight syncs inside an episode with every
token's version and log-prob checked by hand, and faults (a hung tool, an environment that raises, an episode over
its token budget, a straggler cut) counted and masked without losing a token.

Deadlines here are short and every wait that must outlast one is an ``Event`` released only at the test's end
(or 60 s), so no assertion depends on how fast the machine is."""

from __future__ import annotations

import math
import threading

import pytest
import torch
from _float64 import float64_rmsnorm

from lit_rl.data.prompts import Prompt
from lit_rl.learners import PolicyModule
from lit_rl.models.loading import load_causal_lm
from lit_rl.rollout.agent_loop import AgentLoop, EnvRewards
from lit_rl.rollout.engine import HFEngine, SamplingConfig

LONG_S = 60.0  # far beyond every deadline of this file


class CountEnv:
    """Ends after the number of turns the prompt's last character says ("q3": 3); observation ``r<k>`` (a user
    turn: short contexts for the char tokenizer), reward k. ``hooks[(prompt, k)]`` runs inside step k (the tests'
    faults and weight pushes) and its string, if any, is the observation."""

    def __init__(self, hooks=None):
        self.hooks = hooks or {}

    def reset(self, prompt):
        self.k, self.prompt, self.end = 0, prompt.prompt, int(prompt.prompt[-1])
        if (hook := self.hooks.get((self.prompt, 0))) is not None:
            hook(self)
        return prompt.prompt

    def step(self, action):
        self.k += 1
        text = ""
        if (hook := self.hooks.get((self.prompt, self.k))) is not None:
            text = hook(self) or ""
        return text or f"r{self.k}", float(self.k), self.k >= self.end, {}


class AsyncCountEnv(CountEnv):
    async def step(self, action):  # type: ignore[override]
        import asyncio

        await asyncio.sleep(0)
        return super().step(action)


@pytest.fixture(scope="module")
def module64(tiny_model_dir):
    module = PolicyModule(model=str(tiny_model_dir))
    module.model.double()
    return module


def _engine(module) -> HFEngine:
    engine = HFEngine(share_weights=False)
    engine.bind(module)
    return engine


GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=5)


def _exp(loop, prompts, groups):
    return loop.to_experience(prompts, groups, pad_id=0)


def test_async_rows_equal_lockstep_rows(module64):
    """Greedy, float64: the same episodes (1, 3 and 2 turns, 2 each) give identical rows in both modes: ids,
    masks, token rewards, versions; log-probs to float64 rounding (the batches differ)."""
    prompts = [Prompt(prompt=p) for p in ("q1", "q3", "q2")]
    engine = _engine(module64)
    out = {}
    with float64_rmsnorm():
        for mode in ("lockstep", "async"):
            loop = AgentLoop(CountEnv, engine, max_turns=4, concurrency=mode)
            groups = loop.run(prompts, 2, GREEDY)
            out[mode] = (_exp(loop, prompts, groups), groups, loop.last_stats)
    (a, ga, sa), (b, gb, sb) = out["lockstep"], out["async"]
    assert [len(e.turns) for g in ga for e in g] == [1, 1, 3, 3, 2, 2]
    assert [[t.action_ids for t in e.turns] for g in gb for e in g] == [
        [t.action_ids for t in e.turns] for g in ga for e in g
    ]
    for f in ("input_ids", "attention_mask", "loss_mask", "token_rewards", "rewards", "policy_version"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f
    assert torch.equal(a.extras["token_versions"], b.extras["token_versions"])
    torch.testing.assert_close(a.rollout_logprobs, b.rollout_logprobs, rtol=1e-6, atol=0)
    # lock step: one call per turn for every active episode (6, 4, 2); async: the same 18 sequences
    assert sa.calls == 3 and sa.sequences == 12 and sb.sequences == 12


def test_no_episode_waits_for_another(module64):
    """Episode "s1"'s only tool call waits until episode "f3" has finished all 3 of its turns (an Event, 60 s at
    most). Async: f3 runs to its end meanwhile, so the wait is released (in lock step it would time out)."""
    released = threading.Event()
    log: list[str] = []

    def slow(env):
        log.append("slow tool starts")
        ok = released.wait(LONG_S)
        log.append("slow tool ends")
        return "released" if ok else "timed out"

    def fast_end(env):
        log.append("fast episode ends")
        released.set()

    hooks = {("s1", 1): slow, ("f3", 3): fast_end}
    loop = AgentLoop(lambda: CountEnv(hooks), _engine(module64), max_turns=4, concurrency="async")
    s, f = loop.run([Prompt(prompt="s1"), Prompt(prompt="f3")], 1, GREEDY)
    assert s[0].turns[0].obs_text == "released" and len(f[0].turns) == 3 and f[0].status == "done"
    assert log == ["slow tool starts", "fast episode ends", "slow tool ends"]


def test_stream_carries_a_straggler_while_the_next_groups_run(module64):
    """``stream`` with 2 groups in flight: group "s1"'s tool waits until group "q1" has ended, and q1 starts only
    when "f2" (2 turns) frees its slot, so s1 is carried while f2 ends and q1 runs: f2 is yielded first, s1's
    wait is released (q1 and s1 then end together, in either order). Every episode's actions equal ``run``'s
    (greedy)."""
    released = threading.Event()
    hooks = {
        ("s1", 1): lambda env: "released" if released.wait(LONG_S) else "timed out",
        ("q1", 1): lambda env: released.set(),
    }
    prompts = [Prompt(prompt=p) for p in ("s1", "f2", "q1")]
    loop = AgentLoop(lambda: CountEnv(hooks), _engine(module64), max_turns=4, concurrency="async")
    order, streamed = [], {}
    with float64_rmsnorm():
        for p, eps in loop.stream(prompts, 2, GREEDY, max_groups_in_flight=2):
            order.append(p.prompt)
            streamed[p.prompt] = [[t.action_ids for t in e.turns] for e in eps]
            assert all(e.status == "done" for e in eps)
            if p.prompt == "s1":
                assert [e.turns[0].obs_text for e in eps] == ["released", "released"]
        assert loop.last_stats.sequences == 2 * (1 + 2 + 1)
        groups = loop.run(prompts, 2, GREEDY)
    assert order[0] == "f2" and sorted(order) == ["f2", "q1", "s1"]
    assert streamed == {
        p.prompt: [[t.action_ids for t in e.turns] for e in g] for p, g in zip(prompts, groups)
    }


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_weight_sync_inside_an_episode_labels_every_token(module64, tiny_model_dir, mode, capsys):
    """Two episodes of 3 turns, temperature 1. The first step 1 of the batch pushes weights v1, the first step 2
    pushes v2 (``AgentLoop.sync_weights`` from the environment's thread). Every sampled token's version label is
    checked by recomputing its log-prob by hand (float64 forward of the context under that version's weights):
    equal to rtol 1e-6, and far from every other version's. Each episode spans >= 2 versions; the row's
    ``policy_version`` is its oldest token's."""
    engine = _engine(module64)
    base = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    noise = {n: torch.randn(p.shape, generator=g, dtype=torch.float64) for n, p in base.items()}
    weights = {v: {n: base[n] + 0.3 * v * noise[n] * base[n].abs().mean() for n in base} for v in (0, 1, 2)}
    pushed: set[int] = set()
    lock = threading.Lock()
    loop: AgentLoop

    def push(v):
        def hook(env):
            with lock:
                if v not in pushed:
                    pushed.add(v)
                    loop.sync_weights(weights[v].items())

        return hook

    hooks = {("q3", 1): push(1), ("q3", 2): push(2)}
    loop = AgentLoop(lambda: CountEnv(hooks), engine, max_turns=3, concurrency=mode)
    sp = SamplingConfig(temperature=1.0, max_new_tokens=6)
    prompts = [Prompt(prompt="q3")]
    with float64_rmsnorm():
        groups = loop.run(prompts, 2, sp)
        exp = _exp(loop, prompts, groups)
        model = load_causal_lm(str(tiny_model_dir)).double().eval()
        checked, own_err, other_gap, report = 0, 0.0, math.inf, []
        for i, ep in enumerate(groups[0]):
            ctx = list(ep.prompt_ids)
            labels = set()
            for t in ep.turns:
                assert len(t.action_versions) == len(t.action_ids) and len(set(t.action_versions)) == 1
                v = t.action_versions[0]
                labels.add(v)
                lp = {u: _logprobs(model, weights[u], ctx, t.action_ids) for u in (0, 1, 2)}
                torch.testing.assert_close(
                    torch.tensor(t.action_logprobs, dtype=torch.float64), lp[v], rtol=1e-6, atol=0
                )
                own = torch.tensor(t.action_logprobs, dtype=torch.float64)
                own_err = max(own_err, float(((own - lp[v]).abs() / lp[v].abs()).max()))
                for u in {0, 1, 2} - {v}:  # the label is the only version that reproduces the tokens
                    assert (lp[u] - lp[v]).abs().max() > 1e-3
                    other_gap = min(other_gap, float((lp[u] - own).abs().max()))
                checked += len(t.action_ids)
                ctx += t.action_ids + t.obs_ids
            assert len(labels) >= 2 and 0 in labels and 2 in labels  # synced inside the episode
            report.append([t.action_versions[0] for t in ep.turns])
            row = exp.extras["token_versions"][i][exp.loss_mask[i]].tolist()
            assert row == [v for t in ep.turns for v in t.action_versions]
            assert exp.rollout_logprobs[i][exp.loss_mask[i]].tolist() == pytest.approx(
                [x for t in ep.turns for x in t.action_logprobs], rel=1e-6, abs=0
            )
        assert checked == int(exp.loss_mask.sum())
    with capsys.disabled():
        print(
            f"\n{mode}: turn versions per episode {report}; {checked} tokens: max rel. error of the engine's "
            f"log-prob vs its labelled version {own_err:.1e}; closest other version max |diff| {other_gap:.3f}"
        )
    assert exp.policy_version.tolist() == [0, 0] and engine.policy_version == 2


@torch.no_grad()
def _logprobs(model, state, ctx, action) -> torch.Tensor:
    for n, p in model.named_parameters():
        p.copy_(state[n])
    logits = model(input_ids=torch.tensor([ctx + action])).logits[0, len(ctx) - 1 : -1].double()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(action)[:, None])[:, 0]


def _faulted(loop, prompts, n=1):
    groups = loop.run(prompts, n, GREEDY)
    eps = [e for g in groups for e in g]
    return eps, _exp(loop, prompts, groups), EnvRewards()(prompts, groups)


def _kept(ep, exp, i):
    """Every sampled token of the episode is in its row (loss mask on actions), none lost."""
    sampled = [x for t in ep.turns for x in t.action_ids]
    return exp.completion_ids[i][exp.loss_mask[i]].tolist() == sampled and len(sampled) > 0


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_a_hung_tool_is_cut_at_the_deadline(module64, mode):
    """The tool of "h2" hangs (an Event released only after the run): the episode is cut at its 0.3 s
    deadline, its action kept with no observation, masked and counted; the run returns."""
    release = threading.Event()
    hooks = {("h2", 1): lambda env: "late" if release.wait(LONG_S) else "never"}
    loop = AgentLoop(lambda: CountEnv(hooks), _engine(module64), concurrency=mode, episode_timeout_s=0.3)
    try:
        (ep,), exp, rb = _faulted(loop, [Prompt(prompt="h2")])
    finally:
        release.set()
    assert ep.status == "timed_out" and len(ep.turns) == 1 and ep.turns[0].obs_ids == []
    assert _kept(ep, exp, 0) and exp.valid.tolist() == [False]
    assert rb.metrics["agent/episodes_timed_out"] == 1.0 and rb.valid.tolist() == [False]
    assert "timed out" in rb.errors[0]


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_an_environment_that_raises_is_counted_and_masked(module64, mode):
    """Step 2 of "e3" raises and the reset of "r1" raises; the other episode runs on. The raising turn's action
    tokens stay in the row (with version and log-prob), the row is masked and the reason is the error."""

    def boom(env):
        raise RuntimeError("sandbox died")

    def bad_reset(env):
        raise ValueError("no such repo")

    hooks = {("e3", 2): boom, ("r1", 0): bad_reset}
    loop = AgentLoop(lambda: CountEnv(hooks), _engine(module64), concurrency=mode)
    (e, r, ok), exp, rb = _faulted(loop, [Prompt(prompt=p) for p in ("e3", "r1", "q2")])
    assert (e.status, r.status, ok.status) == ("env_error", "env_error", "done")
    assert len(e.turns) == 2 and e.turns[1].obs_ids == [] and _kept(e, exp, 0)
    assert r.turns == [] and exp.extras["token_versions"][0][exp.loss_mask[0]].tolist() == [0] * sum(
        len(t.action_ids) for t in e.turns
    )
    assert exp.valid.tolist() == [False, False, True] and rb.metrics["agent/env_errors"] == 2.0
    assert "RuntimeError: sandbox died" in rb.errors[0] and "ValueError: no such repo" in rb.errors[1]
    assert rb.errors[2] is None and rb.total[2].item() == 3.0


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_an_episode_over_its_token_budget_is_masked(module64, mode):
    """``max_episode_tokens=12``: every turn of the tiny model's template holds more than 12 tokens (5 sampled +
    the tool message), so each 3-turn episode ends after turn 1, all its tokens kept, masked and counted."""
    loop = AgentLoop(CountEnv, _engine(module64), concurrency=mode, max_episode_tokens=12)
    (ep,), exp, rb = _faulted(loop, [Prompt(prompt="q3")])
    completion = len(ep.turns[0].action_ids) + len(ep.turns[0].obs_ids)
    assert completion > 12 and ep.status == "over_budget" and len(ep.turns) == 1
    assert int(exp.attention_mask[0, exp.prompt_len :].sum()) == completion and _kept(ep, exp, 0)
    assert exp.valid.tolist() == [False] and rb.metrics["agent/episodes_over_budget"] == 1.0


def test_min_finished_cuts_the_straggler(module64):
    """``min_finished=0.5`` of 2 episodes: "q1" ends after one turn, "w2"'s tool waits on an Event (released
    after the run): the batch completes with w2 cut, its action kept and masked, counted."""
    release = threading.Event()
    hooks = {("w2", 1): lambda env: "late" if release.wait(LONG_S) else "never"}
    loop = AgentLoop(lambda: CountEnv(hooks), _engine(module64), concurrency="async", min_finished=0.5)
    try:
        (done, cut), exp, rb = _faulted(loop, [Prompt(prompt="q1"), Prompt(prompt="w2")])
    finally:
        release.set()
    assert (done.status, cut.status) == ("done", "cut") and _kept(cut, exp, 1)
    assert exp.valid.tolist() == [True, False] and rb.metrics["agent/episodes_cut"] == 1.0


@pytest.mark.parametrize("mode", ["lockstep", "async"])
def test_async_def_step_environments(module64, mode):
    """An environment whose ``step`` is ``async def`` runs in both modes: same turns and rewards."""
    loop = AgentLoop(AsyncCountEnv, _engine(module64), concurrency=mode)
    (ep,), _, rb = _faulted(loop, [Prompt(prompt="q2")])
    assert ep.status == "done" and [t.reward for t in ep.turns] == [1.0, 2.0] and rb.total.tolist() == [3.0]
    assert [t.obs_text for t in ep.turns] == ["r1", "r2"]


def test_bad_settings_are_refused(module64):
    for kw, name in (
        ({"concurrency": "threads"}, "concurrency"),
        ({"episode_timeout_s": 0}, "episode_timeout_s"),
        ({"max_episode_tokens": 0}, "max_episode_tokens"),
        ({"min_finished": 0.0}, "min_finished"),
        ({"max_batch": 0}, "max_batch"),
    ):
        with pytest.raises(ValueError, match=name):
            AgentLoop(CountEnv, HFEngine(), **kw)
