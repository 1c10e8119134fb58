"""The documentation builds without a single warning, and every page is reachable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _nav_files(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [f for item in node for f in _nav_files(item)]
    if isinstance(node, dict):
        return [f for value in node.values() for f in _nav_files(value)]
    return []


@pytest.mark.timeout(180)
def test_docs_build_strict_with_the_api_reference(tmp_path: Path) -> None:
    # --strict turns every warning (a broken link or anchor, a docstring mkdocstrings cannot
    # read, a page left out of the nav) into a failure.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    reference = (tmp_path / "reference" / "index.html").read_text()
    # generated from the docstrings, not written by hand
    assert 'id="skyward.ComputePool"' in reference
    assert "Provision the nodes and start a worker on each" in reference


def test_every_docs_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert sorted(_nav_files(config["nav"])) == pages
