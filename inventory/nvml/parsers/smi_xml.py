"""Parser for ``nvidia-smi -q -x`` (XML).

Seen in the captures: drivers 418.43 .. 595.91 (Linux and Windows, bare metal, VMs and a GRID
vGPU guest), DTDs ``nvsmi_device_v10`` .. ``v13`` and DTD-less old output, plus trimmed
fragments (e.g. a ``<gpu>`` with only name/uuid/temperature/power).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from .common import ParseError
from .smi_model import Node, SmiLog, build_smi_log

__all__ = ["parse_smi_xml"]


def _node(element: ET.Element) -> Node:
    # <gpu id="00000000:06:00.0"> keeps its bus id as the node value, like the text header.
    text = element.get("id") if element.tag == "gpu" else (element.text or "").strip()
    return Node(key=element.tag, value=text or None)


def _to_node(root: ET.Element) -> Node:
    """The element tree as nodes; iterative, so a deeply nested document cannot overflow."""
    top = _node(root)
    stack = [(root, top)]
    while stack:
        element, node = stack.pop()
        for child in element:
            node.children.append(_node(child))
            stack.append((child, node.children[-1]))
    return top


def parse_smi_xml(document: str | bytes) -> SmiLog:
    """Parse ``nvidia-smi -q -x`` output into an :class:`SmiLog`.

    Raises :class:`ParseError` when the document is not well-formed XML or its root is not
    ``<nvidia_smi_log>``; missing elements and ``N/A`` values become ``None``.
    """
    try:
        root = ET.fromstring(document)
    except (ET.ParseError, UnicodeError) as exc:  # UnicodeError: a lone surrogate in a str
        raise ParseError(f"not well-formed nvidia-smi XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError(f"expected <nvidia_smi_log> root, got <{root.tag}>")
    return build_smi_log(_to_node(root))
