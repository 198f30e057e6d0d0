"""The gRPC code committed in gpuadmin/v1/ is what protos/generate.py makes of protos/ now."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_DIR


def test_the_committed_grpc_code_is_generated_from_the_protos(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "protos/generate.py", "--out", str(tmp_path)],
        cwd=REPO_DIR,
        check=True,
        capture_output=True,
        timeout=120,
    )
    generated = tmp_path / "gpuadmin" / "v1"
    committed = REPO_DIR / "gpuadmin" / "v1"
    names = sorted(path.name for path in generated.iterdir())
    assert names == sorted(path.name for path in committed.iterdir() if path.is_file()), (
        "gpuadmin/v1/ has other files than protos/ makes: run make protos"
    )
    stale = [
        name for name in names if (generated / name).read_bytes() != (committed / name).read_bytes()
    ]
    assert not stale, f"gpuadmin/v1/{', '.join(stale)} stale: run make protos and commit"
