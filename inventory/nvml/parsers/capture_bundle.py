"""Splitter for multi-command capture bundles (nvidia_gpu_exporter ``internal/captures``).

A bundle is a metadata header followed by one section per command, each introduced by a bar of
80 ``#``, a ``# <state> :: <title>`` line, an optional ``# $ <command>`` line and a closing bar.
The section bodies are raw nvidia-smi output for the parsers in this package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CaptureSection", "split_capture_bundle"]

_BAR = "#" * 80


@dataclass(frozen=True)
class CaptureSection:
    """``title`` as printed (``"idle :: query (-q)"``), ``command`` without the ``$``."""

    title: str
    command: str | None
    body: str

    def runs(self, *arguments: str) -> bool:
        """True when the section's command is ``nvidia-smi`` followed by exactly ``arguments``
        (``runs("-L")``, ``runs("topo", "-m")``); a ``--query-gpu=...`` argument matches its
        ``--query-gpu`` prefix."""
        if self.command is None:
            return False
        words = self.command.split()
        if not words or words[0] != "nvidia-smi" or len(words) - 1 != len(arguments):
            return False
        return all(
            word == wanted or word.startswith(wanted + "=")
            for word, wanted in zip(words[1:], arguments, strict=True)
        )


def split_capture_bundle(text: str) -> list[CaptureSection]:
    """Split a capture bundle into its sections, in file order."""
    lines = text.splitlines()
    sections: list[CaptureSection] = []
    index = 0
    while index < len(lines):
        if lines[index] != _BAR or index + 1 >= len(lines) or not lines[index + 1].startswith("# "):
            index += 1
            continue
        header: list[str] = []
        index += 1
        while index < len(lines) and lines[index] != _BAR:
            header.append(lines[index].removeprefix("#").strip())
            index += 1
        body_start = index + 1
        index = body_start
        while index < len(lines) and lines[index] != _BAR:
            index += 1
        command = next((h.removeprefix("$").strip() for h in header if h.startswith("$")), None)
        sections.append(
            CaptureSection(
                title=header[0] if header else "",
                command=command,
                body="\n".join(lines[body_start:index]).strip("\n") + "\n",
            )
        )
    return sections
