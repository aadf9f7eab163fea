"""The docs site as the README builds it: `make docs` (mkdocs, strict: a warning or a broken link fails) writes
every page of the nav, the front page is the README, the settings reference holds every declared setting and
the API reference is read from the docstrings; a broken link fails the build."""

from __future__ import annotations

import dataclasses
import importlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from docs_hooks import PACKAGES, _groups  # noqa: E402 - the hook's settings groups and API packages


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        for value in item.values():
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_make_docs_builds_every_page_strictly(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run(
        ["make", "docs", f"SITE={site}", f"PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"docs: open {site}/index.html" in r.stdout
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = _nav_pages(config["nav"])
    for page in pages:
        assert (site / page.replace(".md", ".html")).exists(), page
    # every page under docs/ is in the nav (an orphan page would not be found from the site)
    stored = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert stored <= set(pages), stored - set(pages)
    index = (site / "index.html").read_text()
    assert (
        "Quickstart" in index and 'href="guides/runs.html"' in index
    )  # README, its docs/ links made relative
    settings = (site / "reference/settings.html").read_text()
    groups = _groups()
    assert len(groups) >= 13
    for g, _, _ in groups:
        assert f'<h2 id="{g.__name__.lower()}">' in settings, g.__name__
        for f in dataclasses.fields(g):
            assert f"<code>{f.name}</code>" in settings, f"{g.__name__}.{f.name}"
    for package in PACKAGES:  # every public name of each package, rendered under the name that defines it
        page = (site / f"api/{package}.html").read_text()
        ids = set(re.findall(r'id="(lit_rl\.[\w.]+)"', page))
        public = importlib.import_module(f"lit_rl.{package}").__all__
        assert public and not [n for n in public if not any(i.endswith(f".{n}") for i in ids)], package
    assert 'id="lit_rl.learners.policy.PolicyModule"' in (site / "api/learners.html").read_text()


def test_a_broken_link_fails_the_build(tmp_path):
    """The site's own validation settings, on one page with a link to a page that does not exist."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[Runs](guides/run.md)\n")
    small = {
        "site_name": "t",
        "docs_dir": "docs",
        "strict": config["strict"],
        "validation": config["validation"],
    }
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    assert "'guides/run.md'" in r.stderr and "not found" in r.stderr
    assert shutil.which("make")
