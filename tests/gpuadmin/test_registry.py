"""The registry the lower apps ask questions of (``gpuadmin.registry``)."""

from __future__ import annotations

import re

import pytest

from gpuadmin.registry import Hook


def vetoes_everything(gpu: object, actor_name: str | None) -> str:
    return "no"


def allows_everything(gpu: object, actor_name: str | None) -> None:
    return None


def test_answers_are_asked_in_the_order_they_registered_and_each_once():
    hook = Hook("may this MIG change go")
    hook.register(vetoes_everything)
    hook.register(allows_everything)
    message = f"{__name__}.vetoes_everything already answers: may this MIG change go"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        hook.register(vetoes_everything)
    assert hook.answers == (vetoes_everything, allows_everything)
