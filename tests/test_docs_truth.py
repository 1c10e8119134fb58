"""The documentation says what the code does now: every name it shows exists, every name that
exists is listed, and nothing that exists is called planned.

The facts come from the code (``skyward.__all__``, the providers, the CLI's commands, the
exception tree), so a page drifts the moment the code changes without it. The claims a
reviewer once found wrong are kept as patterns below, tied to the fact that makes them
wrong, so that reintroducing one fails here.
"""

from __future__ import annotations

import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import skyward as sky
from skyward.cli import main as cli
from skyward.providers.base import Provider

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# The page that maps the public skyward project's names to ours: its left column names
# things of *that* API, some of which we do not have, on purpose.
MIGRATION = ROOT / "docs" / "coming-from-0.5.md"

# Providers Skyward's design names; each is either public (and documented as working) or
# not yet public (and then shown nowhere as usable).
DESIGNED_PROVIDERS = ("Local", "SSH", "AWS", "GCP", "Azure", "Slurm")
EXTRAS = {"AWS": "aws", "GCP": "gcp", "Azure": "azure"}
NOT_THERE = re.compile(
    r"\b(planned|not yet|are next|is next|once they land|in progress|coming soon|"
    r"no cloud provider does|does not exist yet)\b",
    re.IGNORECASE,
)
# Exceptions that docs may name without their being Skyward's.
FOREIGN_ERRORS = {"ValidationError", "BrokenProcessPool", "CancelledError", "JaxRuntimeError"}


def _text(page: Path) -> str:
    return page.read_text()


def _sentences(text: str) -> list[str]:
    # Sentences and table cells: a claim never spans a cell boundary or a blank line.
    # A table row is one claim: its cells read together ("uneven collectives | hang forever").
    text = re.sub(r"```.*?```", " ", text, flags=re.DOTALL)
    rows = [line for line in text.splitlines() if line.lstrip().startswith("|")]
    prose = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("|"))
    parts = re.split(r"(?<=[.!?])\s+|\n\s*\n", prose)
    return [" ".join(p.split()) for p in [*parts, *rows] if p.strip()]


def _public_providers() -> set[str]:
    # Provider is a Protocol with data members, so issubclass cannot ask it: a provider is
    # a public class from skyward.providers that provisions.
    found = set()
    for name in sky.__all__:
        value = getattr(sky, name)
        if (
            isinstance(value, type)
            and value.__module__.startswith("skyward.providers.")
            and value.__module__ != Provider.__module__
            and callable(getattr(value, "provision", None))
        ):
            found.add(name)
    return found


def _commands() -> set[str]:
    return set(cli.commands)


def _resolves(path: str) -> bool:
    value: object = sky
    for part in path.split("."):
        if not hasattr(value, part):
            return False
        value = getattr(value, part)
    return True


def _migration_row_says_missing(line: str) -> bool:
    return bool(re.search(r"\|\s*(not yet|not provided|no equivalent|renamed)\b", line))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_sky_name_a_page_shows_exists(page: Path) -> None:
    missing = []
    for line in _text(page).splitlines():
        if page == MIGRATION and _migration_row_says_missing(line):
            continue
        for path in re.findall(r"\bsky\.((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)", line):
            if not _resolves(path):
                missing.append(f"sky.{path}")
    assert missing == [], f"{page.name} shows names skyward does not have: {sorted(set(missing))}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_calls_an_existing_provider_planned(page: Path) -> None:
    public = _public_providers()

    def subject(sentence: str) -> str:
        # A table row speaks of what its first cell names (a migration row "| sky.GCP | not
        # yet | use sky.SSH |" says nothing of SSH).
        return sentence.split("|")[1] if sentence.startswith("|") else sentence

    wrong = [
        sentence
        for sentence in _sentences(_text(page))
        if NOT_THERE.search(sentence)
        and any(re.search(rf"\b{name}\b", subject(sentence)) for name in public - {"Local"})
    ]
    assert wrong == [], f"{page.name} calls an existing provider planned: {wrong}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_offers_an_extra_for_a_provider_that_does_not_exist(page: Path) -> None:
    public = _public_providers()
    for provider, extra in EXTRAS.items():
        if provider not in public:
            assert f"skyward[{extra}]" not in _text(page), (page.name, extra)
            assert f".[{extra}]" not in _text(page), (page.name, extra)


def test_doctor_offers_no_extra_for_a_provider_that_does_not_exist(tmp_path: Path) -> None:
    from skyward.cli.doctor import run_checks

    said = " ".join(f"{c.name} {c.detail} {c.fix}" for c in run_checks({}, tmp_path))
    public = _public_providers()
    for provider, extra in EXTRAS.items():
        if provider not in public:
            assert f"skyward[{extra}]" not in said, extra
            assert f"{provider} credentials" not in said, provider
            assert f"extra [{extra}]" not in said, extra
        else:
            assert f"{provider} credentials" in said, provider


def test_every_public_provider_has_a_section_on_the_providers_page_and_the_readme() -> None:
    providers_page = (ROOT / "docs" / "providers.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for name in _public_providers():
        assert re.search(rf"^#+ .*\b{name}\b", providers_page, re.MULTILINE), name
        assert f"sky.{name}" in readme or f"`{name}`" in readme, name


def test_the_providers_table_lists_exactly_the_public_providers() -> None:
    page = (ROOT / "docs" / "providers.md").read_text()
    rows = re.findall(r"^\| `sky\.(\w+)\(", page, re.MULTILINE)
    assert set(rows) == _public_providers()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cli_command_a_page_shows_exists(page: Path) -> None:
    shown = set(re.findall(r"`skyward ([a-z][a-z-]*)\b", _text(page)))
    shown |= set(re.findall(r"^\s*\$?\s*skyward ([a-z][a-z-]*)\b", _text(page), re.MULTILINE))
    assert shown <= _commands(), f"{page.name}: {sorted(shown - _commands())}"


def test_the_cli_page_the_readme_and_the_index_name_every_command() -> None:
    cli_page = (ROOT / "docs" / "cli.md").read_text()
    for command in _commands():
        assert re.search(rf"^#+ .*`skyward {command}\b", cli_page, re.MULTILINE), command
        for page in ("README.md", "docs/index.md"):
            assert f"skyward {command}" in (ROOT / page).read_text(), (page, command)


def test_the_reference_lists_every_public_name() -> None:
    reference = (ROOT / "docs" / "reference.md").read_text()
    listed = set(re.findall(r"^::: skyward\.(\w+)\s*$", reference, re.MULTILINE))
    public = {n for n in sky.__all__ if not n.startswith("_") and n != "plugins"}
    assert public - listed == set(), "reference.md omits these public names"
    assert listed - public == set(), "reference.md lists names that are not public"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_exception_a_page_names_exists(page: Path) -> None:
    pattern = r"`(?:sky\.)?([A-Z]\w*(?:Error|Lost|Mismatch|Hang|Closed))`"
    named = set(re.findall(pattern, _text(page)))
    known = set(sky.__all__) | set(dir(builtins)) | FOREIGN_ERRORS
    assert named - known == set(), f"{page.name}: {sorted(named - known)}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_says_uneven_collectives_go_undetected(page: Path) -> None:
    if "CollectiveHang" not in sky.__all__:
        pytest.skip("no hang watch")  # pragma: no cover - CollectiveHang is public
    wrong = [
        s
        for s in _sentences(_text(page))
        if re.search(r"collective", s, re.IGNORECASE)
        and re.search(r"(can ?not|can't|nothing can) (detect|see)|undetect|hangs forever", s)
        and "CollectiveHang" not in s
    ]
    assert wrong == [], f"{page.name}: {wrong}"


def test_the_readme_says_which_error_a_bad_value_raises() -> None:
    # An accelerator the catalog does not know is a ValueError, not pydantic's
    # ValidationError: the README must not promise one for every bad value.
    readme = (ROOT / "README.md").read_text()
    assert not re.search(r"value is a pydantic `ValidationError`", readme)


def test_the_readmes_first_example_runs_as_written(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    first = re.search(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    assert first is not None
    script = tmp_path / "first.py"
    script.write_text(first.group(1))
    env = {**os.environ, "SKYWARD_LOG_DIR": str(tmp_path / "logs")}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env,
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"loss 0\.\d{4}, evaluated on node \d", done.stdout), done.stdout


def test_the_readme_names_every_example() -> None:
    readme = (ROOT / "README.md").read_text()
    examples = sorted(
        p.name for p in (ROOT / "examples").iterdir() if p.suffix in {".py", ".ipynb"}
    )
    missing = [name for name in examples if f"`{name}`" not in readme]
    assert not missing, f"README's examples list lacks {missing}"


def test_the_api_pages_machine_prices_are_the_librarys() -> None:
    # A comment that shows what a call prints: ``# gcp a3-highgpu-4g 44.245``.
    text = (ROOT / "docs" / "api.md").read_text()
    shown = re.findall(
        r'for m in sky\.accelerators\.machines\("([^"]+)"\):\n\s+print\(m\.cloud, m\.type, '
        r"m\.hourly\)\s+# (\S+) (\S+) ([\d.]+)",
        text,
    )
    assert shown, "api.md no longer shows a machines() listing: update this test"
    for accelerator, cloud, kind, price in shown:
        first = sky.accelerators.machines(accelerator)[0]
        assert (first.cloud, first.type, first.hourly) == (cloud, kind, float(price))
