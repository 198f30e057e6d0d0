"""Where the real nvidia-smi captures live (../shared/fixtures/real beside the checkout)."""

import pytest

from tests.conftest import SHARED_DIR

REAL = SHARED_DIR / "fixtures" / "real"
needs_real_captures = pytest.mark.skipif(
    not REAL.is_dir(), reason=f"real fixtures not found at {REAL}"
)
