"""``--help`` of every verb and sub-verb of ``gpuadmin``, as the parser has them: a verb added
later is covered without a line here (a ``%`` in a help text once crashed ``jobs submit
--help`` with ``TypeError: %o format``)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from gpuadmin import cli


def verb_paths(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[str, ...]]:
    """The words of every verb and sub-verb under ``parser`` (an alias once, by its name)."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        seen: set[int] = set()
        for name, verb in action.choices.items():
            if id(verb) in seen:  # an alias of a verb already walked
                continue
            seen.add(id(verb))
            yield (*path, name)
            yield from verb_paths(verb, (*path, name))


PATHS = list(verb_paths(cli.build_parser()))


def test_the_walk_reaches_sub_verbs():
    assert {("jobs", "submit"), ("token", "create"), ("node", "credential", "list")} <= set(PATHS)


@pytest.mark.parametrize("path", PATHS, ids=" ".join)
def test_help_of_every_verb(path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "_bootstrap_django", lambda **_: None)  # pytest-django set it up
    try:
        status = cli.main([*path, "--help"])
    except SystemExit as exited:
        status = exited.code
    out, err = capsys.readouterr()
    assert status in (0, None), err
    assert out.strip(), f"gpuadmin {' '.join(path)} --help printed nothing"
    if path[0] not in cli.PASS_THROUGH_VERBS:  # those print their own tools' help
        assert out.startswith(f"usage: gpuadmin {' '.join(path)}"), out
