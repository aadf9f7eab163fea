"""Credit assignment inside an agent episode (issue 54.4, the lecture's mistake-then-recovery trajectory).

A calculator episode of three turns: a malformed call (the mistake), the right call (the recovery), the answer
(reward 1). Checked by hand in float64 through the agent path's own pieces (``AgentLoop`` rows,
``PolicyModule.compute_advantages``, the inspector's per-turn records): trajectory-level GRPO and reward-to-go
give every turn the same credit, GAE with values gives each turn its own; and a critic on the shared backbone
reads, at the first token of a turn, the state after the previous turn's tool reply. The last test runs
``scripts/agent_credit.py`` end to end on the tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from _scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from lit_rl.callbacks._agent_turns import turn_records
from lit_rl.data.prompts import Prompt
from lit_rl.learners import PolicyModule
from lit_rl.learners.critic import CriticModule
from lit_rl.rollout.agent_envs import CalculatorEnv
from lit_rl.rollout.agent_loop import AgentLoop
from lit_rl.rollout.engine import SamplingConfig

ROOT = Path(__file__).resolve().parents[2]
BAD = '<tool_call>{"name": "calculator", "arguments": {"expression": "347 x 829"}}</tool_call>'
GOOD = '<tool_call>{"name": "calculator", "arguments": {"expression": "347 * 829"}}</tool_call>'
ANSWER = "287663"
PROMPT = Prompt(messages=[{"role": "user", "content": "What is 347 * 829?"}], answer="287663")


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _episode(tok):
    """The recovered episode as one Experience row, and each turn's action-token positions."""
    loop = AgentLoop(
        lambda: CalculatorEnv(demonstrations=0, system=None, max_tool_calling_iterations=2),
        ScriptedEngine(tok, [BAD, GOOD, ANSWER]),
        max_turns=3,
    )
    eps = loop.run([PROMPT], 1, SamplingConfig(max_new_tokens=4))
    (ep,) = eps[0]
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 1.0]
    assert "error" in ep.turns[0].obs_text and "287663" in ep.turns[1].obs_text  # the mistake, then its fix
    exp = loop.to_experience([PROMPT], eps, pad_id=0)
    turns, pos = [], 0
    for t in ep.turns:
        turns.append(list(range(pos, pos + len(t.action_ids))))
        pos += len(t.action_ids) + len(t.obs_ids)
    return exp, turns


def _hand_gae(rewards: list[float], values: list[float], lam: float) -> list[float]:
    """A_t = sum_l lam^l delta_{t+l} over the action tokens in order (gamma 1, V = 0 after the last), written
    as the sum, not the recursion the estimator runs."""
    n = len(values)
    delta = [rewards[t] + (values[t + 1] if t + 1 < n else 0.0) - values[t] for t in range(n)]
    return [sum(lam**k * delta[t + k] for k in range(n - t)) for t in range(n)]


@pytest.mark.parametrize("lam", [1.0, 0.5])
def test_per_turn_advantages_of_a_recovered_episode_by_hand(tok, tiny_model_dir, lam):
    exp, turns = _episode(tok)
    # hand values per turn: 0.5 before the mistake, 0.2 after its error reply, 0.9 after the right result
    v_turn = [0.5, 0.2, 0.9]
    values = torch.zeros(exp.loss_mask.shape, dtype=torch.float64)
    for k, toks in enumerate(turns):
        values[0, toks] = v_turn[k]
    flat = [t for toks in turns for t in toks]
    r = [0.0] * len(flat)
    r[-1] = 1.0
    hand = _hand_gae(r, [v_turn[k] for k, toks in enumerate(turns) for _ in toks], lam)
    hand_turn, i = [], 0
    for toks in turns:
        hand_turn.append(sum(hand[i : i + len(toks)]) / len(toks))
        i += len(toks)

    def advantages(**settings):
        mod = PolicyModule(model=str(tiny_model_dir), whiten_advantages=False, **settings)
        exp.values = values if settings.get("advantage") == "gae" else None
        mod.compute_advantages(exp)
        return [t["advantage"] for t in turn_records(exp, 0)], exp.advantages[0].double()

    per_turn, adv = advantages(advantage="gae", gamma=1.0, lam=lam)
    torch.testing.assert_close(adv[flat], torch.tensor(hand, dtype=torch.float64), rtol=1e-9, atol=1e-12)
    assert adv[~exp.loss_mask[0]].abs().sum() == 0  # observation tokens carry no advantage
    torch.testing.assert_close(per_turn, hand_turn, rtol=1e-9, atol=1e-12)
    if lam == 1.0:  # A_t = G_t - V_t: each turn's return minus the value of its own state
        torch.testing.assert_close(per_turn, [0.5, 0.8, 0.1], rtol=1e-9, atol=1e-12)
    else:  # the TD errors reach back: the mistake's turn pays for the drop its error reply caused, the fix
        # is paid for the rise (lambda applies per action token, so a turn's early tokens get little of either)
        assert per_turn[0] < 0 < per_turn[2] and per_turn[1] > 0
    # reward-to-go without a critic: with one reward at the end every action token's G_t is the return
    rtg, _ = advantages(advantage="reinforce", gamma=1.0)
    assert rtg == [1.0, 1.0, 1.0]
    # trajectory-level GRPO: one number per episode; a group of one has no baseline, so 0 on every turn
    grpo, _ = advantages(advantage="grpo")
    assert grpo == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("head", ["regression", "token"])
def test_the_critic_reads_the_state_after_each_tool_reply(tok, tiny_model_dir, head):
    """V at the first action token of turn k is the value of (prompt, turns < k, their observations): the state
    after the tool's reply, from a separate forward over exactly that prefix (float64)."""
    # a one-character question: the char tokenizer's episode is ~300 tokens, and the head asks after each of them
    kw = {"yes_token": "Y", "no_token": "N", "question": "?"} if head == "token" else {}
    mod = PolicyModule(model=str(tiny_model_dir), critic=CriticModule(head=head, **kw)).double()
    if head == "regression":  # the head starts at zero (V = 0): give it weights to read
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            mod.critic.head.weight.copy_(torch.randn(mod.critic.head.weight.shape, generator=g))
            mod.critic.head.bias.fill_(0.25)
    exp, turns = _episode(tok)
    mod.critic.attach_values(mod, exp)
    ids = exp.input_ids[0][exp.attention_mask[0].bool()]
    P = exp.prompt_len - int((~exp.attention_mask[0, : exp.prompt_len].bool()).sum())
    for toks in turns:
        prefix = ids[: P + toks[0]]  # the prompt and every token before this turn's first action token
        with torch.no_grad():
            if head == "regression":
                h = mod.model.get_decoder()(input_ids=prefix[None]).last_hidden_state[0, -1]
                want = float(mod.critic.head(h.to(mod.critic.head.weight.dtype)))
            else:
                q = mod.critic.question_ids
                logits = mod.model(input_ids=torch.cat([prefix, q])[None]).logits[0, -1]
                yes, no = mod.critic.token_ids
                want = float(torch.sigmoid(logits[yes] - logits[no]))
        got = float(exp.values[0, toks[0]])
        assert abs(got - want) <= 1e-9 * max(1.0, abs(want)), (toks[0], got, want)
    assert exp.values[0][~exp.loss_mask[0]].abs().sum() == 0  # no value on observation tokens


def _script():
    spec = importlib.util.spec_from_file_location("agent_credit", ROOT / "scripts/agent_credit.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_variant_settings_and_bad_variant():
    s = _script()
    assert s.variant_model_args("grpo", False, 1.0) == {"advantage": "grpo"}
    assert s.variant_model_args("rtg", False, 1.0)["advantage"] == "reinforce"
    reg = s.variant_model_args("gae_reg", False, 0.9)
    assert (reg["advantage"], reg["lam"], reg["critic"]["init_args"]) == ("gae", 0.9, {"head": "regression"})
    assert s.variant_model_args("gae_tok", True, 1.0)["critic"]["init_args"]["yes_token"] == "Y"
    with pytest.raises(ValueError, match="valid values: grpo, rtg, gae_reg, gae_tok"):
        s.variant_model_args("ppo", False, 1.0)


@pytest.mark.slow
def test_agent_credit_script_on_the_tiny_model(tiny_model_dir, tmp_path, monkeypatch, capsys):
    """Every variant trains one iteration of the guessing game (the tiny model's episodes have two turns: a
    reply and the reminder's answer) in its own process; the table lists them all, the value heads' parameters
    are counted, and the GAE runs' inspector records per-turn advantages that differ between turns."""
    monkeypatch.chdir(tmp_path)
    s = _script()
    out = tmp_path / "credit"
    rows = s.main(
        [
            "--tiny",
            "--model",
            str(tiny_model_dir),
            "--recipe",
            str(ROOT / "configs/agent_guess.yaml"),
            "--iterations",
            "1",
            "--eval-prompts",
            "2",
            "--seeds",
            "0",
            "--out",
            str(out),
        ]
    )
    assert [r["variant"] for r in rows] == ["grpo", "rtg", "gae_reg", "gae_tok"]
    assert all(r["iterations"] == 1 and r["eval_steps"] == [0, 1] for r in rows)
    hidden = json.loads((Path(tiny_model_dir) / "config.json").read_text())["hidden_size"]
    assert {r["variant"]: r["value_params"] for r in rows} == {
        "grpo": 0,
        "rtg": 0,
        "gae_reg": hidden + 1,
        "gae_tok": 0,
    }
    table = capsys.readouterr().out
    for v in ("grpo", "rtg", "gae_reg", "gae_tok"):
        assert f"\n{v} | 0 | " in table
    # the token head's values differ from prefix to prefix, so its turns' advantages differ (the regression head
    # starts at V = 0 and the tiny model wins nothing: its advantages are 0); grpo's turns always agree
    tok = {r["variant"]: r for r in rows}["gae_tok"]
    assert tok["multi_turn_episodes"] > 0 and tok["turns_differ"] == tok["multi_turn_episodes"]
    per_turn = s.turn_advantages(out / "grpo_s0")
    assert per_turn and all(len(set(t)) == 1 for t in per_turn)


def test_report_lists_each_turns_calls_reward_and_advantage(tok, tiny_model_dir, tmp_path):
    """``lit-rl inspect``'s page (headless Chromium) shows, under the recovered episode, each turn's tool call (or
    its error), reward and advantage: GAE's 0.5, 0.8, 0.1 of the hand test (lam 1)."""
    from lit_rl.callbacks.inspector import row_records, write_rows
    from lit_rl.report import write_report
    from lit_rl.report.chromium import dump_dom, find_chromium

    if find_chromium() is None:
        pytest.skip("headless Chromium not installed (scripts/install.sh installs it with the dev extra)")
    exp, turns = _episode(tok)
    exp.values = torch.zeros(exp.loss_mask.shape, dtype=torch.float64)
    for k, toks in enumerate(turns):
        exp.values[0, toks] = (0.5, 0.2, 0.9)[k]
    mod = PolicyModule(
        model=str(tiny_model_dir), whiten_advantages=False, advantage="gae", gamma=1.0, lam=1.0
    )
    mod.compute_advantages(exp)
    rows = [{"step": 1, **r} for r in row_records(exp, tokenizer=tok)]
    (tmp_path / "run" / "rollouts").mkdir(parents=True)
    write_rows(tmp_path / "run" / "rollouts" / "step_000001.jsonl", rows)
    dom = dump_dom(write_report(tmp_path / "run").as_uri())
    tbody = dom[dom.index('<tbody id="tbody">') : dom.index("</tbody>")]
    drawn = re.findall(
        r'<tr class="turn"><td>turn (\d)</td><td>(.*?)</td><td>r ([^<]*)</td><td class="tadv">adv ([^<]*)</td>',
        tbody,
    )
    assert [(k, r, a) for k, _, r, a in drawn] == [
        ("1", "0", "+0.500"),
        ("2", "0", "+0.800"),
        ("3", "1", "+0.100"),
    ], tbody[-3000:]
    calls = [c for _, c, _, _ in drawn]
    # the mistake is a well-formed call the tool refuses (its error is the observation), the fix the right one
    assert calls[0].startswith("calculator(") and "347 x 829" in calls[0]
    assert calls[1].startswith("calculator(") and "347 * 829" in calls[1] and "no call" in calls[2]
