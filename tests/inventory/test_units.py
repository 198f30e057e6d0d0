"""How every page, the CLI and the engine's reasons write memory sizes and durations."""

from __future__ import annotations

import pytest

from inventory.units import duration_text, memory_text


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "–"),
        (0, "0 s"),
        (45, "45 s"),
        (125, "2 min 5 s"),
        (3600, "1 h"),
        (5400, "1 h 30 min"),
        (86400, "1 day"),
        (90000, "1 day 1 h"),
        (7 * 86400, "7 days"),
        (3599.6, "1 h"),
    ],
)
def test_a_duration_in_its_two_largest_units(seconds, text):
    assert duration_text(seconds) == text


@pytest.mark.parametrize(
    ("mib", "text"),
    [
        (8000, "8000 MiB"),  # an MPS limit as it was set, never "7.8 GB"
        (1536, "1536 MiB"),
        (81559, "81559 MiB"),  # an H100's total, as nvidia-smi prints it
        (40960, "40 GiB"),
        (81920, "80 GiB"),
        (1031660, "1007.5 GiB"),  # a DGX A100's MemTotal
        (2 * 1024 * 1024, "2 TiB"),
        (1024 * 1024 + 512, "1024.5 GiB"),
    ],
)
def test_memory_in_binary_units_exact_as_nvidia_smi_below_100_gib(mib, text):
    assert memory_text(mib) == text
