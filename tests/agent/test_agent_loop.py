"""AgentLoop: interleaved actions/observations, masks, turn-reward placement, advantages, GRPO end to end."""

from __future__ import annotations

import functools
import json

import lightning as L
import pytest
import torch
from _scripted_engine import ScriptedEngine
from _timing import FINISH_S
from transformers import AutoTokenizer

from lit_rl.callbacks.agent_rollout import AgentRolloutCallback, ObservationLoss
from lit_rl.core.advantages import AdvantageInputs, compute_advantages
from lit_rl.data import PromptDataModule
from lit_rl.data.prompts import Prompt
from lit_rl.learners import LossTerm, PolicyModule
from lit_rl.rewards.code import CodeTestsReward
from lit_rl.rewards.sandbox import Sandbox, SandboxLimits
from lit_rl.rollout.agent_loop import AgentLoop
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.env import RETRY_FIXED, RetryRepoEnv

SP = SamplingConfig(max_new_tokens=4)


class CountingEnv:
    """Reward k at turn k; ends after 3 turns; observation 'o<k>'. ``infra`` flags an infra error at turn 2."""

    def __init__(self, infra=False):
        self.k, self.infra = 0, infra

    def reset(self, prompt):
        self.k = 0
        return "go"

    def step(self, action):
        self.k += 1
        info = {"infra_error": 1.0} if self.infra and self.k == 2 else {}
        return f"o{self.k}", float(self.k), self.k == 3, info


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def verifier():
    return CodeTestsReward(
        "binary",
        timeout_s=FINISH_S,
        sandbox=Sandbox(SandboxLimits(cpu_s=2, memory_mb=300), timeout_s=FINISH_S),
    )


def _run(loop, prompts, n=1):
    return loop.to_experience(prompts, loop.run(prompts, n, SP), pad_id=0)


def test_scripted_correct_fix_through_the_loop(tok, verifier):
    actions = ["read_file retry.py", "write_file retry.py\n" + RETRY_FIXED, "submit"]
    loop = AgentLoop(lambda: RetryRepoEnv(verifier=verifier), ScriptedEngine(tok, actions), max_turns=5)
    ep = loop.run([Prompt(prompt="fix it")], 1, SP)[0][0]
    assert [t.action_text for t in ep.turns] == actions and ep.done
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 1.0] and ep.turns[
        -1
    ].obs_text == "submitted: 4/4 tests passed"
    exp = loop.to_experience([Prompt(prompt="fix it")], [[ep]], pad_id=0)
    assert exp.rewards.tolist() == [1.0] and exp.valid.tolist() == [True]
    assert exp.token_rewards.abs().sum().item() == 0.0  # the only reward (turn 3) is the row reward


def test_token_layout_masks_and_logprobs(tok):
    loop = AgentLoop(CountingEnv, ScriptedEngine(tok, ["ab", "c", "de"]), max_turns=5)
    exp = _run(loop, [Prompt(prompt="p")])
    ep_prompt = loop.prompt_ids(tok, "go")
    a = [tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for s in ("ab", "c", "de")]
    o = [loop.observation_ids(tok, f"o{k}") for k in (1, 2, 3)]
    expected = a[0] + o[0] + a[1] + o[1] + a[2] + o[2]
    assert exp.prompt_len == len(ep_prompt) and exp.input_ids[0, : exp.prompt_len].tolist() == ep_prompt
    assert exp.completion_ids[0].tolist() == expected
    kinds = (
        [True] * len(a[0])
        + [False] * len(o[0])
        + [True] * len(a[1])
        + [False] * len(o[1])
        + [True] * len(a[2])
        + [False] * len(o[2])
    )
    assert exp.loss_mask[0].tolist() == kinds
    assert exp.extras["obs_mask"][0].tolist() == [not k for k in kinds]
    assert exp.rollout_logprobs[0].tolist() == [-0.5 if k else 0.0 for k in kinds]
    # turn rewards 1, 2 on the last tokens of actions 1, 2; reward 3 (last action) is the row reward
    last1, last2 = len(a[0]) - 1, len(a[0]) + len(o[0]) + len(a[1]) - 1
    tr = torch.zeros(len(expected))
    tr[last1], tr[last2] = 1.0, 2.0
    assert exp.token_rewards[0].tolist() == tr.tolist() and exp.rewards.tolist() == [3.0]
    assert exp.reward_components["env_return"].tolist() == [6.0] and exp.finish_reasons == ["stop"]


def test_reinforce_gives_reward_to_go_per_turn_and_gae_matches(tok):
    loop = AgentLoop(CountingEnv, ScriptedEngine(tok, ["ab", "c", "de"]), max_turns=5)
    exp = _run(loop, [Prompt(prompt="p")])
    inp = {
        "rewards": exp.rewards.double(),
        "mask": exp.loss_mask,
        "token_rewards": exp.token_rewards.double(),
        "valid": exp.valid,
        "group_ids": exp.group_ids,
        "gamma": 1.0,
        "lam": 1.0,
    }
    adv = compute_advantages("reinforce", AdvantageInputs(**inp)).advantages[0]
    turn = torch.cumsum(
        torch.tensor(
            [0]
            + [int(exp.loss_mask[0, t - 1] and not exp.loss_mask[0, t]) for t in range(1, exp.completion_len)]
        ),
        0,
    )  # action index per token
    want = torch.tensor([(6.0, 5.0, 3.0)[min(int(k), 2)] for k in turn], dtype=torch.float64)
    torch.testing.assert_close(
        adv, torch.where(exp.loss_mask[0], want, torch.zeros_like(want)), rtol=1e-6, atol=0
    )
    gae = compute_advantages(
        "gae", AdvantageInputs(**inp, values=torch.zeros_like(inp["token_rewards"]))
    ).advantages[0]
    torch.testing.assert_close(gae, adv, rtol=1e-6, atol=0)
    grpo_score = exp.rewards + exp.token_rewards.sum(-1)
    assert grpo_score.tolist() == [6.0]  # the episode return is what outcome-level estimators see


def test_ragged_episodes_pad_and_group(tok):
    class Short(CountingEnv):
        def step(self, action):
            obs, r, _done, info = super().step(action)
            return obs, r, True, info  # ends after one turn

    loop_long = AgentLoop(CountingEnv, ScriptedEngine(tok, ["ab", "c", "de"]), max_turns=5)
    loop_short = AgentLoop(Short, ScriptedEngine(tok, ["ab"]), max_turns=5)
    p = [Prompt(prompt="p")]
    long_ep, short_ep = loop_long.run(p, 1, SP)[0][0], loop_short.run(p, 1, SP)[0][0]
    exp = loop_long.to_experience(
        [p[0], p[0]], [[long_ep, short_ep], [short_ep, long_ep]], pad_id=0, first_group=7
    )
    assert exp.group_ids.tolist() == [7, 7, 8, 8] and exp.rewards.tolist() == [3.0, 1.0, 1.0, 3.0]
    n_short = len(short_ep.turns[0].action_ids) + len(short_ep.turns[0].obs_ids)
    assert not exp.loss_mask[1, n_short:].any() and not exp.extras["obs_mask"][1, n_short:].any()
    assert exp.attention_mask[1, exp.prompt_len + n_short :].sum() == 0  # right padding is not attended
    torch.testing.assert_close(exp.select([1]).loss_mask[0, :n_short], exp.loss_mask[2, :n_short])


def test_max_turns_and_infra_error(tok):
    exp = _run(
        AgentLoop(CountingEnv, ScriptedEngine(tok, ["ab", "c", "de"]), max_turns=2), [Prompt(prompt="p")]
    )
    assert (
        exp.finish_reasons == ["length"] and exp.rewards.tolist() == [2.0] and exp.token_rewards.sum() == 1.0
    )
    bad = _run(
        AgentLoop(lambda: CountingEnv(infra=True), ScriptedEngine(tok, ["ab", "c", "de"])),
        [Prompt(prompt="p")],
    )
    assert bad.valid.tolist() == [False] and torch.isnan(bad.rewards).all()


class _Agg:
    """What ObservationLoss needs of a module: ``aggregate`` with the minibatch denominators in ``fwd``."""

    def __init__(self, mode):
        self.mode = mode

    def aggregate(self, values, mask, fwd):
        from lit_rl.core.aggregation import aggregate

        return aggregate(values, mask, self.mode, num_tokens=fwd["num_tokens"], num_seqs=fwd["num_seqs"])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_mean", 0.5 * (2 + 3 + 4) / 8),  # Σ obs NLL / the minibatch's 8 trainable tokens
        (
            "seq_mean_token_mean",
            0.5 * ((2 + 3) / 2 + 4 / 1) / 5,
        ),  # per-row obs means / the minibatch's 5 rows
    ],
)
def test_observation_loss_term_uses_the_minibatch_denominators(mode, expected):
    micro = type(
        "M",
        (),
        {
            "extras": {"obs_mask": torch.tensor([[False, True, True], [True, False, False]])},
            "train_rows": torch.tensor([True, True]),
        },
    )()
    fwd = {
        "logprobs": torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]], dtype=torch.float64),
        "num_tokens": 8,
        "num_seqs": 5,
    }
    assert ObservationLoss(0.0).loss_terms(_Agg(mode), micro, fwd) == {}
    got = ObservationLoss(0.5).loss_terms(_Agg(mode), micro, fwd)["world_model"]
    assert float(got) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="coef must be >= 0"):
        ObservationLoss(-1.0)


def _obs_experience():
    """3 rows, completion layout A = action (loss_mask), O = observation (obs_mask), . = padding."""
    from lit_rl.data.experience import Experience

    layout = ["AAOOA.", "AOOOAA", "AAA..."]  # row 2 has no observation token
    B, P, C = len(layout), 2, len(layout[0])
    ids = torch.randint(5, 60, (B, P + C), generator=torch.Generator().manual_seed(0))
    loss_mask = torch.tensor([[c == "A" for c in row] for row in layout])
    obs = torch.tensor([[c == "O" for c in row] for row in layout])
    att = torch.ones(B, P + C, dtype=torch.long)
    att[:, P:] = (loss_mask | obs).long()
    return Experience(
        input_ids=ids,
        attention_mask=att,
        loss_mask=loss_mask,
        prompt_len=P,
        group_ids=torch.zeros(B, dtype=torch.long),
        rewards=torch.ones(B, dtype=torch.float64),
        valid=torch.ones(B, dtype=torch.bool),
        policy_version=torch.zeros(B, dtype=torch.long),
        extras={"obs_mask": obs},
    )


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_observation_loss_is_micro_batch_invariant(tiny_model_dir, loss_agg):
    """The same Experience as 1 micro-batch or as 3: identical summed loss and gradient (float64), equal to the
    hand-aggregated whole-batch value. A per-micro-batch mean would count the term once per micro-batch."""
    from lit_rl.core.logprobs import token_logprobs

    module = PolicyModule(model=str(tiny_model_dir), loss_agg=loss_agg)
    module.model.double()
    exp, term = _obs_experience(), ObservationLoss(0.5)
    # the minibatch denominators PolicyModule passes every LossTerm: trainable tokens / rows of the minibatch
    common = {"num_tokens": float(exp.loss_mask.sum()), "num_seqs": float(exp.loss_mask.any(-1).sum())}
    results = []
    for size in (None, 1):
        module.model.zero_grad(set_to_none=True)
        total = 0.0
        for micro in exp.micro_batches(size):
            logits = module.forward_logits(micro)  # (b, C, V) float64
            fwd = dict(
                common,
                logits=logits,
                logprobs=token_logprobs(logits, micro.completion_ids),
                mask=micro.loss_mask,
                hidden=None,
            )
            loss = term.loss_terms(module, micro, fwd)["world_model"]
            loss.backward()
            total += float(loss.detach())
        results.append(
            (total, {n: p.grad.clone() for n, p in module.model.named_parameters() if p.grad is not None})
        )
    with torch.no_grad():
        nll = -token_logprobs(module.forward_logits(exp), exp.completion_ids)  # (B, C)
    obs = exp.extras["obs_mask"]
    if loss_agg == "token_mean":
        expected = 0.5 * float(nll[obs].sum()) / 9  # 9 action tokens
    else:
        expected = 0.5 * sum(float(nll[i][obs[i]].mean()) for i in (0, 1)) / 3  # 3 rows with actions
    assert results[0][0] == pytest.approx(expected, rel=1e-12)
    assert results[1][0] == pytest.approx(expected, rel=1e-12)
    assert results[0][1].keys() == results[1][1].keys() and results[0][1]
    for name, g in results[0][1].items():
        torch.testing.assert_close(results[1][1][name], g, rtol=1e-10, atol=1e-14)


def test_bad_arguments():
    with pytest.raises(ValueError, match="max_turns"):
        AgentLoop(CountingEnv, max_turns=0)
    with pytest.raises(TypeError, match="env_factory must be callable"):
        AgentLoop("env")


class MaskSpy(L.Callback, LossTerm):
    """ExperienceHook + LossTerm: records what the module trains on."""

    def __init__(self):
        self.seen = []

    def on_experience(self, trainer, module, exp):
        self.seen.append(("exp", exp))

    def loss_terms(self, module, micro, fwd):
        obs = micro.extras["obs_mask"].to(fwd["mask"].device)
        self.seen.append(
            ("loss", bool((fwd["mask"] & obs).any()), bool(micro.advantages[obs].abs().sum() == 0))
        )
        return {}


def test_grpo_end_to_end_on_retry_env(tiny_model_dir, tmp_path, verifier):
    path = tmp_path / "retry.jsonl"
    path.write_text(json.dumps({"prompt": "Fix the retry setting."}) + "\n")
    agent = AgentLoop(lambda: RetryRepoEnv(verifier=verifier), HFEngine(), max_turns=2, max_obs_tokens=48)
    spy = MaskSpy()
    module = PolicyModule(model=str(tiny_model_dir), optimizer=functools.partial(torch.optim.AdamW, lr=1e-3))
    trainer = L.Trainer(
        max_steps=2,
        max_epochs=-1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[
            AgentRolloutCallback(agent, group_size=2, sampling=SamplingConfig(max_new_tokens=6)),
            ObservationLoss(0.1),
            spy,
        ],
    )
    trainer.fit(module, datamodule=PromptDataModule(train_files=[str(path)], batch_size=1))
    exps = [s[1] for s in spy.seen if s[0] == "exp"]
    assert len(exps) == 2 and module.global_step == 2
    for exp in exps:
        obs = exp.extras["obs_mask"]
        assert exp.batch_size == 2 and obs.any() and exp.loss_mask.any()
        assert not (exp.loss_mask & obs).any()  # no observation token carries policy loss
        real = exp.attention_mask[:, exp.prompt_len :].bool()
        assert torch.equal(exp.loss_mask | obs, real)  # every completion token is exactly one of the two
        assert exp.valid.all() and exp.rewards.tolist() == [0.0, 0.0]  # random actions never submit a fix
    losses = [s for s in spy.seen if s[0] == "loss"]
    assert losses and all(s == ("loss", False, True) for s in losses)
