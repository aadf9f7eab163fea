"""Any agent program through the OpenAI-compatible endpoint (issue 56.3, 56.4): the real ``openai`` client talks to
``OpenAIServer``; each episode's row is the engine's recorded inputs and samples (never the agent's text
re-tokenised), tool calls come back in OpenAI's form, a rewritten history is a counted prefix break, and an agent
program that raises, hangs, returns no number or never calls the model is masked and counted."""

from __future__ import annotations

import json
import sys
import threading

import openai
import pytest
import torch
from _tool_helpers import E, chars
from transformers import AutoTokenizer

from lit_rl.data.prompts import Prompt
from lit_rl.learners import PolicyModule
from lit_rl.rollout.agent_program import ProgramLoop, ProgramRewards
from lit_rl.rollout.base import EngineBase
from lit_rl.rollout.chat import ChatRenderer
from lit_rl.rollout.engine import Completion, HFEngine, SamplingConfig
from lit_rl.rollout.openai_server import OpenAIServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiplies two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


class Recorder(EngineBase):
    """Wraps an engine (or answers ``reply(prompt_ids) -> ids`` itself, log-prob -0.5 per token) and records
    every generated sequence as (prompt ids, completion ids, log-probs)."""

    def __init__(self, inner: EngineBase | None = None, tokenizer=None, reply=None):
        self.inner, self.reply, self.seen = inner, reply, []
        self._tok = tokenizer

    @property
    def tokenizer(self):  # type: ignore[override]
        return self.inner.tokenizer if self.inner is not None else self._tok

    def bind(self, module, rollout=None) -> None:
        if self.inner is not None:
            self.inner.bind(module, rollout)

    def update_weights(self, named_tensors) -> None:
        self.policy_version += 1

    def generate(self, prompt_ids, n, sampling):
        if self.inner is not None:
            out = self.inner.generate(prompt_ids, n, sampling)
        else:
            out = []
            for p in prompt_ids:
                ids = self.reply(list(p))
                out.append([Completion(ids, [-0.5] * len(ids), "stop")])
        for p, (c,) in zip(prompt_ids, out):
            self.seen.append((list(p), list(c.token_ids), list(c.logprobs)))
        return out


def row_ids(exp, i: int) -> list[int]:
    return exp.input_ids[i][exp.attention_mask[i].bool()].tolist()


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="anything", max_retries=0, timeout=60)


# ------------------------------------------------------------------ a real model, two calls, a tool result between
def two_calls(base_url: str, prompt) -> float:
    """An agent as users write it: the reply object appended as is, a tool message, a second call."""
    c = client(base_url)
    msgs: list = [{"role": "user", "content": prompt.prompt}]
    r1 = c.chat.completions.create(model="my-agent-model", messages=msgs, tools=TOOLS, max_tokens=6)
    msgs += [r1.choices[0].message, {"role": "tool", "name": "multiply", "content": "12"}]
    c.chat.completions.create(model="my-agent-model", messages=msgs, tools=TOOLS, max_tokens=6)
    return 0.25 * len(prompt.prompt)


def test_two_calls_make_one_token_exact_row(tiny_model_dir):
    """Tiny model, temperature 1, 2 prompts x 2 episodes run concurrently: each row is its first call's input,
    then per call the engine's sample (loss, the engine's log-probs) and the ids the next input added
    (observation: the tool result through the template); the last call's input + sample is the whole row."""
    engine = Recorder(HFEngine())
    engine.bind(PolicyModule(model=str(tiny_model_dir)))
    loop = ProgramLoop(two_calls, engine, deadline_s=120)
    prompts = [Prompt(prompt="q"), Prompt(prompt="qq")]
    try:
        groups = loop.run(prompts, 2, SamplingConfig(temperature=1.0, max_new_tokens=8))
    finally:
        loop.close()
    exp = loop.to_experience(prompts, groups, pad_id=0)
    eps = [e for g in groups for e in g]
    assert len(engine.seen) == 8 and [e.calls for e in eps] == [2, 2, 2, 2]
    renderer = ChatRenderer(engine.tokenizer, TOOLS)
    tool_msg = [{"role": "tool", "name": "multiply", "content": "12"}]
    for i, ep in enumerate(eps):
        text = prompts[i // 2].prompt
        row = row_ids(exp, i)
        first = renderer.prompt_ids([{"role": "user", "content": text}])
        (s1,) = [s for s in engine.seen if s[0] == first and s[1] == ep.turns[0].action_ids]
        in2 = first + s1[1] + renderer.observation_ids(s1[1], tool_msg)
        (s2,) = [s for s in engine.seen if s[0] == in2 and s[1] == ep.turns[1].action_ids]
        assert row == in2 + s2[1]  # the row is the engine's last input and its sample, token for token
        assert exp.completion_ids[i][exp.loss_mask[i]].tolist() == s1[1] + s2[1]
        got = exp.rollout_logprobs[i][exp.loss_mask[i]].double()
        assert torch.allclose(got, torch.tensor(s1[2] + s2[2], dtype=torch.float64), rtol=1e-6, atol=0)
        assert int(exp.extras["obs_mask"][i].sum()) == len(in2) - len(first) - len(s1[1])
        assert "12" in engine.tokenizer.decode(ep.turns[0].obs_ids) and ep.prefix_breaks == 0
        assert float(exp.rewards[i]) == 0.25 * len(text)
    rb = ProgramRewards()(prompts, groups)
    assert rb.metrics["agent/prefix_breaks"] == 0.0 and rb.metrics["agent/calls_per_episode"] == 2.0


# ------------------------------------------------------------------ tool calls in OpenAI's form
CALL_TEXT = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'


def test_tool_calls_come_back_in_openai_format(tiny_model_dir):
    """The engine samples a Hermes block; the client reads ``tool_calls`` (id, type, name, arguments as a JSON
    string), ``content`` None, finish reason ``tool_calls``; the agent answers with a ``tool_call_id`` message
    (no name) and the next input continues the sampled ids, the tool named from the call it answers."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def reply(prompt_ids):
        return chars("12") + [E] if "<|im_start|>tool" in tok.decode(prompt_ids) else chars(CALL_TEXT) + [E]

    engine = Recorder(tokenizer=tok, reply=reply)
    seen = []

    def agent(base_url, prompt):
        c = client(base_url)
        msgs: list = [{"role": "user", "content": "What is 3 * 4?"}]
        r1 = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS, logprobs=True)
        seen.append(r1)
        msg = r1.choices[0].message
        msgs.append(msg)
        for call in msg.tool_calls or []:
            args = json.loads(call.function.arguments)
            msgs.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] * args["b"])})
        r2 = c.chat.completions.create(model="m", messages=msgs, tools=TOOLS)
        seen.append(r2)
        return float(r2.choices[0].message.content == "12")

    loop = ProgramLoop(agent, engine, deadline_s=60)
    try:
        ((ep,),) = loop.run([Prompt(prompt="x")], 1, SamplingConfig(max_new_tokens=80))
    finally:
        loop.close()
    r1, r2 = seen
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and call.function.name == "multiply"
    assert json.loads(call.function.arguments) == {"a": 3, "b": 4}
    assert [x.logprob for x in choice.logprobs.content] == [-0.5] * (len(CALL_TEXT) + 1)
    assert r2.choices[0].message.content == "12" and r2.choices[0].finish_reason == "stop"
    assert r1.usage.completion_tokens == len(CALL_TEXT) + 1
    (in1, out1, _), (in2, out2, _) = engine.seen
    assert out1 == chars(CALL_TEXT) + [E] and in2[: len(in1) + len(out1)] == in1 + out1
    # after the sampled <|im_end|>: the newline, the tool turn (named "multiply") and the generation prompt
    assert (
        tok.decode(in2[len(in1) + len(out1) :]) == "\n<|im_start|>tool\n12<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ep.prompt_ids == in1 and ep.turns[0].obs_ids == in2[len(in1) + len(out1) :]
    assert [t.action_ids for t in ep.turns] == [out1, out2] and ep.total_reward == 1.0
    assert ep.turns[0].info["tool_calls"] == 1.0 and ep.turns[0].info["tool_errors/malformed"] == 0.0


def test_sampled_ids_are_kept_not_the_texts_tokens(smollm2_dir):
    """SmolLM2's BPE: the engine samples "The| ans|wer| is" (the tokenizer's split of that text is "The| answer|
    is"). The agent sends the text back; the next input holds the sampled ids, not a re-tokenisation."""
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    sampled = [tok.convert_tokens_to_ids(t) for t in ("The", "Ġans", "wer", "Ġis")] + [tok.eos_token_id]
    canonical = tok("The answer is", add_special_tokens=False)["input_ids"]
    assert canonical == [504, 2988, 314] and sampled[:4] != canonical
    engine = Recorder(tokenizer=tok, reply=lambda p: list(sampled))
    with OpenAIServer(engine, SamplingConfig(max_new_tokens=8)) as server:
        c = client(server.open_episode("e"))
        msgs: list = [{"role": "user", "content": "q"}]
        msgs.append(c.chat.completions.create(model="m", messages=msgs).choices[0].message)
        msgs.append({"role": "user", "content": "again"})
        c.chat.completions.create(model="m", messages=msgs)
        (rec,) = server.close_episodes(["e"])
    first, second = rec.calls
    assert msgs[1].content == "The answer is" and second.extended
    assert second.prompt_ids[len(first.prompt_ids) : len(first.prompt_ids) + 5] == sampled


# ------------------------------------------------------------------ a rewritten history
def test_a_rewritten_history_is_a_counted_prefix_break(tiny_model_dir):
    """Call 2 edits call 1's reply (the agent rewrote its history): rendered afresh, a new chain; call 3 continues
    call 2. The row is the last chain (calls 2 and 3), call 1 is not trained; both counted."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    replies = iter([chars("a1") + [E], chars("a2") + [E], chars("a3") + [E]])
    engine = Recorder(tokenizer=tok, reply=lambda p: next(replies))

    def agent(base_url, prompt):
        c = client(base_url)
        msgs: list = [{"role": "user", "content": "q"}]
        c.chat.completions.create(model="m", messages=msgs)
        msgs += [{"role": "assistant", "content": "EDITED"}, {"role": "user", "content": "u2"}]
        r2 = c.chat.completions.create(model="m", messages=msgs)
        msgs += [r2.choices[0].message, {"role": "user", "content": "u3"}]
        c.chat.completions.create(model="m", messages=msgs)
        return 1.0

    loop = ProgramLoop(agent, engine, deadline_s=60)
    try:
        groups = loop.run([Prompt(prompt="x")], 1, SamplingConfig(max_new_tokens=8))
    finally:
        loop.close()
    ((ep,),) = groups
    (in1, out1, _), (in2, out2, _), (in3, out3, _) = engine.seen
    assert in2[: len(in1) + len(out1)] != in1 + out1  # the edit: call 2 does not continue call 1
    assert tok.decode(in2) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nEDITED<|im_end|>\n"
        "<|im_start|>user\nu2<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ep.prompt_ids == in2 and [t.action_ids for t in ep.turns] == [out2, out3]
    assert ep.turns[0].obs_ids == in3[len(in2) + len(out2) :] and in3[: len(in2) + len(out2)] == in2 + out2
    assert (ep.calls, ep.prefix_breaks, ep.untrained_calls) == (3, 1, 1)
    rb = ProgramRewards()([Prompt(prompt="x")], groups)
    assert rb.metrics["agent/prefix_breaks"] == 1.0 and rb.metrics["agent/untrained_calls"] == 1.0
    assert rb.valid.tolist() == [True] and rb.total.tolist() == [1.0]


# ------------------------------------------------------------------ faults
def test_failing_programs_are_masked_and_counted_never_a_hang(tiny_model_dir):
    """One batch: a program that answers, one that raises, one that never returns (deadline), one that returns
    no number, one that never calls the model, one that exits (``sys.exit``). The run returns at the deadline;
    the five failures are masked (reward NaN, invalid), counted, and each row's error says why. The hung
    program's later call is refused (410) and never reaches the engine."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Recorder(tokenizer=tok, reply=lambda p: chars("ok") + [E])
    release, late = threading.Event(), []
    late_done = threading.Event()

    def agent(base_url, prompt):
        mode = prompt.metadata["mode"]
        if mode == "no_calls":
            return 1.0
        c = client(base_url)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": mode}])
        if mode == "raises":
            raise RuntimeError("the tool crashed")
        if mode == "exits":  # an agent that dies (sys.exit in its thread): the run goes on
            sys.exit(3)
        if mode == "hangs":
            release.wait()
            try:
                c.chat.completions.create(model="m", messages=[{"role": "user", "content": "late"}])
            except openai.APIStatusError as e:
                late.append((e.status_code, e.body["code"]))
            finally:
                late_done.set()
        return "not a number" if mode == "bad_reward" else 1.0

    modes = ["ok", "raises", "hangs", "bad_reward", "no_calls", "exits"]
    prompts = [Prompt(prompt=m, metadata={"mode": m}) for m in modes]
    loop = ProgramLoop(agent, engine, deadline_s=4)
    try:
        groups = loop.run(prompts, 1, SamplingConfig(max_new_tokens=8))
        calls_at_return = len(engine.seen)
        release.set()
        assert late_done.wait(30)
    finally:
        loop.close()
    assert late == [(410, "episode_closed")] and len(engine.seen) == calls_at_return == 5
    rb = ProgramRewards()(prompts, groups)
    m = rb.metrics
    counts = [m[f"agent/{k}"] for k in ("program_errors", "episodes_timed_out", "bad_rewards", "no_calls")]
    assert counts == [2.0, 1.0, 1.0, 1.0] and m["reward/infra_errors"] == 5.0
    assert rb.valid.tolist() == [True, False, False, False, False, False]
    assert rb.errors[0] is None and "RuntimeError: the tool crashed" in rb.errors[1]
    assert "deadline_s=4" in rb.errors[2] and "'not a number'" in rb.errors[3]
    assert "without calling the model" in rb.errors[4] and "raised SystemExit: 3" in rb.errors[5]
    exp = loop.to_experience(prompts, groups, pad_id=0)
    assert exp.rewards[0].item() == 1.0 and torch.isnan(exp.rewards[1:]).all()
    assert exp.valid.tolist() == [True, False, False, False, False, False]


def test_bad_requests_get_openai_errors(tiny_model_dir):
    """Streaming, n > 1 and an unknown episode are refused in OpenAI's error shape, naming the field."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Recorder(tokenizer=tok, reply=lambda p: chars("ok") + [E])
    with OpenAIServer(engine, SamplingConfig(max_new_tokens=8), max_context_tokens=64) as server:
        c = client(server.open_episode("e"))
        msgs = [{"role": "user", "content": "q"}]
        with pytest.raises(openai.BadRequestError, match="stream: true is not supported"):
            c.chat.completions.create(model="m", messages=msgs, stream=True)
        with pytest.raises(openai.BadRequestError, match="only n=1"):
            c.chat.completions.create(model="m", messages=msgs, n=2)
        with pytest.raises(openai.BadRequestError, match="max_context_tokens=64"):
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 80}])
        with pytest.raises(openai.NotFoundError, match="no open episode 'nope'"):
            client(server.url + "/episodes/nope/v1").chat.completions.create(model="m", messages=msgs)
        assert [m.id for m in c.models.list()] == ["lit-rl-policy"]
        (rec,) = server.close_episodes(["e"])
    assert rec.calls == [] and rec.refused == {"context_length_exceeded": 1} and engine.seen == []


# ------------------------------------------------------------------ a weight sync between two calls of an episode
def test_weights_pushed_mid_episode_label_each_calls_tokens(tiny_model_dir):
    """The program pushes weights (``sync_weights``) between its two calls: they load before the second call's
    generate, so the first action's tokens carry version 0 and the second's version 1 (``token_versions``)."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Recorder(tokenizer=tok, reply=lambda p: chars("ab") + [E])
    pushed = []

    def agent(base_url, prompt):
        c = client(base_url)
        msgs: list = [{"role": "user", "content": "q"}]
        msgs.append(c.chat.completions.create(model="m", messages=msgs).choices[0].message)
        loop.sync_weights([("w", torch.zeros(1))])
        pushed.append(engine.policy_version)  # not loaded yet: a run is in progress
        msgs.append({"role": "user", "content": "u"})
        c.chat.completions.create(model="m", messages=msgs)
        return 1.0

    loop = ProgramLoop(agent, engine, deadline_s=60)
    try:
        groups = loop.run([Prompt(prompt="x")], 1, SamplingConfig(max_new_tokens=8))
    finally:
        loop.close()
    ((ep,),) = groups
    assert pushed == [0] and engine.policy_version == 1
    assert [t.action_versions for t in ep.turns] == [[0, 0, 0], [1, 1, 1]]
    exp = loop.to_experience([Prompt(prompt="x")], groups, pad_id=0)
    versions = exp.extras["token_versions"][0][exp.loss_mask[0]].tolist()
    assert versions == [0, 0, 0, 1, 1, 1]


def test_a_batch_of_simultaneous_first_calls_all_connect(tiny_model_dir):
    """64 episodes call at the same moment (a batch opens every episode at once): every connection is accepted
    (with http.server's default listen backlog of 5, 12 and 13 of 64 got APIConnectionError in two runs)."""
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = Recorder(tokenizer=tok, reply=lambda p: chars("ok") + [E])
    errors, go = [], threading.Event()
    with OpenAIServer(engine, SamplingConfig(max_new_tokens=4)) as server:

        def call(url):
            go.wait()
            try:
                client(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "q"}])
            except openai.APIError as e:
                errors.append(repr(e))

        threads = [threading.Thread(target=call, args=(server.open_episode(f"e{i}"),)) for i in range(64)]
        for t in threads:
            t.start()
        go.set()
        for t in threads:
            t.join()
    assert errors == [] and len(engine.seen) == 64
