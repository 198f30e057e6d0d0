"""Scan simulated nodes and sync them into the catalog, without starting agents."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from inventory.choices import NvmlBackend
from inventory.nvml import open_backend, scan
from inventory.nvml.sim import list_models, load_fleet
from inventory.services import apply_discovery, register_node

ACTOR = "load_fleet"


class Command(BaseCommand):
    help = (
        "Sync simulated nodes into the catalog: --sim MODEL[,MODEL...] [--nodes N] names them "
        "MODEL-01..MODEL-N; --fleet FILE takes the nodes of a fleet spec."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--sim", help="comma-separated machine models")
        source.add_argument("--fleet", help="a fleet spec JSON (e.g. gpuadmin/demo_fleet.json)")
        parser.add_argument("--nodes", type=int, default=1, help="nodes per model (with --sim)")

    def handle(self, *args: Any, **options: Any) -> None:
        state_dir = str(settings.GPUADMIN_SIM_STATE_DIR)
        for hostname, model, backend in self._nodes(options, state_dir):
            result = scan(backend)
            if result.system.error:
                raise CommandError(f"{hostname}: {result.system.error}")
            register_node(
                hostname,
                model=model,
                agent_version=ACTOR,
                nvml_backend=NvmlBackend.SIM,
                actor_name=ACTOR,
            )
            plan = apply_discovery(hostname, result, actor_name=ACTOR)
            self.stdout.write(
                f"{hostname}: {len(result.gpus)} GPUs, {len(plan.changes)} changes recorded"
            )

    def _nodes(self, options: dict[str, Any], state_dir: str) -> Iterator[tuple[str, str, Any]]:
        if options["fleet"]:
            try:
                nodes = load_fleet(options["fleet"])
            except (OSError, ValueError, KeyError) as exc:
                raise CommandError(f"--fleet {options['fleet']}: {exc}") from exc
            for node in nodes:
                backend = open_backend(
                    "sim", sim_fleet=options["fleet"], node_name=node.name, state_dir=state_dir
                )
                model = node.model if isinstance(node.model, str) else node.model["name"]
                yield node.name, model, backend
            return
        if options["nodes"] < 1:
            raise CommandError("--nodes must be at least 1")
        models = [model.strip() for model in options["sim"].split(",") if model.strip()]
        unknown = sorted(set(models) - set(list_models()))
        if unknown:
            raise CommandError(
                f"--sim: unknown machine model(s) {', '.join(unknown)}; "
                f"known: {', '.join(list_models())}"
            )
        for model in models:
            for number in range(1, options["nodes"] + 1):
                hostname = f"{model}-{number:02d}"
                yield (
                    hostname,
                    model,
                    open_backend("sim", sim_model=model, node_name=hostname, state_dir=state_dir),
                )
