"""The look-up environment (issue 54.3): DocStore's two tools, its task's held-out split, and episodes played by
scripts through AgentLoop (the tiny model's tokenizer): search then open then answer, and what a bad call
costs."""

from __future__ import annotations

import json

import pytest
from _scripted_engine import ScriptedEngine
from transformers import AutoTokenizer

from lit_rl.data.agent_tasks import KINDS
from lit_rl.data.prompts import Prompt
from lit_rl.data.tasks import get_task
from lit_rl.rollout.agent_loop import AgentLoop, EnvRewards
from lit_rl.rollout.engine import SamplingConfig
from lit_rl.rollout.lookup_env import LOOKUP_REMIND, DocStore, LookupEnv

SP = SamplingConfig(max_new_tokens=64)
DOCS = [
    {"id": "D381", "title": "Varnholt archive", "text": "The Varnholt archive ... Its access code is 4821."},
    {"id": "D902", "title": "Varnholt mill", "text": "The Varnholt mill ... Its access code is 1177."},
    {"id": "D117", "title": "Ostby archive", "text": "The Ostby archive ... Its access code is 5306."},
    {"id": "D640", "title": "Korwick vault", "text": "The Korwick vault ... Its access code is 9012."},
    {"id": "D233", "title": "Ostby mill", "text": "The Ostby mill ... Its access code is 6648."},
]
PROMPT = Prompt(
    messages=[{"role": "user", "content": "What is the access code of the Varnholt archive?"}],
    answer="4821",
    metadata={"title": "Varnholt archive", "code": 4821, "docs": DOCS},
)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _call(name, **args):
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(args)}}}</tool_call>'


def _store() -> DocStore:
    s = DocStore()
    s.reset(docs=DOCS, title="ignored", answer="ignored")
    return s


@pytest.mark.parametrize(
    "query, result",
    [
        # both title words match the first, one word each of the next two (store order breaks the tie)
        ("Varnholt archive", "D381: Varnholt archive\nD902: Varnholt mill\nD117: Ostby archive"),
        (
            "What is the access code of the Varnholt archive?",
            "D381: Varnholt archive\nD902: Varnholt mill\nD117: Ostby archive",
        ),
        ("ostby MILL", "D233: Ostby mill\nD902: Varnholt mill\nD117: Ostby archive"),
        ("Korwick", "D640: Korwick vault"),
        ("the access code", "no document matches 'the access code'"),  # question words match nothing
        ("Halvern", "no document matches 'Halvern'"),
    ],
)
def test_search_lists_matching_titles_best_first(query, result):
    assert _store().search(query) == result


def test_open_returns_the_text_and_refuses_unknown_ids():
    s = _store()
    assert s.open("D640") == DOCS[3]["text"]
    assert s.open(" d381 ") == DOCS[0]["text"]  # case and spaces are forgiven
    with pytest.raises(ValueError, match="no document 'D999'; use an id that search returned"):
        s.open("D999")
    with pytest.raises(ValueError, match=r"DocStore.reset needs docs=\[\{id, title, text\}"):
        DocStore().reset(title="x")


def test_lookup_episode_search_open_answer(tok):
    actions = [_call("search", query="Varnholt archive"), _call("open", doc_id="D381"), "The code is 4821."]
    loop = AgentLoop(LookupEnv, ScriptedEngine(tok, actions + ["never reached"]), max_turns=4)
    (ep,) = loop.run([PROMPT], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == [
        "D381: Varnholt archive\nD902: Varnholt mill\nD117: Ostby archive",
        DOCS[0]["text"],
        "",
    ]
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 1.0] and ep.done
    m = EnvRewards()([PROMPT], [[ep]]).metrics
    assert m["rollout/success_frac"] == 1.0 and m["tools/calls_per_episode"] == 2.0
    assert m["tools/valid_call_rate"] == 1.0
    # the demonstration (one by default) and both tools are in the prompt, before the task
    prompt = tok.decode(ep.prompt_ids)
    assert prompt.index('"name": "search"') < prompt.index("Halvern observatory") < prompt.index("Varnholt")
    assert "Ashcombe" not in prompt


@pytest.mark.parametrize(
    "actions, remind, reward, turns",
    [
        # the distractor's code (the same name, another kind): read the wrong document
        ([_call("search", query="Varnholt"), _call("open", doc_id="D902"), "1177"], LOOKUP_REMIND, 0.0, 3),
        # an answer without looking anything up: TRL's rule (remind=None) scores it at once; the reward cannot
        # tell a lucky guess (1 in 9000 for a random code)
        (["4821 is my guess"], None, 1.0, 1),
        # with the reminder it is answered while the 3 rounds last, then the 4th reply is scored
        (["The code is 1234."] * 4, LOOKUP_REMIND, 0.0, 4),
    ],
    ids=["wrong_document", "guess_without_reminder", "guesses_reminded"],
)
def test_lookup_reward_is_the_final_replys_code(tok, actions, remind, reward, turns):
    loop = AgentLoop(lambda: LookupEnv(remind=remind), ScriptedEngine(tok, actions), max_turns=5)
    (ep,) = loop.run([PROMPT], 1, SP)[0]
    assert ep.total_reward == reward and len(ep.turns) == turns and ep.done
    assert [t.obs_text for t in ep.turns[: turns - 1]].count(LOOKUP_REMIND) == (3 if turns == 4 else 0)


def test_a_reply_before_opening_is_reminded(tok):
    # the untrained model's habit: after the search it writes the id as its reply
    actions = [_call("search", query="Varnholt archive"), "D381", _call("open", doc_id="D381"), "4821"]
    loop = AgentLoop(LookupEnv, ScriptedEngine(tok, actions), max_turns=5)
    (ep,) = loop.run([PROMPT], 1, SP)[0]
    assert [t.obs_text for t in ep.turns] == [
        "D381: Varnholt archive\nD902: Varnholt mill\nD117: Ostby archive",
        LOOKUP_REMIND,
        DOCS[0]["text"],
        "",
    ]
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 0.0, 1.0]
    assert [t.info.get("reminders", 0.0) for t in ep.turns] == [0.0, 1.0, 0.0, 0.0]
    m = EnvRewards()([PROMPT], [[ep]]).metrics
    assert m["tools/calls_per_episode"] == 2.0 and m["tools/valid_call_rate"] == 1.0


def test_bad_calls_are_observations_and_counted(tok):
    actions = [
        '<tool_call>{"name": "search", "arguments": {"query": "Varnholt"</tool_call>',  # not JSON
        _call("lookup", query="Varnholt") + _call("open", doc_id="D999"),  # unknown tool, then a raising open
        _call("open", id="D381"),  # an argument open does not take
        "4821",  # the 4th reply: after max_tool_calling_iterations=3 rounds it is the last, scored
    ]
    loop = AgentLoop(LookupEnv, ScriptedEngine(tok, actions), max_turns=5)
    (ep,) = loop.run([PROMPT], 1, SP)[0]
    obs = [t.obs_text for t in ep.turns]
    assert obs[0].startswith('{"error": "malformed tool call: not JSON')
    assert obs[1] == (
        '{"error": "unknown tool \'lookup\'; tools: open, search"}\n'
        '{"error": "ValueError: no document \'D999\'; use an id that search returned"}'
    )
    assert obs[2].startswith('{"error": "bad arguments for open:')
    assert ep.total_reward == 1.0 and len(ep.turns) == 4
    m = EnvRewards()([PROMPT], [[ep]]).metrics
    assert m["tools/calls_per_episode"] == 4.0 and m["tools/valid_call_rate"] == 0.0
    assert [m[f"tools/errors/{k}"] for k in ("malformed", "unknown_tool", "bad_arguments", "raised")] == [
        1.0,
        1.0,
        1.0,
        1.0,
    ]


def test_lookup_task_holds_out_places_never_seen_in_training():
    train, held = get_task("agent_lookup")
    assert (len(train), len(held)) == (1600, 200)
    names = lambda ps: {d["title"].split()[0] for p in ps for d in p.metadata["docs"]}  # noqa: E731
    assert len(names(held)) == 40 and not names(held) & names(train)
    for p in held[:20] + train[:20]:
        m = p.metadata
        (doc,) = [d for d in m["docs"] if d["title"] == m["title"]]
        assert f"Its access code is {m['code']}." in doc["text"] and p.answer == str(m["code"])
        assert p.messages == [{"role": "user", "content": f"What is the access code of the {m['title']}?"}]
        assert len(m["docs"]) == 5 and len({d["id"] for d in m["docs"]}) == 5
        name, kind = m["title"].split()
        # the distractors that make opening the right one matter: the same name of another kind, and the kind
        assert any(d["title"].startswith(name + " ") and d["title"] != m["title"] for d in m["docs"])
        assert sum(d["title"].endswith(" " + kind) for d in m["docs"]) >= 2 and kind in KINDS
    assert get_task("agent_lookup")[1][0].metadata == held[0].metadata  # seeded
    with pytest.raises(
        ValueError, match=r"agent_lookup: heldout=400 must be in \[1, 320\] \(40 names x 8 kinds\)"
    ):
        get_task("agent_lookup", heldout=400)
    with pytest.raises(ValueError, match="agent_lookup: distractors=1 must be in 2..8"):
        get_task("agent_lookup", distractors=1)


def test_lookup_demonstrations_are_counted():
    assert [len(LookupEnv(demonstrations=k).demonstration) for k in (0, 1, 2)] == [0, 6, 12]
    with pytest.raises(ValueError, match="demonstrations=3; valid values: 0..2"):
        LookupEnv(demonstrations=3)
