"""What a teacher reads: its prompt (privileged context) and, with another tokenizer, the student's rows
re-tokenised (split from ``teachers.py``; `TeacherRouter` calls these with its teacher's ``template``).

* ``privileged_prompt`` / ``teacher_view``: the teacher's prompt rebuilt from the prompt record with a template,
  the student's completion tokens appended unchanged (same tokenizer: columns stay aligned token for token).
* ``char_ends`` / ``cross_tokenizer_view``: another tokenizer; the completion *text* is re-tokenised and every
  teacher token is credited to the student token holding its last character (``owner``).

Both views are built in ``rollout/build.py`` (``reprompted``, ``ExperienceBuilder.pack``), as every
Experience is.
"""

from __future__ import annotations

import string

import torch

from lit_rl.data.experience import Experience
from lit_rl.data.prompts import Prompt, render_prompt
from lit_rl.rollout.build import ExperienceBuilder, Rows, reprompted


def privileged_prompt(template: str, record: Prompt) -> Prompt:
    """The record with its prompt text replaced by ``template`` filled from the record's fields.

    Fields: ``prompt`` (the text, or the last user message of a chat record), ``answer``, ``domain``, ``uid``
    and every ``metadata`` key. A field the template names but the record lacks (or has as None) is an
    error naming the field and the record.
    """
    if record.messages is not None:
        users = [i for i, m in enumerate(record.messages) if m.get("role") == "user"]
        if not users:
            raise ValueError(f"privileged template: chat record {record.uid!r} has no user message to extend")
        text: str | None = record.messages[users[-1]]["content"]
    else:
        text = record.prompt
    fields = {
        **record.metadata,
        "prompt": text,
        "answer": record.answer,
        "domain": record.domain,
        "uid": record.uid,
    }
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        key = name.split(".")[0].split("[")[0]
        if fields.get(key) is None:
            have = sorted(k for k, v in fields.items() if v is not None)
            raise ValueError(
                f"privileged template {template!r} uses field {key!r}, missing from prompt record "
                f"uid={record.uid!r} (prompt={text!r}); fields present: {have}"
            )
    filled = template.format(**fields)
    if record.messages is None:
        return Prompt(
            prompt=filled,
            answer=record.answer,
            domain=record.domain,
            metadata=record.metadata,
            uid=record.uid,
        )
    msgs = [dict(m) for m in record.messages]
    msgs[users[-1]]["content"] = filled
    return Prompt(
        messages=msgs, answer=record.answer, domain=record.domain, metadata=record.metadata, uid=record.uid
    )


def teacher_view(template: str | None, rows: Experience, tokenizer) -> Experience:
    """The Experience the teacher reads: same completion tokens, prompt rebuilt with the privileged
    ``template``.

    Without a template the rows are returned unchanged. Completion columns stay (b, C) and aligned, so the
    teacher's logits at entry t predict the student's token t.
    """
    if template is None:
        return rows
    ids = [render_prompt(privileged_prompt(template, p), tokenizer) for p in rows.prompts]
    return reprompted(rows, ids, tokenizer.pad_token_id)


def _agree(piece: str, text: str, start: int) -> int:
    """How many leading characters of ``piece`` equal ``text[start:]`` (``piece`` is short: one window)."""
    if text.startswith(piece, start):
        return len(piece)
    n = 0
    for a, b in zip(piece, text[start:]):
        if a != b:
            break
        n += 1
    return n


def char_ends(tok, ids: list[int], text: str) -> list[int]:
    """``ends[j]`` = how many leading characters of ``text`` (= ``tok.decode(ids)``) are complete after ids[:j+1].

    A byte-level BPE token may hold part of a multi-byte UTF-8 character (é, 中, emoji split over tokens); the
    character then completes at the token holding its last byte, and ``ends`` only counts it there. Decoding
    tokens one at a time would turn each part into U+FFFD instead. Exact definition: the longest prefix of
    ``text`` that ``tok.decode(ids[:j+1])`` agrees with. Computed with short windows decoded from the last
    token at which the decoded prefix was complete (exact whenever decoding concatenates at character
    boundaries, as byte-level decoders do); if the windows do not reach ``len(text)`` (a decoder that edits
    text across tokens) every prefix is decoded instead (quadratic, exact).

    Shapes: ``ids`` has C entries; returns C non-decreasing ints, the last one ``len(text)``.
    """
    ends: list[int] = []
    base, anchor = 0, 0
    for j in range(len(ids)):
        piece = tok.decode(ids[anchor : j + 1])
        k = _agree(piece, text, base)
        ends.append(max(base + k, ends[-1] if ends else 0))
        if k == len(piece):  # complete: the next window starts at a character boundary
            base, anchor = base + k, j + 1
    if ids and ends[-1] != len(text):
        ends = []
        for prefix in tok.batch_decode([ids[: j + 1] for j in range(len(ids))]):
            ends.append(max(_agree(prefix, text, 0), ends[-1] if ends else 0))
    return ends


def cross_tokenizer_view(
    template: str | None, rows: Experience, stok, tok
) -> tuple[Experience, torch.Tensor]:
    """Re-tokenise each row's prompt (+ ``template``) and completion *text* (decoded with the student's
    tokenizer ``stok``) with the teacher's tokenizer ``tok``.

    Returns the teacher's Experience and ``owner`` (b, Ct): for each teacher completion token, the index of the
    student token it is credited to — the student token whose characters contain the teacher token's last
    character (-1 = padding). The completion text is decoded in one piece and token boundaries are mapped
    through character offsets (``char_ends``; a character split over several byte-level tokens belongs to the
    token holding its last byte), so multi-byte characters reach the teacher intact. Summing teacher log-probs
    per owner gives log π_T of each student token's span (per-row sums are exact; per-token values are exact
    where token boundaries agree, otherwise a span's log-prob lands on the token where it ends).
    The student's eos maps to the teacher's eos.
    """
    import bisect

    seqs, owners, prompt_ids = [], [], []
    cols = rows.attention_mask[:, rows.prompt_len :].bool().cpu()
    for i, rec in enumerate(rows.prompts):
        p = privileged_prompt(template, rec) if template else rec
        prompt_ids.append(render_prompt(p, tok))
        comp = rows.completion_ids[i].cpu()[cols[i]].tolist()
        eos_at = comp.index(stok.eos_token_id) if stok.eos_token_id in comp else None
        body = comp if eos_at is None else comp[:eos_at]
        text = stok.decode(body)
        ends = char_ends(stok, body, text)
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        own = [min(bisect.bisect_left(ends, e), max(len(ends) - 1, 0)) for _, e in enc["offset_mapping"]]
        if eos_at is not None:
            ids.append(tok.eos_token_id)
            own.append(eos_at)
        seqs.append(ids)
        owners.append(own)
    # the student's rows in the teacher's tokens: same groups, rewards, validity and versions, no rollout
    # log-probs (the teacher did not sample them); its loss mask is where ``owner`` is set
    teacher_rows = Rows(
        prompt_ids=prompt_ids,
        completion_ids=seqs,
        prompts=list(rows.prompts),
        rewards=rows.rewards.cpu(),
        valid=rows.valid.cpu(),
    )
    view = ExperienceBuilder().pack(
        teacher_rows,
        tok.pad_token_id,
        group_ids=rows.group_ids.cpu(),
        policy_version=rows.policy_version.cpu(),
    )
    owner = torch.full(view.loss_mask.shape, -1, dtype=torch.long)  # (b, Ct)
    for i, o in enumerate(owners):
        owner[i, : len(o)] = torch.tensor(o, dtype=torch.long)
    return view, owner
