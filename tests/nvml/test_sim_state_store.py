"""The simulator's shared state file: every write is seen by every reader."""

from __future__ import annotations

from inventory.nvml.sim import state as statemod
from inventory.nvml.sim.state import FileStore


def test_every_write_changes_the_signature_even_when_the_clock_stands_still(tmp_path, monkeypatch):
    """Readers reload on a new (mtime, inode, size): writes of the same size within one
    clock tick, whose replaced files may reuse an inode, must still differ (a fault injected
    right after another was once never seen by the agent)."""
    store = FileStore(tmp_path, "node-1")
    store.create_if_missing({"schema": statemod.SCHEMA, "count": 0})
    monkeypatch.setattr(statemod.time, "time_ns", lambda: 1_000_000_000)
    seen = {store.signature()}
    for count in range(1, 6):
        with store.transaction() as state:
            state["count"] = count  # one digit: the same size every time
        seen.add(store.signature())
    assert len(seen) == 6
    mtimes = sorted(signature[0] for signature in seen if signature)
    assert mtimes == sorted(set(mtimes))
