"""Counts in words, shared by the server's texts and the CLI (standard library only, so the
CLI's API verbs can use it without loading the placement engine)."""


def plural(count: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``: a count with its noun, in the plural unless it is one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"
