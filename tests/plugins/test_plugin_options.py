"""Every built-in plugin spells its options once: a ``TypedDict`` (names, types) that its
signature, its model (defaults, limits), its docstring and its table in docs/plugins.md all
agree with; a misspelled option is a ``TypeError`` naming it, a wrong value a
``ValidationError`` naming the option."""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any, get_type_hints

import pydantic
import pytest
from support import ROOT

import skyward as sky

# plugin -> (module, TypedDict, model, the option that may come by position)
PLUGINS: dict[str, tuple[str, str, str, str | None]] = {
    "jax": ("_jax", "JaxOptions", "_Options", "cuda"),
    "torch": ("_torch", "TorchOptions", "_Options", "backend"),
    "keras": ("_keras", "KerasOptions", "_Options", "backend"),
    "huggingface": ("_huggingface", "HuggingfaceOptions", "_Options", "token"),
    "joblib": ("_joblib", "JoblibOptions", "_JoblibOptions", None),
    "sklearn": ("_joblib", "SklearnOptions", "_SklearnOptions", None),
    "cuml": ("_nvidia", "CumlOptions", "_CumlOptions", "cuda"),
    "mps": ("_nvidia", "MpsOptions", "_MpsOptions", None),
}
PAGE = (ROOT / "docs" / "plugins.md").read_text()


def _parts(name: str) -> tuple[Any, type, type[pydantic.BaseModel], str | None]:
    module_name, options, model, first = PLUGINS[name]
    module = importlib.import_module(f"skyward.plugins.{module_name}")
    return getattr(sky.plugins, name), getattr(module, options), getattr(module, model), first


def _names(name: str) -> list[str]:
    """The plugin's options in signature order: the positional one, then the keywords."""
    _, options, _, first = _parts(name)
    return [*([first] if first else []), *(n for n in get_type_hints(options) if n != first)]


@pytest.mark.parametrize("name", PLUGINS)
def test_the_options_name_and_type_every_field_of_the_model(name: str) -> None:
    _, options, model, first = _parts(name)
    given = dict(get_type_hints(options))
    if first is not None and first not in given:
        given[first] = model.model_fields[first].annotation
    assert {n: f.annotation for n, f in model.model_fields.items()} == given
    assert model.model_config.get("strict") and model.model_config.get("extra") == "forbid"


@pytest.mark.parametrize("name", PLUGINS)
def test_the_signature_shows_each_option_with_the_model_default(name: str) -> None:
    plugin, _, model, first = _parts(name)
    parameters = inspect.signature(plugin).parameters
    assert list(parameters) == _names(name)
    for option, field in model.model_fields.items():
        assert parameters[option].default == field.default, option
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if option == first else None
        assert parameters[option].kind is (kind or inspect.Parameter.KEYWORD_ONLY), option


@pytest.mark.parametrize("name", PLUGINS)
def test_a_misspelled_option_is_a_type_error_naming_it(name: str) -> None:
    plugin, *_ = _parts(name)
    with pytest.raises(TypeError, match=rf"{name}\(\) got an unexpected keyword argument 'vrsion'"):
        plugin(vrsion="1")


@pytest.mark.parametrize(
    ("name", "options", "field"),
    [
        ("keras", {"data_parallel": "yes"}, "data_parallel"),
        ("huggingface", {"cache": ""}, "cache"),
        ("huggingface", {"datasets": 1}, "datasets"),
        ("joblib", {"version": "latest"}, "version"),
        ("sklearn", {"version": ">=1.4,,<"}, "version"),
        ("cuml", {"version": "not-a-version"}, "version"),
        ("cuml", {"accelerate": "no"}, "accelerate"),
        ("mps", {"active_thread_percentage": 101}, "active_thread_percentage"),
        ("mps", {"pinned_memory_limit": "8 GB"}, "pinned_memory_limit"),
    ],
)
def test_a_wrong_value_is_a_validation_error_naming_the_option(
    name: str, options: dict[str, object], field: str
) -> None:
    plugin, *_ = _parts(name)
    with pytest.raises(pydantic.ValidationError, match=rf"sky\.plugins\.{name}\n{field}\n"):
        plugin(**options)


@pytest.mark.parametrize("name", PLUGINS)
def test_every_option_is_in_the_docstring_and_the_docs_table_with_its_default(name: str) -> None:
    plugin, _, model, _ = _parts(name)
    doc = inspect.getdoc(plugin.__call__ if name == "joblib" else plugin) or ""
    assert [n for n in _names(name) if f"``{n}``" not in doc] == []
    section = PAGE.split(f"## `sky.plugins.{name}(", 1)[1].split("\n## ", 1)[0]
    table = re.search(r"^\| Option \|.*?\n((?:\|.*\n)+)", section, re.M)
    assert table, f"docs/plugins.md: no options table under sky.plugins.{name}"
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]*) \|", table.group(1), re.M))
    _, options, _, first = _parts(name)
    listed = list(get_type_hints(options))  # the table's order: the TypedDict's,
    if first is not None and first not in listed:  # after an option only a name gives
        listed.insert(0, first)
    assert list(rows) == listed
    for option, field in model.model_fields.items():
        if field.default is not None:  # None reads "newest", "none", or what it picks
            assert str(field.default) in rows[option], option
