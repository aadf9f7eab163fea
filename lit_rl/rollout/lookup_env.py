"""A look-up agent that needs several tool calls: find a made-up fact in a small document store (issue 54.3).

Task ``agent_lookup`` (``lit_rl.data.agent_tasks``): "What is the access code of the Varnholt archive?". Each
instance has its own store of a few documents (the place and distractors: the same name of another kind,
another name of the same kind, unrelated places), with random ids (``D381``) and random 4-digit codes, so
nothing in the question or in the model's weights gives the answer. The tools (``DocStore``, a TRL-style
environment: ``reset(**columns)`` and public methods as tools):

- ``search(query)``: the ids and titles of the documents whose title shares a word with the query, best
  match first (at most ``MAX_RESULTS``); the code is not in them;
- ``open(doc_id)``: the document's text ("... Its access code is 4821. ..."); an id that is not in the store
  raises, which the model reads as an error result (counted in ``tools/errors/raised``).

So a success takes two calls in order, search then open (an id cannot be guessed), and a final reply whose
last integer is the code (``LastIntReward``). ``demonstrations=k`` puts k worked look-ups before the task.
"""

from __future__ import annotations

import re
from typing import Any

from lit_rl.data.agent_tasks import LOOKUP_TEMPLATE
from lit_rl.rewards.verifiers import LastIntReward
from lit_rl.rollout.agent_envs import _call
from lit_rl.rollout.tool_env import ToolEnv
from lit_rl.rollout.tools import parse_tool_calls

MAX_RESULTS = 3
# words a title match ignores: the question's own words ("What is the access code of the ...")
_STOP = frozenset(["a", "an", "the", "of", "what", "is", "access", "code", "document", "doc", "for", "find"])
_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> set[str]:
    return set(_WORD.findall(text.lower())) - _STOP


class DocStore:
    """One instance's documents (``reset(docs=[{id, title, text}, ...])``) and the two tools (module doc)."""

    def __init__(self) -> None:
        self.docs: list[dict[str, str]] = []
        self.opened: list[str] = []  # ids of the documents opened so far (LookupEnv's reminder reads it)

    def reset(self, docs: list[dict[str, str]] | None = None, **_: Any) -> None:
        if not docs:
            raise ValueError(
                "DocStore.reset needs docs=[{id, title, text}, ...] (task agent_lookup's metadata)"
            )
        self.docs, self.opened = [dict(d) for d in docs], []

    def search(self, query: str) -> str:
        """Search the documents by title.

        Args:
            query: Words of the title, e.g. "Halvern observatory".

        Returns:
            One line per matching document: its id and title.
        """
        want = _words(str(query))
        scored = [(len(want & _words(d["title"])), i) for i, d in enumerate(self.docs)]
        hits = [self.docs[i] for s, i in sorted(scored, key=lambda t: (-t[0], t[1])) if s > 0][:MAX_RESULTS]
        if not hits:
            return f"no document matches {str(query)[:60]!r}"
        return "\n".join(f"{d['id']}: {d['title']}" for d in hits)

    def open(self, doc_id: str) -> str:
        """Open a document.

        Args:
            doc_id: The document's id from search, e.g. "D512".

        Returns:
            The document's text.
        """
        key = str(doc_id).strip().upper()
        for d in self.docs:
            if d["id"].upper() == key:
                self.opened.append(d["id"])
                return d["text"]
        raise ValueError(f"no document {str(doc_id)[:40]!r}; use an id that search returned")


LOOKUP_SYSTEM = "Search for the place, open its document, then reply with the code."
# SmolLM2 with two demonstrations (greedy, 64 held-out questions) searched every time, then wrote the id it
# would open as its reply (0 successes; 2 of 64 at temperature 1): a reply before any document was opened is
# answered with this reminder while rounds remain, instead of ending the episode
LOOKUP_REMIND = "You have not opened a document yet. Call open with the id of the document, then reply."
# Worked look-ups about places no task instance names ("Halvern", "Ashcombe"); the first ``demonstrations`` of
# them go before the task.
LOOKUP_DEMOS = [
    [
        {"role": "user", "content": LOOKUP_TEMPLATE.format(title="Halvern observatory")},
        _call("search", query="Halvern observatory"),
        {"role": "tool", "name": "search", "content": "D512: Halvern observatory\nD207: Halvern mill"},
        _call("open", doc_id="D512"),
        {
            "role": "tool",
            "name": "open",
            "content": "The Halvern observatory was founded in 1874. Its access code is 7304. It keeps 215 records.",
        },
        {"role": "assistant", "content": "7304"},
    ],
    [
        {"role": "user", "content": LOOKUP_TEMPLATE.format(title="Ashcombe library")},
        _call("search", query="Ashcombe library"),
        {"role": "tool", "name": "search", "content": "D845: Ashcombe library\nD163: Ashcombe foundry"},
        _call("open", doc_id="D845"),
        {
            "role": "tool",
            "name": "open",
            "content": "The Ashcombe library was founded in 1702. Its access code is 2958. It keeps 641 records.",
        },
        {"role": "assistant", "content": "2958"},
    ],
]


class LookupEnv(ToolEnv):
    """``search`` and ``open`` over a ``DocStore``; reward ``LastIntReward`` on the final reply (module doc).

    Args:
        demonstrations: how many worked look-ups of ``LOOKUP_DEMOS`` go before the task (0, 1 or 2).
        system: the system message (None: none).
        max_tool_calling_iterations: rounds of calls before the next reply is the last (search, open, a retry);
            a reminded reply counts as a round.
        remind: the user message answering a reply without a call while no document has been opened and
            rounds remain (None: such a reply ends the episode, TRL's rule). Once a document was opened a
            reply without a call is the final answer.
    """

    def __init__(
        self,
        demonstrations: int = 1,
        system: str | None = LOOKUP_SYSTEM,
        max_tool_calling_iterations: int = 3,
        remind: str | None = LOOKUP_REMIND,
    ):
        if not 0 <= demonstrations <= len(LOOKUP_DEMOS):
            raise ValueError(f"demonstrations={demonstrations}; valid values: 0..{len(LOOKUP_DEMOS)}")
        super().__init__(
            environment_factory=DocStore,
            reward=LastIntReward(),
            max_tool_calling_iterations=max_tool_calling_iterations,
            system=system,
            demonstration=[m for demo in LOOKUP_DEMOS[:demonstrations] for m in demo],
        )
        self.lookup_remind = remind  # not ToolEnv.remind: that one would answer the final reply too

    def step(self, action_text: str) -> tuple[Any, float, bool, dict[str, float]]:
        rounds_left = self.max_iter is None or self.rounds < self.max_iter
        if (
            self.lookup_remind is not None
            and not self.done
            and rounds_left
            and not getattr(self.env, "opened", None)
            and not parse_tool_calls(action_text)
        ):
            self.rounds += 1
            return self.lookup_remind, 0.0, False, {"tool_calls": 0.0, "reminders": 1.0}
        return super().step(action_text)
