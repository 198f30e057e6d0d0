"""Whatever they are given, the nvidia-smi parsers return a result or raise their ParseError.

Inputs are real captures cut, spliced and sprinkled with random text, plus plain random text
(and bytes for the XML parser, which accepts them). Any other exception (IndexError, an int()
ValueError, OverflowError, RecursionError, an XML library error) fails the test.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inventory.nvml.parsers import (
    ParseError,
    parse_gpu_list,
    parse_mig_ci_profiles,
    parse_mig_compute_instances,
    parse_mig_gi_profiles,
    parse_mig_gpu_instances,
    parse_mig_placements,
    parse_query_csv,
    parse_smi_text,
    parse_smi_xml,
    parse_topo_matrix,
    parse_xid_log,
    split_capture_bundle,
)
from tests.nvml.captures import OWN, REAL

FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _captures(*patterns: str) -> list[str]:
    """Real captures (shared fixtures and this repository's excerpts) matching the globs."""
    found = {
        path
        for root in (REAL, OWN)
        for pattern in patterns
        for path in root.glob(pattern)
        if path.is_file() and not path.name.endswith(".source.txt")
    }
    return [path.read_text(errors="replace") for path in sorted(found)] or ["GPU0\tX\n"]


# Text the parsers care about, so random splices land on their grammar more often than chance.
TOKENS = st.sampled_from(
    [
        "GPU0",
        "GPU 0: ",
        "X",
        "NV12",
        "SYS",
        "0-99999999999",
        "9" * 5000,
        "-" * 3,
        "NVRM: Xid (PCI:0000:8a:00): ",
        "MIG 1g.10gb",
        "| 0  MIG 1g.5gb  19  7/7  4.75  No  14  0  0 |",
        "Placements: {0,1,2}:1",
        "<gpu>",
        "</gpu>",
        "<nvidia_smi_log>",
        " : ",
        "N/A",
        "[Not Supported]",
        "#" * 80,
        "# $ nvidia-smi -q\n",
        "\t",
        "\n",
        "\x00",
        "\ud800",
        "٣",
        ",",
        '"',
        "MiB",
        " W",
    ]
)


@st.composite
def mutated(draw: st.DrawFn, sources: list[str]) -> str:
    """A real capture with a few random edits: cut, duplicated, spliced or truncated."""
    text = draw(st.sampled_from(sources))
    for _ in range(draw(st.integers(0, 6))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 400)))
        edit = draw(st.sampled_from(("delete", "duplicate", "insert", "token", "truncate")))
        if edit == "delete":
            text = text[:start] + text[end:]
        elif edit == "duplicate":
            text = text[:end] + text[start:end] * draw(st.integers(1, 50)) + text[end:]
        elif edit == "insert":
            text = text[:start] + draw(st.text(max_size=40)) + text[start:]
        elif edit == "token":
            text = text[:start] + draw(TOKENS) * draw(st.integers(1, 3)) + text[start:]
        else:
            text = text[:start]
    return text


def _inputs(*patterns: str) -> st.SearchStrategy[str]:
    return st.one_of(
        mutated(_captures(*patterns)),
        st.text(max_size=2000),
        st.lists(st.one_of(TOKENS, st.text(max_size=20)), max_size=60).map("".join),
    )


def _parses_or_refuses(parser: Callable[[Any], object], document: Any) -> None:
    try:
        parser(document)
    except ParseError as exc:
        assert str(exc), "a ParseError says what is wrong"


XML = _captures("nvidia-smi-q-xml/*.xml", "*.xml")
TEXT_PARSERS: list[tuple[Callable[[str], object], tuple[str, ...]]] = [
    (parse_smi_text, ("nvidia-smi-q-text/*", "smi-q__*")),
    (parse_topo_matrix, ("topo/*", "*topo-m*")),
    (parse_mig_gi_profiles, ("mig/*lgip*",)),
    (parse_mig_ci_profiles, ("mig/*lcip*",)),
    (parse_mig_placements, ("mig/*", "capture-bundles/*h100-mig*")),
    (parse_mig_gpu_instances, ("mig/*lgi*",)),
    (parse_mig_compute_instances, ("mig/*lci*",)),
    (parse_query_csv, ("query-csv/*.csv",)),
    (parse_xid_log, ("xid-logs/*", "xid__*")),
    (split_capture_bundle, ("capture-bundles/*.txt",)),
    (parse_gpu_list, ("mig/*-L-*", "capture-bundles/*h200-mig*")),
]


@pytest.mark.parametrize(
    ("parser", "patterns"), TEXT_PARSERS, ids=[parser.__name__ for parser, _ in TEXT_PARSERS]
)
def test_text_parsers_return_or_raise_their_parse_error(
    parser: Callable[[str], object], patterns: tuple[str, ...]
) -> None:
    @FUZZ
    @given(document=_inputs(*patterns))
    def check(document: str) -> None:
        _parses_or_refuses(parser, document)

    check()


@FUZZ
@given(document=st.one_of(mutated(XML), st.text(max_size=2000)))
def test_smi_xml_text_returns_or_raises_parse_error(document: str) -> None:
    _parses_or_refuses(parse_smi_xml, document)


@FUZZ
@given(
    document=st.one_of(
        mutated(XML).map(lambda text: text.encode("utf-8", "surrogatepass")),
        st.binary(max_size=2000),
        st.binary(max_size=200).map(lambda junk: b"<?xml version='1.0'?><nvidia_smi_log>" + junk),
    )
)
def test_smi_xml_bytes_return_or_raise_parse_error(document: bytes) -> None:
    _parses_or_refuses(parse_smi_xml, document)


@pytest.mark.parametrize(
    ("parser", "document"),
    [
        (
            parse_smi_xml,
            "<nvidia_smi_log>" + "<gpu>" * 100_000 + "</gpu>" * 100_000 + "</nvidia_smi_log>",
        ),
        (
            parse_smi_text,
            "GPU 00000000:01:00.0\n    Clocks Event Reasons\n"
            + "".join(" " * (8 + depth) + f"Reason {depth} : Active\n" for depth in range(5000)),
        ),
        (parse_smi_xml, '<?xml version="1.0" encoding="no-such-codec"?><nvidia_smi_log/>'),
        (parse_smi_xml, "\ud800<nvidia_smi_log/>"),
        (parse_xid_log, f"NVRM: Xid (PCI:0000:8a:00): {'9' * 5000}, pid=1, name=x, boom"),
        (parse_mig_gpu_instances, f"|   {'9' * 5000}  MIG 1g.5gb   19   13   6:1  |"),
        (parse_gpu_list, f"GPU {'9' * 5000}: NVIDIA A100 (UUID: GPU-1)"),
        (parse_query_csv, f"memory.total [MiB], power.draw [W]\n{'9' * 400} MiB, {'9' * 400} W"),
    ],
    ids=[
        "xml-deeply-nested",
        "text-deeply-indented",
        "xml-unknown-encoding",
        "xml-lone-surrogate",
        "xid-number-of-5000-digits",
        "mig-id-of-5000-digits",
        "listing-index-of-5000-digits",
        "csv-infinite-quantities",
    ],
)
def test_hostile_documents_return_or_raise_parse_error(
    parser: Callable[[str], object], document: str
) -> None:
    """Each once raised something else: RecursionError, UnicodeEncodeError, int()'s ValueError
    past 4300 digits, OverflowError rounding an infinite float."""
    _parses_or_refuses(parser, document)


def test_topo_cpu_list_of_absurd_size_is_refused_not_expanded() -> None:
    """A cpulist such as ``0-99999999999`` once made the parser build a set of 10^11 ints."""
    header = "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\n"
    text = header + "GPU0\t X \tNV12\t0-999999\t0\nGPU1\tNV12\t X \t0-63\t0-999999\n"
    gpu0, gpu1 = parse_topo_matrix(text).devices
    assert (gpu0.cpus, gpu0.numa_node) == (None, 0)
    assert (gpu1.cpus, gpu1.numa_nodes) == (tuple(range(64)), None)
