"""Scheduling's answers to what inventory announces (inventory never imports scheduling)."""

from __future__ import annotations

from typing import Any

from scheduling import services


def wake_on_schedulable_gpus(sender: type, gpu_ids: list[int], **kwargs: Any) -> None:
    """GPUs became schedulable (a node undrained or heard from again, a GPU back online,
    recovered or newly discovered): queued jobs may fit now, so the placement loop runs now
    rather than at beat's next backstop pass."""
    services.request_placement_pass()
