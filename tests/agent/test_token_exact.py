"""Token-exact episodes (issue 54.2): each trained row is the engine's inputs and samples, turn by turn, never a
re-rendered history; a re-tokenised history is caught by the same check, and what it would change is shown."""

from __future__ import annotations

from typing import ClassVar

import pytest
from _tool_helpers import IdsEngine, Recording, multiply
from transformers import AutoTokenizer

from lit_rl.data.prompts import Prompt
from lit_rl.learners import PolicyModule
from lit_rl.rollout.agent_loop import AgentLoop
from lit_rl.rollout.engine import HFEngine, SamplingConfig
from lit_rl.rollout.tools import Tool


class EchoToolEnv:
    """Never ends (``max_turns`` does): every action gets the tool message ``r<k>``; the prompt carries a tool."""

    tool_schemas: ClassVar[list] = [Tool(multiply).schema]

    def reset(self, prompt):
        self.k = 0
        return [{"role": "user", "content": prompt.prompt}]

    def step(self, action):
        self.k += 1
        return [{"role": "tool", "name": "multiply", "content": f"r{self.k}"}], float(self.k), False, {}


def row_ids(exp, i: int) -> list[int]:
    """Row i's real tokens (left-padded prompt + right-padded completion, padding dropped)."""
    return exp.input_ids[i][exp.attention_mask[i].bool()].tolist()


def turn_mismatches(rows: list[list[int]], calls, n_rows: int) -> list[str]:
    """Where the rows are not the engine's history: at call k (row j's k-th turn, every episode active) the
    engine's input must be the row's first tokens and its sample the tokens right after them."""
    bad = []
    for k, (inputs, outputs) in enumerate(calls):
        assert len(inputs) == n_rows  # every episode runs every turn (the environment never ends them)
        for j, (given, (sampled,)) in enumerate(zip(inputs, outputs)):
            if rows[j][: len(given)] != given:
                bad.append(f"row {j} turn {k}: the engine's input is not the row's prefix")
            elif rows[j][len(given) : len(given) + len(sampled)] != sampled:
                bad.append(f"row {j} turn {k}: the sampled tokens are not the row's next tokens")
    return bad


def rerendered(tok, episodes, renderer) -> list[list[int]]:
    """What a trainer that re-renders the history would train on: the whole conversation (opening, each action's
    text as an assistant message, each observation as tool messages) through the chat template."""
    rows = []
    for ep in episodes:
        msgs = [{"role": "user", "content": "q"}]
        for t in ep.turns:
            msgs += [
                {"role": "assistant", "content": t.action_text},
                {"role": "tool", "name": "multiply", "content": t.obs_text},
            ]
        rows.append(renderer.prompt_ids(msgs))
    return rows


def _run(engine, n_prompts=2, n=2, turns=3, max_new_tokens=6):
    loop = AgentLoop(EchoToolEnv, engine, max_turns=turns)
    prompts = [Prompt(prompt="q") for _ in range(n_prompts)]
    sp = SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens)
    episodes = loop.run(prompts, n, sp)
    exp = loop.to_experience(prompts, episodes, pad_id=0)
    return loop, [e for g in episodes for e in g], exp


def test_rows_are_the_engine_inputs_turn_by_turn(tiny_model_dir):
    """Real sampling (tiny model, temperature 1, HFEngine): 4 episodes x 3 turns, each row checked at every turn;
    loss only on the sampled tokens, whose rollout log-probs are the engine's."""
    module = PolicyModule(model=str(tiny_model_dir))
    engine = Recording(HFEngine())
    engine.bind(module)
    _, eps, exp = _run(engine)
    rows = [row_ids(exp, i) for i in range(exp.batch_size)]
    assert len(engine.calls) == 3 and turn_mismatches(rows, engine.calls, 4) == []
    for i, ep in enumerate(eps):  # the row ends with the last action and its observation, nothing re-rendered
        last_in, (last_out,) = engine.calls[-1][0][i], engine.calls[-1][1][i]
        assert rows[i] == last_in + last_out + ep.turns[-1].obs_ids
        comp = exp.completion_ids[i][exp.attention_mask[i, exp.prompt_len :].bool()].tolist()
        sampled = [tok for t in ep.turns for tok in t.action_ids]
        assert exp.completion_ids[i][exp.loss_mask[i]].tolist() == sampled  # loss on sampled tokens only
        assert exp.rollout_logprobs[i][exp.loss_mask[i]].tolist() == pytest.approx(
            [lp for t in ep.turns for lp in t.action_logprobs], rel=1e-6, abs=0
        )
        assert exp.extras["obs_mask"][i].sum() == len(comp) - len(sampled)


def test_a_retokenised_history_goes_red(smollm2_dir):
    """SmolLM2's BPE: the engine samples "The| ans|wer| is" (4 tokens; the tokenizer's own split of that text is
    "The| answer| is", 3). The rows pass the turn-by-turn check; the re-rendered history fails it at every turn
    (its tokens after the first input are not the sample, later inputs are not its prefix)."""
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    sampled = [tok.convert_tokens_to_ids(t) for t in ("The", "Ġans", "wer", "Ġis")] + [tok.eos_token_id]
    assert tok(tok.decode(sampled, skip_special_tokens=True), add_special_tokens=False)["input_ids"] == [
        504,
        2988,
        314,
    ]
    engine = Recording(IdsEngine(tok, [sampled] * 3))
    loop, eps, exp = _run(engine, n_prompts=1, n=1)
    rows = [row_ids(exp, 0)]
    assert turn_mismatches(rows, engine.calls, 1) == []
    redone = rerendered(tok, eps, loop.renderer(tok, EchoToolEnv.tool_schemas))
    assert turn_mismatches(redone, engine.calls, 1) == [
        "row 0 turn 0: the sampled tokens are not the row's next tokens",
        "row 0 turn 1: the engine's input is not the row's prefix",
        "row 0 turn 2: the engine's input is not the row's prefix",
    ]
    # the re-rendered row holds the text's canonical tokens where the sampled ones were
    start = len(eps[0].prompt_ids)
    assert redone[0][start : start + 4] == [504, 2988, 314, tok.eos_token_id]
    assert rows[0][start : start + 5] == sampled
    assert len(redone[0]) == len(rows[0]) - 3  # one token fewer per turn


@pytest.mark.real_ckpt
@pytest.mark.slow
def test_what_retokenising_would_have_changed_on_smollm2_samples(smollm2_dir, capsys):
    """SmolLM2 sampling at temperature 1 (8 episodes x 3 turns x 16 tokens): the rows equal the engine's inputs
    turn by turn; decoding each sampled action and tokenising it again changes some of them, and re-rendering
    the history changes rows. The numbers are printed (the README quotes them)."""
    module = PolicyModule(model=smollm2_dir)
    engine = Recording(HFEngine())
    engine.bind(module)
    tok = engine.tokenizer
    loop, eps, exp = _run(engine, n_prompts=2, n=4, turns=3, max_new_tokens=16)
    rows = [row_ids(exp, i) for i in range(exp.batch_size)]
    assert turn_mismatches(rows, engine.calls, 8) == []
    actions = [t.action_ids for e in eps for t in e.turns]
    changed = [
        a
        for a in actions
        if tok(tok.decode(a, skip_special_tokens=False), add_special_tokens=False)["input_ids"] != a
    ]
    redone = rerendered(tok, eps, loop.renderer(tok, EchoToolEnv.tool_schemas))
    differ = sum(r != o for r, o in zip(redone, rows))
    with capsys.disabled():
        print(
            f"\nre-tokenising: {len(changed)}/{len(actions)} sampled actions change ids; "
            f"re-rendered rows that differ: {differ}/{len(rows)}"
        )
    assert differ >= 1 and len(changed) >= 1
