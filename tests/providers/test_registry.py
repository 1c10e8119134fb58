"""The providers' registry: every provider is one line there, and what reads it names none.

The last test adds a provider as a newcomer would, one package and one registry line, and
finds it in ``skyward``, ``skyward.toml``, ``skyward doctor``, ``skyward ls`` and the extras'
messages without any other file changed.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

from support import ROOT

import skyward as sky
from skyward.providers.registry import PROVIDERS
from skyward.providers.scope import Scope

# The files that must learn the providers from the registry alone.
READERS = [
    "skyward/__init__.py",
    "skyward/pool/named.py",
    "skyward/cli/doctor.py",
    "skyward/cli/leftovers.py",
    "skyward/client/extras.py",
]


def _run(code: str, *, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_entry_loads_its_class_its_credentials_check_and_its_scope() -> None:
    options: list[str] = []
    for entry in PROVIDERS:
        assert entry.load() is getattr(sky, entry.public), entry.type
        scope = entry.scope()
        assert scope is None or isinstance(scope, Scope), entry.type
        options += [flag.option for flag in scope.flags] if scope else []
        assert entry.credentials is None or entry.credentials_check() is not None
    assert len(options) == len(set(options)), options  # no two providers share a flag


def test_the_type_checkers_view_lists_exactly_the_registry() -> None:
    tree = ast.parse((ROOT / "skyward/providers/public.py").read_text())
    imported = {
        (node.module, alias.name)
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {(entry.module, entry.public) for entry in PROVIDERS}


def test_the_files_that_read_the_registry_name_no_cloud() -> None:
    # Local and SSH are plain words (a local key, SSH keys); every other provider's type,
    # class and SDK packages must not appear.
    words: set[str] = set()
    for entry in PROVIDERS:
        if entry.type in ("local", "ssh"):
            continue
        words |= {entry.type, entry.public}
        words |= {name.split(".")[0] for name in entry.imports}
        words |= {name.split("-")[0] for name in entry.distributions if name != "paramiko"}
    pattern = re.compile(rf"\b({'|'.join(sorted(words))})\b", re.IGNORECASE)
    for path in READERS:
        found = pattern.findall((ROOT / path).read_text())
        assert found == [], (path, found)


def test_importing_skyward_reads_no_registry_until_a_provider_is_asked_for() -> None:
    code = textwrap.dedent(
        """
        import sys, skyward
        seen = ["skyward.providers.registry" in sys.modules]
        skyward.compute, skyward.instance_info
        seen.append("skyward.providers.registry" in sys.modules)
        skyward.AWS
        seen.append("skyward.providers.registry" in sys.modules)
        seen.append("skyward.providers.gcp" in sys.modules)
        print(seen)
        """
    )
    assert _run(code).strip() == "[False, False, True, False]"


def test_a_new_provider_is_one_package_and_one_registry_line(tmp_path: Path) -> None:
    package = tmp_path / "newcloud"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            """
            from skyward.providers.local import Local

            class NewCloud(Local):
                pass
            """
        )
    )
    (package / "credentials.py").write_text(
        textwrap.dedent(
            """
            from skyward.providers.credentials import Check

            def check(env, home):
                return Check("NewCloud credentials", "ok", f"token in {env['NEW_TOKEN']}")
            """
        )
    )
    (package / "scope.py").write_text(
        textwrap.dedent(
            """
            from skyward.providers.base import Leftover
            from skyward.providers.scope import Flag, Places, Scope

            class Place:
                def __init__(self, name):
                    self.name = name

                def leftovers(self, *, pool=None):
                    made = Leftover("newcloud", "machine", "m-1", "p", "me", None, "running")
                    return [made] if pool in (None, "p") else []

                def delete(self, leftovers, reporter):
                    pass

            class NewScope(Scope):
                flags = (Flag("--place", "places", "A place to look in.", multiple=True),)
                cloud = True

                def given(self, options):
                    return bool(options.many("places"))

                def places(self, options):
                    named = options.many("places") or ("home",)
                    found = [(f"newcloud {p}", Place(p)) for p in named if p != "closed"]
                    advice = "newcloud: not checked: pass sky.NewCloud(place='open')"
                    return Places(found, [advice] if "closed" in named else [])

                def advice(self, text):
                    return text.replace("sky.NewCloud(place='open')", "--place open")

            SCOPE = NewScope()
            """
        )
    )
    (tmp_path / "skyward.toml").write_text('[pools.p]\nprovider = "newcloud"\n')
    code = textwrap.dedent(
        """
        import json, os, sys
        from pathlib import Path
        sys.path.insert(0, os.getcwd())
        from skyward.providers import registry

        registry.PROVIDERS = (*registry.PROVIDERS, registry.Entry(
            type="newcloud", public="NewCloud", module="newcloud", extra="newcloud",
            distributions=("newcloud-sdk",), imports=("newcloud_sdk",),
            credentials="newcloud.credentials:check", leftovers="newcloud.scope:SCOPE",
        ))

        import skyward
        from click.testing import CliRunner
        from skyward._errors import MissingDependency
        from skyward.client.extras import check
        from skyward.cli import main
        from skyward.cli.doctor import run_checks
        from skyward.pool.named import read_pool

        def cli(*args):
            done = CliRunner().invoke(main, list(args))
            return [done.exit_code, done.output]

        try:
            check("newcloud_sdk", feature="sky.NewCloud")
            missing = ""
        except MissingDependency as exc:
            missing = str(exc)
        found = read_pool("p", {}, known=set(), files=[Path("skyward.toml")])
        doctor = run_checks({"NEW_TOKEN": "/the/token"}, Path.cwd())
        print(json.dumps({
            "public": "NewCloud" in skyward.__all__ and skyward.NewCloud.__name__,
            "named": type(found.provider).__name__,
            "missing": missing,
            "doctor": [f"{c.status} {c.name}: {c.detail}" for c in doctor],
            "help": cli("ls", "--help"),
            "ls": cli("ls", "--cloud", "newcloud"),
            "narrowed": cli("ls", "--place", "there", "--pool", "p"),
            "closed": cli("ls", "--place", "closed"),
            "down": cli("down", "--all", "--yes", "--place", "there"),
        }))
        """
    )
    said = json.loads(_run(code, cwd=tmp_path))
    assert said["public"] == "NewCloud"
    assert said["named"] == "NewCloud"
    assert "pip install 'skyward[newcloud]'" in said["missing"]
    assert "ok NewCloud credentials: token in /the/token" in said["doctor"]
    assert "missing extra [newcloud]: not installed (no newcloud-sdk)" in said["doctor"]
    code, text = said["help"]
    assert code == 0 and "--place TEXT" in text and "newcloud]" in text
    # --cloud's help names the flag that selects it (wherever click wraps the line)
    assert "--place: newcloud" in " ".join(text.split())
    code, text = said["ls"]
    assert code == 0, text
    assert "newcloud  " in text and "m-1" in text and "Checked: newcloud home." in text
    code, text = said["narrowed"]
    assert code == 0 and "Checked: newcloud there." in text
    code, text = said["closed"]
    assert code == 1 and "newcloud: not checked: pass --place open" in text
    code, text = said["down"]
    assert code == 0 and "Deleted 1 resource(s)." in text
