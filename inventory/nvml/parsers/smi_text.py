"""Parser for ``nvidia-smi -q`` (and ``-a``, ``-q -i N``) text output.

Seen in the captures: drivers 510.73 .. 610.62 (Linux and Windows). The value column moved
between drivers (labels padded to 38, 42 or 55 columns), so lines are split on the first
``<spaces>:`` rather than at a fixed width, and nesting comes from indentation alone. 610-series
drivers append ``[Deprecated; ...]`` to ``Driver Version`` (the ``KMD Version`` line is used) and
nest power limits under ``GPU Ceiling Power Limit``. Excerpts that start mid-document or contain
``[...]`` elision lines parse to whatever they contain.
"""

from __future__ import annotations

import re

from .common import ParseError
from .smi_model import Node, SmiLog, build_smi_log, snake_key

__all__ = ["parse_smi_text"]

_KEY_VALUE_RE = re.compile(r"^(?P<key>.*?\S)\s+:(?:\s(?P<value>.*))?$")
_GPU_HEADER_RE = re.compile(r"^GPU\s+(?P<bus_id>[0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)$")


def _node(content: str) -> Node:
    if match := _KEY_VALUE_RE.match(content):
        return Node(key=snake_key(match["key"]), value=(match["value"] or "").strip())
    if match := _GPU_HEADER_RE.match(content):
        return Node(key="gpu", value=match["bus_id"])
    return Node(key=snake_key(content))


def _tree(text: str) -> Node:
    root = Node(key="nvidia_smi_log")
    stack: list[tuple[int, Node]] = [(-1, root)]
    for raw in text.expandtabs(4).splitlines():
        content = raw.strip()
        if not content or content.startswith("===="):
            continue
        indent = len(raw) - len(raw.lstrip())
        node = _node(content)
        while stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def parse_smi_text(text: str) -> SmiLog:
    """Parse ``nvidia-smi -q`` text into an :class:`SmiLog` (same model as the XML parser).

    A paste with no ``GPU <bus id>`` header and no ``Attached GPUs`` line (an excerpt of one
    GPU's sections) is read as a single GPU with an unknown bus id. Raises :class:`ParseError`
    for empty input; missing fields and ``N/A`` values become ``None``.
    """
    root = _tree(text)
    if not root.children:
        raise ParseError("empty nvidia-smi -q text")
    if not root.find_all("gpu") and root.find("attached_gpus") is None:
        root = Node(key="nvidia_smi_log", children=[Node(key="gpu", children=root.children)])
    return build_smi_log(root)
