"""Generate gpuadmin's gRPC code from the .proto files beside this script.

``python protos/generate.py`` (``make protos``) writes the modules into ``gpuadmin/v1/`` (the
proto package ``gpuadmin.v1`` is that Python package); ``--out DIR`` writes them under ``DIR``
instead, which is how ``tests/gpuadmin/test_grpc_protos.py`` checks that the committed ones are
current. Needs ``grpcio-tools`` (the dev extra).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def generate(out: Path) -> list[Path]:
    """Write the modules of every ``protos/gpuadmin/v1/*.proto`` under ``out``; their paths."""
    from grpc_tools import protoc  # the dev extra

    protos = sorted(HERE.glob("gpuadmin/v1/*.proto"))
    package = out / "gpuadmin" / "v1"
    package.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"--proto_path={HERE}",
        f"--proto_path={Path(protoc.__file__).parent / '_proto'}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(proto.relative_to(HERE)) for proto in protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    init = package / "__init__.py"
    init.write_text('"""Generated from protos/gpuadmin/v1/*.proto by protos/generate.py."""\n')
    return sorted(package.iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT, help="default: the repository")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path, file=sys.stderr)  # noqa: T201


if __name__ == "__main__":
    main()
