"""Regenerate ``health/data/xid_catalog.json`` from NVIDIA's XID catalog (CSV exports)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from health import xids


class Command(BaseCommand):
    help = (
        "Regenerate the XID catalog (health/data/xid_catalog.json) from a folder holding the "
        f"CSV exports {xids.XIDS_CSV}, {xids.BUCKETS_CSV}, {xids.NVLINK5_CSV} and "
        f"{xids.NVSENTINEL_CSV} (e.g. ../shared/fixtures/real/xid-catalog)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="folder", required=True, help="the CSV folder")
        parser.add_argument("--output", default=str(xids.CATALOG_PATH), help="the JSON file")

    def handle(self, *args: Any, **options: Any) -> None:
        folder = Path(options["folder"])
        try:
            count = xids.write_catalog(folder, Path(options["output"]))
        except (OSError, ValueError, IndexError) as exc:
            raise CommandError(f"cannot read the catalog in {folder}: {exc}") from exc
        self.stdout.write(f"{count} XIDs written to {options['output']}")
