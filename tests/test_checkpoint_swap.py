"""lit_rl.checkpoint.swap_in / finish_interrupted_swap: a checkpoint directory is replaced whole or not at all,
and every state a kill can leave resolves to a whole checkpoint (tests/test_sharded_save_resume.py kills real
FSDP2 / DeepSpeed jobs inside a save)."""

from pathlib import Path

from lit_rl.checkpoint import finish_interrupted_swap, side_path, swap_in
from lit_rl.runs import resolve_ckpt_path


def _dir(path: Path, files: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def _read(path: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(path.iterdir())}


def test_swap_replaces_a_directory_whole(tmp_path):
    final = _dir(tmp_path / "last.ckpt", {"meta.pt": "it1", "shard0": "it1", "stale_only_in_old": "x"})
    partial = _dir(side_path(final, "partial"), {"meta.pt": "it2", "shard0": "it2"})
    swap_in(partial, final)
    assert _read(final) == {"meta.pt": "it2", "shard0": "it2"}  # no file of the old one survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_swap_without_a_previous_checkpoint(tmp_path):
    final = tmp_path / "last.ckpt"
    swap_in(_dir(side_path(final, "partial"), {"meta.pt": "it1"}), final)
    assert _read(final) == {"meta.pt": "it1"}


def test_swap_of_a_file(tmp_path):  # FSDP2 with save_distributed_checkpoint=False writes one file
    final = tmp_path / "last.ckpt"
    final.write_text("it1")
    partial = side_path(final, "partial")
    partial.write_text("it2")
    swap_in(partial, final)
    assert final.read_text() == "it2" and not partial.exists()


def test_kill_between_the_renames_resumes_the_new_checkpoint(tmp_path):
    final = tmp_path / "last.ckpt"
    _dir(side_path(final, "old"), {"meta.pt": "it1"})  # the previous one, renamed aside
    _dir(side_path(final, "partial"), {"meta.pt": "it2"})  # written whole (the barrier passed)
    assert resolve_ckpt_path("last", tmp_path) == str(final)
    assert _read(final) == {"meta.pt": "it2"}


def test_kill_while_writing_keeps_the_previous_checkpoint(tmp_path):
    final = _dir(tmp_path / "last.ckpt", {"meta.pt": "it1"})
    _dir(side_path(final, "partial"), {"shard0": "it2"})  # half written: no '.old' exists in this state
    finish_interrupted_swap(final)
    assert _read(final) == {"meta.pt": "it1"}
    swap_in(_dir(tmp_path / "next", {"meta.pt": "it3"}), final)  # the next save ignores the leftover
    assert _read(final) == {"meta.pt": "it3"}


def test_kill_after_the_swap_leaves_only_a_stale_old(tmp_path):
    final = _dir(tmp_path / "last.ckpt", {"meta.pt": "it2"})
    _dir(side_path(final, "old"), {"meta.pt": "it1"})
    finish_interrupted_swap(final)
    assert _read(final) == {"meta.pt": "it2"}
    swap_in(_dir(tmp_path / "next", {"meta.pt": "it3"}), final)
    assert _read(final) == {"meta.pt": "it3"} and not side_path(final, "old").exists()
