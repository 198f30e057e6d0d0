"""What a node agent reports to the central side about its GPUs' health: the wire format
between ``health.agent`` (which detects) and ``health.services`` (which stores and acts).

Plain dataclasses with ``to_dict``/``from_dict`` (JSON through Celery), no Django.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class HealthReport:
    """One thing an agent saw on a GPU (or on the node when ``gpu_index`` is None).

    ``kind`` is a ``health.choices.EventKind`` value. ``key`` makes the report unique on its
    node (an XID's NVML timestamp, a counter's new value): the central side stores and acts on
    each (node, key) once, however often it is sent. ``data`` is the raw evidence: the XID's
    text, counters before and after, clock event reasons, the NVML error.
    """

    kind: str
    key: str
    occurred_at: float  # Unix seconds, the agent's clock
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    xid: int | None = None
    message: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> HealthReport:
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{name: value for name, value in values.items() if name in names})
