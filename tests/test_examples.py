"""The examples run as users run them, and the README's commands match CI's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


# Every script in examples/, except modules that exist to be imported (the notebook's helper).
EXAMPLES = sorted(
    p.stem for p in (ROOT / "examples").glob("*.py") if not p.stem.endswith("_helpers")
)


def test_the_examples_are_found() -> None:
    assert {"hello", "jax_multicontroller", "keras_data_parallel"} <= set(EXAMPLES)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name: str) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=230,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip()
    if name == "jax_multicontroller":
        assert result.stdout.count("result -0.12398731708526611") == 4
    if name == "keras_data_parallel":
        assert "weights identical on both nodes: True" in result.stdout


def test_readme_commands_are_what_ci_runs() -> None:
    commands = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if "python3 -m venv" in line
    ]
    assert len(commands) == 3  # the main example, the suite, its core on a second Python
    readme = (ROOT / "README.md").read_text()
    for command in commands:
        assert f"\n{command}\n" in readme
