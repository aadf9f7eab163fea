"""A local ``datasets`` source is read from its files as they are now (issue 53): ``datasets`` 5.2 caches a
folder with a README ``configs:`` block under the folder's *name* and the configuration, so a second folder of
the same name, or the same folder edited in place, gave the first rows again (``make test`` on a fresh clone
trained on another ``my_dataset``; a user who edits their data and reruns trained on the old data).

Each test loads through ``PromptDataModule`` with ``datasets``' cache pointed at a fresh folder, so what it
checks does not depend on what an earlier run left in the machine's cache."""

from __future__ import annotations

import json
import os
from pathlib import Path

import datasets
import pytest

from lit_rl.data import PromptDataModule

CONFIGS = """---
configs:
- config_name: main
  data_files:
  - split: train
    path: main/train.jsonl
---
"""


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch) -> Path:
    cache = tmp_path / "hf_datasets_cache"
    cache.mkdir()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


def _dataset(root: Path, prompts: list[str]) -> Path:
    (root / "main").mkdir(parents=True, exist_ok=True)
    (root / "README.md").write_text(CONFIGS)
    rows = [{"prompt": p, "answer": str(i)} for i, p in enumerate(prompts)]
    (root / "main/train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _prompts(dataset: str, config: str | None = "main") -> list[str]:
    dm = PromptDataModule(dataset=dataset, dataset_config=config, batch_size=1)
    return [p.prompt for p in dm.train_prompts]


def test_a_folder_edited_in_place_is_read_as_it_is_now(tmp_path):
    ds = _dataset(tmp_path / "my_dataset", ["a1", "a2"])
    assert _prompts(str(ds)) == ["a1", "a2"]
    _dataset(ds, ["edited1", "edited2", "edited3"])
    assert _prompts(str(ds)) == ["edited1", "edited2", "edited3"]  # was ["a1", "a2"]


def test_two_folders_of_the_same_name_each_give_their_own_rows(tmp_path, monkeypatch):
    """As README "Coming from TRL" runs it: ``dataset: my_dataset`` from the working directory."""
    a = _dataset(tmp_path / "a/my_dataset", ["a1", "a2"])
    b = _dataset(tmp_path / "b/my_dataset", ["b1", "b2", "b3"])
    monkeypatch.chdir(a.parent)
    assert _prompts("my_dataset") == ["a1", "a2"]
    monkeypatch.chdir(b.parent)
    assert _prompts("my_dataset") == ["b1", "b2", "b3"]  # was ["a1", "a2"]
    assert _prompts(str(a)) == ["a1", "a2"] and _prompts(str(b), config=None) == ["b1", "b2", "b3"]


def test_a_data_file_rewritten_within_the_same_second_is_read_as_it_is_now(tmp_path):
    """Same size, same modification time (restored, as ``cp -p`` or a rewrite within the clock's resolution
    leaves it): the rows are the new ones."""
    f = tmp_path / "train.jsonl"
    f.write_text('{"prompt": "old1"}\n')
    st = f.stat()
    assert _prompts(str(f), config=None) == ["old1"]
    f.write_text('{"prompt": "new1"}\n')
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _prompts(str(f), config=None) == ["new1"]


def test_a_local_load_leaves_no_copy_in_the_cache(tmp_path, fresh_cache):
    """The rows are read into memory; the arrow files ``datasets`` builds on the way are removed (a copy left per
    edit would grow the cache, and one left under the folder's name is what served stale rows)."""
    ds = _dataset(tmp_path / "my_dataset", ["a1", "a2"])
    assert _prompts(str(ds)) == ["a1", "a2"]
    assert _prompts(str(ds / "main/train.jsonl"), config=None) == ["a1", "a2"]
    assert sorted(p.name for p in fresh_cache.rglob("*.arrow")) == []
