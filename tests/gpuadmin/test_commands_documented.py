"""Every verb and sub-verb of ``gpuadmin`` is documented in the site, in one of two homes: the
API verbs (those ``fleet_cli``, ``jobs_cli``, ``ops_cli``, ``ray_cli`` and ``ask_cli`` add) and
``completion`` in the CLI page (docs/operations/cli.md), every other verb, the simulator's and
the project's management commands in the command's reference page (docs/reference/commands.md).
"""

from __future__ import annotations

import argparse

from gpuadmin import ask_cli, cli, fleet_cli, jobs_cli, ops_cli, ray_cli
from inventory.nvml.sim.cli import _parser as sim_parser
from tests.conftest import APP_PACKAGES, REPO_DIR
from tests.gpuadmin.markdown_tables import CODE_SPAN, cells
from tests.gpuadmin.test_cli_help import verb_paths

DOCS = REPO_DIR / "docs"
COMMANDS_PAGE = DOCS / "reference" / "commands.md"
CLI_PAGE = DOCS / "operations" / "cli.md"


def synopses(page: str) -> list[list[str]]:
    """The words of each synopsis of a page: a line of a code block that starts with
    ``gpuadmin``, or a code span starting with ``gpuadmin`` that opens a paragraph's line or
    stands in the first cell of a table row. A ``$ gpuadmin ...`` example is not one, nor is a
    verb named in passing in a sentence."""
    found = []
    in_code = False
    for line in page.splitlines():
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            spans = [line] if line.startswith("gpuadmin ") else []
        elif line.startswith("| "):
            spans = CODE_SPAN.findall(cells(line)[0])
        else:
            spans = CODE_SPAN.findall(line)[:1] if line.startswith("`gpuadmin ") else []
        found += [span.split() for span in spans if span.startswith("gpuadmin ")]
    return found


def documented(path: tuple[str, ...], page: list[list[str]]) -> bool:
    return any(words[1 : 1 + len(path)] == list(path) for words in page)


# Documented with the API verbs: the completion script of the whole command, which a person
# installs where they run those (its help names the CLI page).
CLI_PAGE_VERBS = {("completion",)}


def api_verbs() -> set[tuple[str, ...]]:
    """The verbs that talk to the web server over HTTP, and those documented with them."""
    parser = argparse.ArgumentParser()
    verbs = parser.add_subparsers()
    for module in (fleet_cli, jobs_cli, ops_cli, ray_cli, ask_cli):
        module.add_verbs(verbs)
    return set(verb_paths(parser)) | CLI_PAGE_VERBS


def server_commands() -> set[tuple[str, ...]]:
    """Every other verb, the simulator's (``gpuadmin sim ...``, parsed by its own CLI) and the
    management commands of the project's apps (``gpuadmin manage NAME``)."""
    management = {
        ("manage", path.stem)
        for app in APP_PACKAGES
        for path in (REPO_DIR / app).glob("management/commands/*.py")
        if not path.stem.startswith("_")
    }
    simulator = {("sim", *path) for path in verb_paths(sim_parser())}
    return set(verb_paths(cli.build_parser())) - api_verbs() | simulator | management


def test_the_verbs_split_into_both_homes():
    assert {("jobs", "submit"), ("status",), ("login",), ("reserve", "create"), ("ask",)} <= (
        api_verbs()
    )
    assert {("up",), ("token", "create"), ("sim", "inject", "xid")} <= server_commands()
    assert ("manage", "load_fleet") in server_commands()


def test_synopses_are_code_lines_table_cells_and_paragraph_openings():
    page = (
        "```\ngpuadmin reserve create [--gpus N]\n$ gpuadmin jobs list\n```\n"
        "| `gpuadmin drain TARGET`, `gpuadmin sim inject ecc --error a|b` | what \\| else |\n"
        "`gpuadmin login` asks for what it is not given, as `gpuadmin logout` does not.\n"
    )
    assert synopses(page) == [
        ["gpuadmin", "reserve", "create", "[--gpus", "N]"],
        ["gpuadmin", "drain", "TARGET"],
        ["gpuadmin", "sim", "inject", "ecc", "--error", "a|b"],
        ["gpuadmin", "login"],
    ]


def test_every_api_verb_is_on_the_cli_page():
    page = synopses(CLI_PAGE.read_text())
    assert sorted(" ".join(path) for path in api_verbs() if not documented(path, page)) == []


def test_every_other_command_is_on_the_commands_page():
    page = synopses(COMMANDS_PAGE.read_text())
    missing = [" ".join(path) for path in server_commands() if not documented(path, page)]
    assert sorted(missing) == []


def test_each_verb_has_one_home():
    """The commands page names the API verbs only in passing, linking to the CLI page, and
    the CLI page the others likewise."""
    on_commands_page = synopses(COMMANDS_PAGE.read_text())
    on_cli_page = synopses(CLI_PAGE.read_text())
    assert sorted(" ".join(p) for p in api_verbs() if documented(p, on_commands_page)) == []
    assert sorted(" ".join(p) for p in server_commands() if documented(p, on_cli_page)) == []
