"""``gpuadmin ask QUESTION``: the assistant (``POST /api/v1/assistant/ask/``) from a
terminal, through the HTTP API (``gpuadmin.client``), standard library only. Its output is
shown in docs/operations/cli.md."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TextIO
from urllib.parse import urljoin

from gpuadmin.client import Api, ApiError, run_verb
from gpuadmin.terminal import add_json_flag, print_json

# A question may take the model several turns, each up to GPUADMIN_ASSISTANT_TIMEOUT_S (120 s
# by default): the CLI waits longer than for any other verb.
ASK_TIMEOUT_S = 600.0


def cmd_ask(api: Api, args: argparse.Namespace, out: TextIO) -> int:
    """Ask, then print the answer, what it cites (with the server's address) and, when the
    answer was cut short, why. No model configured is the API's 503, one line on stderr."""
    question = " ".join(args.question).strip()
    if not question:
        raise ApiError(None, 'no question given: gpuadmin ask "why is my job 42 waiting?"')
    answer = replace(api, timeout_s=args.timeout).call(
        "POST", "/api/v1/assistant/ask/", {"question": question}
    )
    if args.json:
        print_json(out, answer)
        return 0
    sources = [
        f"  {citation['ref']}: {urljoin(api.url + '/', citation['url'])}"
        for citation in answer["citations"]
    ]
    parts = [
        answer["text"].strip(),
        "\n".join(["sources:", *sources]) if sources else "",
        f"stopped: {answer['stopped']}" if answer["stopped"] else "",
    ]
    print("\n\n".join(part for part in parts if part), file=out)
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds above 0")
    return value


def add_verbs(verbs: argparse._SubParsersAction) -> None:
    """The ``ask`` verb."""
    ask = verbs.add_parser(
        "ask", help="ask the assistant about the fleet in plain words: gpuadmin ask QUESTION ..."
    )
    ask.add_argument("question", nargs="+", help="the question (its words are joined)")
    ask.add_argument(
        "--timeout",
        type=_seconds,
        default=ASK_TIMEOUT_S,
        metavar="SECONDS",
        help=f"how long to wait for the answer (default {ASK_TIMEOUT_S:g})",
    )
    add_json_flag(ask)
    ask.set_defaults(run=run_verb(cmd_ask))
