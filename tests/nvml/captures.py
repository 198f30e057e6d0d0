"""Where the real nvidia-smi captures live (../shared/fixtures/real beside the checkout), and
the small verbatim excerpts kept in this repository (tests/nvml/captures/, each with a sibling
``.source.txt``) for classes of machine the shared set lacks."""

from pathlib import Path

import pytest

from tests.conftest import SHARED_DIR

REAL = SHARED_DIR / "fixtures" / "real"
needs_real_captures = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"real fixtures not found at {REAL}"
)
OWN = Path(__file__).with_name("captures")
