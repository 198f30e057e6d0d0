"""NVIDIA's XID catalog as data: every XID of the catalog's sheets and of NVSentinel's mapping
is in ``health/data/xid_catalog.json``, with the catalog's own words, and the committed file is
what the generator makes of the fixtures."""

from __future__ import annotations

import csv
import json

import pytest
from django.core.management import call_command

from health import xids
from tests.conftest import SHARED_DIR

CATALOG_DIR = SHARED_DIR / "fixtures" / "real" / "xid-catalog"
SPOT = (13, 31, 43, 45, 48, 63, 64, 74, 79, 92, 93, 94, 95)


def rows(name: str) -> list[list[str]]:
    with (CATALOG_DIR / name).open(encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle))


@pytest.fixture(scope="module")
def sheet() -> dict[int, list[str]]:
    """The "Xids" sheet's rows by XID."""
    return {int(row[1]): row for row in rows(xids.XIDS_CSV)[1:] if row and row[1].isdigit()}


def test_every_xid_of_the_fixtures_is_in_the_catalog(sheet):
    listed = set(sheet)
    listed |= {int(row[0]) for row in rows(xids.NVSENTINEL_CSV) if row}
    listed |= {int(row[0]) for row in rows(xids.NVLINK5_CSV)[1:] if row}
    assert len(listed) == 172
    assert {info.xid for info in xids.all_xids()} == listed
    assert all(xids.lookup(xid) is not None for xid in listed)


@pytest.mark.parametrize("xid", SPOT)
def test_spot_values_are_the_catalogs(sheet, xid):
    row = sheet[xid]
    info = xids.lookup(xid)
    assert info is not None
    assert info.name == " ".join(row[3].split())
    assert info.mnemonic == " ".join(row[2].split())
    assert info.immediate == row[8].strip()
    assert info.investigatory == row[9].strip()
    assert info.meaning == row[11].strip()
    nvsentinel = {int(r[0]): r[3] for r in rows(xids.NVSENTINEL_CSV) if r}
    assert info.fatal is (nvsentinel[xid] == "FATAL")


def test_spot_values_read_as_nvidia_says():
    fallen = xids.lookup(79)
    assert fallen is not None
    assert fallen.title == "XID 79 (GPU has fallen off the bus)"
    assert (fallen.immediate, fallen.fault, fallen.fatal) == ("RESTART_BM", "hardware", True)
    assert fallen.immediate_text == "Restart bare metal, system should be restarted"
    assert fallen.applies_to == ("A100", "H100", "B100", "GB200")
    dbe = xids.lookup(48)
    assert dbe is not None and dbe.immediate == "WORKFLOW_XID_48"
    assert "w/ 63 or 64: DRAIN_AND_RESET" in dbe.immediate_text
    assert [xids.lookup(x).fault for x in (13, 31, 43, 45)] == ["application"] * 4  # type: ignore[union-attr]
    assert [xids.lookup(x).immediate for x in (94, 95)] == ["RESTART_APP", "RESET_GPU"]  # type: ignore[union-attr]
    gsp = xids.lookup(119)
    assert gsp is not None and gsp.fault == "software"
    assert xids.lookup(74).applies_to == ("A100", "H100")  # type: ignore[union-attr]


def test_an_xid_the_catalog_does_not_know_is_none():
    assert xids.lookup(999) is None
    assert xids.lookup(0) is None


def test_the_committed_catalog_is_what_the_generator_makes(tmp_path):
    out = tmp_path / "catalog.json"
    call_command("xid_catalog", "--from", str(CATALOG_DIR), "--output", str(out))
    generated = json.loads(out.read_text(encoding="utf-8"))
    assert generated == json.loads(xids.CATALOG_PATH.read_text(encoding="utf-8"))
    assert generated == xids.build_catalog(CATALOG_DIR)
    assert "RESET_GPU" in generated["buckets"]
