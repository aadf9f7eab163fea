"""Any text round-trips through the rollout files, the report and ``lit-rl inspect`` (issue 53), a property over
generated text (Hypothesis): line and paragraph separators, NEL, NUL, the other characters ``str.splitlines``
breaks at, combining marks, RTL controls, emoji sequences, noncharacters, HTML that could end the page's
``<script>``, and lone surrogates (what bytes decoded with ``surrogateescape`` hold).

What each piece of text becomes is written out here on its own (``expected``): itself, except a lone surrogate,
which is U+FFFD (it has no UTF-8 form), and a non-finite float, which is null. The file names of the run
directory are drawn from the same text (less ``/`` and NUL, and only the surrogates a file name can hold)."""

from __future__ import annotations

import html
import json
import math
import re
import tempfile
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lit_rl.callbacks.inspector import RolloutInspector, write_rows
from lit_rl.data.preferences import load_preferences
from lit_rl.data.prompts import load_jsonl
from lit_rl.jsonl import dumps_line, read_jsonl
from lit_rl.report import load_run, main, render
from lit_rl.report.chromium import dump_dom, find_chromium

SPECIAL = [
    "\u2028",  # LINE SEPARATOR: str.splitlines breaks here, JSON keeps it raw in a string
    "\u2029",  # PARAGRAPH SEPARATOR
    "\x85",  # NEL
    "\x00",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x1d",
    "\x1e",
    "\r",
    "\n",
    "\r\n",
    "\t",
    "\u0301",  # combining acute
    "\u200f",  # RIGHT-TO-LEFT MARK
    "\u202e",  # RIGHT-TO-LEFT OVERRIDE
    "\u05d0\u05d1",  # Hebrew letters
    "\ufeff",  # BOM
    "\ufffe",  # noncharacters
    "\uffff",
    "\U0001f469\u200d\U0001f4bb",  # emoji ZWJ sequence
    "</script>",
    "<!--",
    "<script>",
    "%%DATA%%",
    '"',
    "\\",
    "\ud800",  # lone surrogates: a high one, a low one, what surrogateescape makes of byte 0xff
    "\udc80",
    "\udcff",
]
chars = st.one_of(st.sampled_from(SPECIAL), st.characters(), st.characters(categories=["Cs"]))
texts = st.lists(chars, max_size=8).map("".join)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | texts,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(texts, inner, max_size=2),
    max_leaves=4,
)
# a file name: no "/" or NUL, and of the surrogates only U+DC80-U+DCFF (os.fsencode gives them back as bytes)
name_chars = st.one_of(
    st.sampled_from([c for c in SPECIAL if c not in ("\x00", "</script>", "\ud800")]),
    st.characters(exclude_characters="/\x00", exclude_categories=["Cs"]),
    st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF),
)
names = st.lists(name_chars, max_size=12).map(lambda cs: "r" + "".join(cs))


def expected(v):
    """What the files and the report hold for ``v`` (module doc)."""
    if isinstance(v, str):
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [expected(x) for x in v]
    if isinstance(v, dict):
        return {expected(k): expected(x) for k, x in v.items()}
    return v


@st.composite
def rollout_rows(draw):
    n = draw(st.integers(1, 3))
    comp = draw(texts)
    return [
        {
            "step": 1,
            "row": i,
            "group": i // 2,
            "uid": draw(st.none() | texts),
            "prompt": draw(texts),
            "answer": draw(st.none() | texts),
            "completion": draw(texts),
            "reward": draw(st.floats(-1, 1)),
            "components": {comp: draw(st.floats(-1, 1))},
            "advantage": draw(st.floats(-1, 1)),
            "finish": draw(texts),
            "length": 3,
            "policy_version": 0,
            "staleness": 0,
            "logprob": None,
            "error": draw(st.none() | texts),
            "pick": "all",
            "extra": draw(st.dictionaries(texts, values, max_size=2)),
        }
        for i in range(n)
    ]


def _blob(page: str) -> str:
    m = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.DOTALL)
    assert m is not None  # nothing inside ended the element early
    return m.group(1)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=rollout_rows(), run_name=names, metric=texts)
def test_any_text_round_trips_through_files_report_and_inspect(rows, run_name, metric):
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / run_name
        d = run / "rollouts"
        d.mkdir(parents=True)
        write_rows(d / "step_000001.jsonl", rows)
        insp = RolloutInspector()
        insp.dir = d
        insp._append_metrics({"step": 1, f"reward/{metric}": 0.25})

        # one line per row for every reader: ours (split at "\n") and str.splitlines alike
        lines = (d / "step_000001.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(x) for x in lines] == expected(rows)
        assert [x.value for x in read_jsonl(d / "step_000001.jsonl")] == expected(rows)

        data = load_run(d)
        interned: list = []  # each distinct [prompt, answer, uid] once, in order of first use
        for r in rows:
            if (key := expected([r["prompt"], r["answer"], r["uid"]])) not in interned:
                interned.append(key)
        assert data["prompts"] == interned
        at = {f: data["fields"].index(f) for f in ("prompt", "completion", "finish", "error", "extra")}
        for got, r in zip(data["rows"]["1"], rows):
            assert data["prompts"][got[at["prompt"]]] == expected([r["prompt"], r["answer"], r["uid"]])
            for f in ("completion", "finish", "error", "extra"):
                assert got[at[f]] == expected(r[f])
        assert data["components"] == [expected(next(iter(rows[0]["components"])))]
        assert data["curves"] == {expected(f"reward/{metric}"): [(1, 0.25)]}

        page = render(data, run.name)
        page.encode("utf-8")  # writable: no lone surrogate left
        assert json.loads(_blob(page)) == json.loads(json.dumps(data))  # the page's JSON.parse sees the data
        assert f"<title>{html.escape(expected(run.name))}</title>" in page

        assert main([str(run)]) == 0
        assert json.loads(_blob((run / "report.html").read_text(encoding="utf-8"))) == json.loads(
            json.dumps(data)
        )


def _as_a_user_writes(rec) -> str:
    r"""One line as ``json.dumps(rec, ensure_ascii=False)`` writes it (U+2028 raw), a lone surrogate as the
    escape a UTF-8 file can hold (``"\ud800"``: JSON's own way of writing one)."""
    line = json.dumps(rec, ensure_ascii=False)
    return re.sub("[\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", line) + "\n"


finite = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=30, deadline=None)
@given(
    recs=st.lists(
        st.fixed_dictionaries({"prompt": texts, "answer": finite, "chosen": texts, "rejected": texts}),
        min_size=1,
        max_size=4,
    )
)
def test_prompt_and_preference_files_read_any_text(recs):
    """The data files a user brings: every record is read back whole (the oracle: ``json.loads`` of the line,
    then ``expected``); the lines where a lone surrogate became U+FFFD are named in one warning."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data.jsonl"
        lines = [_as_a_user_writes(r) for r in recs]
        path.write_text("".join(lines), encoding="utf-8")
        want = [expected(json.loads(x)) for x in lines]
        changed = [n for n, x in enumerate(lines, 1) if expected(json.loads(x)) != json.loads(x)]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = load_jsonl(path)
            pairs = load_preferences(path)
        assert [(p.prompt, p.answer) for p in got] == [(w["prompt"], w["answer"]) for w in want]
        assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [
            (w["prompt"], w["chosen"], w["rejected"]) for w in want
        ]
        notes = [str(w.message) for w in caught if "not valid Unicode" in str(w.message)]
        if changed:
            assert len(notes) == 2 and all(f"line(s) {', '.join(map(str, changed))} held" in n for n in notes)
        else:
            assert notes == []


def test_bytes_that_are_not_utf8_are_read_as_fffd_and_named(tmp_path):
    """A prompt file with a Latin-1 byte (0xe9) on line 2: read as U+FFFD, the line named in a warning."""
    path = tmp_path / "train.jsonl"
    path.write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9\xe2\x80\xa8"}\n')
    with pytest.warns(UserWarning, match=r"train.jsonl: line\(s\) 2 held text that is not valid Unicode"):
        got = load_jsonl(path)
    assert [p.prompt for p in got] == ["ok", "caf\ufffd\u2028"]


def test_a_torn_metrics_line_is_left_out_named_and_the_next_record_starts_a_line(tmp_path, capsys):
    r"""A process killed in the middle of a metrics line left it without its "\n": the resumed run's first
    record starts a line of its own (was: glued to the torn one, a line no reader could parse), and the report
    leaves the torn line out and names it (``lit-rl inspect`` on stderr, the page in its summary)."""
    d = tmp_path / "rollouts"
    d.mkdir()
    (d / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n{"step": 2, "rew', encoding="utf-8")
    insp = RolloutInspector()
    insp.dir = d
    insp._append_metrics({"step": 2, "reward/mean": 0.75})
    assert [x.lineno for x in read_jsonl(d / "metrics.jsonl") if x.error] == [2]
    data = load_run(d)
    assert data["curves"] == {"reward/mean": [(1, 0.5), (2, 0.75)]}
    assert [s.split(": ")[0] for s in data["skipped"]] == ["metrics.jsonl:2"]
    assert main([str(tmp_path)]) == 0
    assert "1 line(s) that are not records were left out: metrics.jsonl:2: Unterminated string" in (
        capsys.readouterr().err
    )


def test_dumps_line_escapes_only_what_line_readers_break_at():
    """Readable text stays raw; U+2028 / U+2029 / U+0085 are escaped (control characters JSON escapes itself)."""
    line = dumps_line({"t": "é\u2028ض\x85\u2029😀\x00", "n": float("nan"), "o": object.__new__(_Shown)})
    assert line == '{"t": "é\\u2028ض\\u0085\\u2029😀\\u0000", "n": null, "o": "shown\\ufffd"}\n'.replace(
        "\\ufffd", "\ufffd"
    )


class _Shown:
    def __str__(self) -> str:
        return "shown\udcff"  # a log_extra value JSON has no type for is written as its str, cleaned


ODD = "a\u2028b\x85c\x00d\x1ce\u202eرتب\u0301\U0001f469\u200d\U0001f4bb<!--<script>x</script>\udcff"


@pytest.mark.skipif(
    find_chromium() is None, reason="headless Chromium not installed (apt-get install -y chromium)"
)
def test_the_page_shows_odd_text_in_a_browser(tmp_path):
    r"""Headless Chromium: every row is drawn (the page's JSON.parse took the data: a completion holding "<!--"
    made it throw before, an empty page), the text is there with its separators and RTL / combining marks, NUL
    and \x1c as their Control Pictures, U+0085 named, the HTML in it as text, the lone surrogate as U+FFFD."""
    run = tmp_path / f"run{ODD[:5]}"
    d = run / "rollouts"
    d.mkdir(parents=True)
    rows = [
        {"step": 1, "row": i, "group": 0, "prompt": f"p{i}{ODD}", "completion": f"c{i}{ODD}", "reward": 1.0,
         "finish": "stop", "length": 1, "policy_version": 0, "staleness": 0, "error": None, "pick": "all",
         "extra": {f"note{ODD}": ODD}}
        for i in range(3)
    ]  # fmt: skip
    write_rows(d / "step_000001.jsonl", rows)
    assert main([str(run)]) == 0
    dom = dump_dom((run / "report.html").as_uri())
    assert re.findall(r'<tr class="row" data-step="1" data-row="(\d)"', dom) == ["0", "1", "2"]
    shown = (
        "a\u2028b⟨U+0085⟩c\u2400d\u241ce\u202eرتب\u0301\U0001f469\u200d\U0001f4bb"
        "&lt;!--&lt;script&gt;x&lt;/script&gt;\ufffd"
    )
    for i in range(3):
        assert f'<pre class="txt">c{i}{shown}</pre>' in dom
    assert f"note{shown}: {shown}" in dom
