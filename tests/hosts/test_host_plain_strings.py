"""What a host hands to systemd-run, a unit's argv, environment and stdin is checked as the plain str it is.

A str subclass can format, print and encode itself otherwise than its characters: a user name checked as
``nobody`` could become ``User=root`` in the argv. So every name, path, argument, environment entry and
token a host takes must be a plain str (or bytes, for a token), as every id the store takes is; anything
else is InvalidInputError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hosts.proc import safe_command, safe_env, token_bytes
from hosts.rundir import safe_run_root
from hosts.systemd_run import property_path, systemd_run_argv
from lifecycle_es import InvalidInputError
from lifecycle_es.signing import generate_key


class Root(str):
    """A str whose characters pass the check and whose every other answer says root."""

    def __format__(self, spec: str) -> str:
        return "root"

    def __str__(self) -> str:
        return "root"

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return b"root"


def refused(field: str, call: Callable[[], Any]) -> None:
    with pytest.raises(InvalidInputError) as info:
        call()
    assert info.value.field == field, info.value


def argv(**options: Any) -> list[str]:
    return systemd_run_argv(**{"unit": "lifecycle-es-unit-1", "command": ["/bin/true"], "user": "nobody",
                               "group": "nogroup", **options})


def test_a_user_that_formats_as_root_never_reaches_the_argv() -> None:
    assert "User=nobody" in argv()
    refused("user", lambda: argv(user=Root("nobody")))
    refused("group", lambda: argv(group=Root("nogroup")))


@pytest.mark.parametrize(("field", "options"), [
    ("unit", {"unit": Root("lifecycle-es-unit-1")}),
    ("scope", {"scope": Root("system")}),
    ("description", {"description": Root("a unit")}),
    ("command", {"command": [Root("/bin/true")]}),
    ("env", {"env": {"NAME": Root("value")}}),
    ("env", {"env": {Root("NAME"): "value"}}),
    ("log_file", {"log_file": Root("/var/log/unit.log")}),
])
def test_every_argv_value_is_a_plain_str(field: str, options: dict[str, Any]) -> None:
    refused(field, lambda: argv(**options))


def test_the_other_host_values_are_plain(tmp_path: Path) -> None:
    refused("command", lambda: safe_command(["/bin/echo", Root("x")]))
    refused("env", lambda: safe_env({"A": Root("b")}))
    refused("token", lambda: token_bytes(Root("secret")))
    assert token_bytes("secret") == b"secret"
    refused("run_root", lambda: safe_run_root(Root(str(tmp_path))))
    refused("path", lambda: property_path(Root("/srv/x"), "path"))
    refused("name", lambda: generate_key(tmp_path / "ops.key", name=Root("ops")))
