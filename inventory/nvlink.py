"""NVLink domains: the sets of a node's GPUs in which every pair is joined by NVLink. The
one definition: the placement loop gives them to the engine, and the job services read them to
refuse a request no domain could ever hold."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from django.contrib.postgres.aggregates import StringAgg
from django.db.models import TextField, Value
from django.db.models.functions import Cast, Concat

from inventory.models import GpuLink


class GpuPlace(NamedTuple):
    """Where a GPU sits: all that its NVLink domain depends on, with its links."""

    pk: int
    node_id: int
    # Shadows tuple.index on purpose (the column's name): legal at runtime, refused by mypy.
    index: int  # type: ignore[assignment]
    hostname: str


def nvlink_domains(places: Sequence[GpuPlace]) -> Mapping[int, str]:
    """GPU pk -> its NVLink domain: GPUs of one node in which every pair is joined by NVLink
    (all of them behind NVSwitch on a DGX A100/H100, a quad of a DGX-1's hybrid cube mesh, a
    bridged pair), named after the node and its lowest GPU index. GPUs without NVLink have none.

    A mesh without NVSwitch is connected without every pair being linked (a DGX-1's GPU 0 and
    GPU 5 are SYS apart), so domains are cliques, grown in index order: a DGX-1 splits into
    GPUs 0-3 and 4-7, both fully linked.

    The NVLink pairs are read as one text ("a-b,c-d,..."), and the domains of the previous
    call are returned again when that text and ``places`` are equal: links change only when
    discovery rewrites a node's, and building the cliques of tens of thousands of links costs
    a pass tens of milliseconds."""
    global _domains
    pairs = GpuLink.objects.filter(link_type__startswith="NV").aggregate(
        pairs=StringAgg(
            Concat(
                Cast("gpu_a_id", TextField()),
                Value("-"),
                Cast("gpu_b_id", TextField()),
                output_field=TextField(),
            ),
            ",",
        )
    )["pairs"]
    key = (pairs or "", tuple(places))
    if _domains is not None and _domains[0] == key:
        return _domains[1]
    peers: dict[int, set[int]] = defaultdict(set)
    for pair in pairs.split(",") if pairs else ():
        first, _, second = pair.partition("-")
        a, b = int(first), int(second)
        peers[a].add(b)
        peers[b].add(a)
    cliques: dict[int, list[list[GpuPlace]]] = defaultdict(list)
    for gpu in sorted(places, key=lambda gpu: (gpu.node_id, gpu.index)):
        linked = peers.get(gpu.pk)
        if not linked:
            continue
        node_cliques = cliques[gpu.node_id]
        clique = next((c for c in node_cliques if all(m.pk in linked for m in c)), None)
        if clique is None:
            node_cliques.append([gpu])
        else:
            clique.append(gpu)
    domains: dict[int, str] = {}
    for node_cliques in cliques.values():
        for clique in node_cliques:
            name = f"{clique[0].hostname}/nvlink-gpu{clique[0].index}"
            domains.update((gpu.pk, name) for gpu in clique)
    _domains = (key, MappingProxyType(domains))
    return _domains[1]


# The NVLink domains of the last call, with what they were computed from.
_domains: tuple[tuple[str, tuple[GpuPlace, ...]], Mapping[int, str]] | None = None
