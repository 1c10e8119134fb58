"""``ComputePool(logging=sky.LogConfig(...))``: handlers on the standard ``skyward`` logger
for the pool's life, the program's own logging configuration left as it was."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pydantic
import pytest

import skyward as sky
from skyward.console import handlers

LOGGER = logging.getLogger("skyward")


class Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def skyward(self, level: int) -> list[str]:
        return [r.getMessage() for r in self.records if r.name == "skyward" and r.levelno == level]


@contextmanager
def program_logging(level: int) -> Iterator[Recorder]:
    """A program that configured the root logger (as ``basicConfig`` does) at ``level``."""
    root = logging.getLogger()
    recorder = Recorder()
    saved = root.level
    root.addHandler(recorder)
    root.setLevel(level)
    try:
        yield recorder
    finally:
        root.removeHandler(recorder)
        root.setLevel(saved)


def _state() -> tuple[int, bool, list[logging.Handler]]:
    return LOGGER.level, LOGGER.propagate, list(LOGGER.handlers)


@sky.compute
def one() -> int:
    return 1


@pytest.mark.timeout(60)
def test_the_file_gets_the_pools_records_and_the_logger_is_left_as_it_was(
    tmp_path: Path,
) -> None:
    before = _state()
    log = tmp_path / "logs" / "run.log"
    config = sky.LogConfig(level="INFO", file=log, console=False)
    with sky.ComputePool(nodes=2, logging=config, quiet=True) as pool:
        assert one() >> pool == 1
        assert _state() != before  # handlers added while open
    assert _state() == before
    text = log.read_text()
    assert f"INFO skyward: starting 2 node(s) on local (pool {pool.name})" in text
    assert f"pool {pool.name} ready: 2 node(s)" in text


@pytest.mark.timeout(60)
def test_more_detail_goes_to_the_file_and_not_to_the_programs_handlers(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with program_logging(logging.WARNING) as program:
        config = sky.LogConfig(level="DEBUG", file=log, console=False)
        with sky.ComputePool(logging=config, quiet=True) as pool:
            LOGGER.debug("a detail")
            LOGGER.warning("a warning")
            one() >> pool
    text = log.read_text()
    assert "DEBUG skyward: a detail" in text and "WARNING skyward: a warning" in text
    assert "INFO skyward: starting 1 node(s)" in text
    # The program saw what it saw before: warnings, not the pool's INFO or DEBUG records.
    assert program.skyward(logging.WARNING) == ["a warning"]
    assert program.skyward(logging.INFO) == [] and program.skyward(logging.DEBUG) == []


@pytest.mark.timeout(60)
def test_console_writes_to_the_current_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with sky.ComputePool(logging=sky.LogConfig(console=True), quiet=True) as pool:
        one() >> pool
    err = capsys.readouterr().err
    assert f"INFO skyward: pool {pool.name} ready: 1 node(s)" in err


@pytest.mark.timeout(60)
def test_a_failed_start_takes_the_handlers_off_too(tmp_path: Path) -> None:
    @contextmanager
    def broken(info: sky.InstanceInfo) -> Iterator[None]:
        raise RuntimeError("no")
        yield

    before = _state()
    plugin = sky.Plugin.create("broken").with_around_app(broken)
    pool = sky.ComputePool(plugins=[plugin], logging=True, quiet=True)
    with pytest.raises(sky.StartError):
        pool.start()
    assert _state() == before


def test_pools_closed_in_any_order_leave_the_logger_as_they_found_it(tmp_path: Path) -> None:
    before = _state()
    with program_logging(logging.WARNING):
        first = handlers.install(sky.LogConfig(level="INFO", file=tmp_path / "a.log"))
        second = handlers.install(sky.LogConfig(level="DEBUG", console=False))
        assert LOGGER.level == logging.DEBUG
        handlers.remove(first)
        assert LOGGER.level == logging.DEBUG  # the second still asks for DEBUG
        handlers.remove(second)
        handlers.remove(second)  # idempotent
    assert _state() == before


def test_size_rotation_keeps_retention_old_files(tmp_path: Path) -> None:
    log = tmp_path / "r.log"
    installed = handlers.install(
        sky.LogConfig(file=log, console=False, rotation="1 KB", retention=2)
    )
    try:
        for i in range(200):
            LOGGER.warning("line %d of a log that rotates", i)
    finally:
        handlers.remove(installed)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.log", "r.log.1", "r.log.2"]


def test_logging_true_and_false_are_skyward_05s() -> None:
    assert sky.ComputePool(logging=True).spec.logging == sky.LogConfig()
    assert sky.ComputePool(logging=False).spec.logging is None
    assert sky.ComputePool().spec.logging is None


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"level": "VERBOSE"}, "level"),  # TRACE is a level (below DEBUG), SUCCESS is not
        ({"rotation": "often"}, "rotation"),
        ({"retention": -1}, "retention"),
        ({"colour": True}, "colour"),
    ],
)
def test_a_wrong_value_names_its_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        sky.LogConfig(**options)  # type: ignore[arg-type]


def test_levels_and_files_are_read_as_people_write_them(tmp_path: Path) -> None:
    config = sky.LogConfig(level="debug", file="relative.log")
    assert config.level == "DEBUG" and config.file == Path.cwd() / "relative.log"
    assert sky.LogConfig(level=logging.WARNING).level == "WARNING"  # type: ignore[arg-type]
    assert sky.LogConfig(rotation="1 day").rotation == "1 day"
