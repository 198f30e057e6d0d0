"""Every environment variable the code reads is in the settings page's table
(docs/reference/settings.md) and in ``.env.example``."""

from __future__ import annotations

import ast
import re

from tests.conftest import APP_PACKAGES, REPO_DIR

ENV_FUNCTIONS = {
    "env_bool",
    "env_choice",
    "env_float",
    "env_int",
    "env_list",
    "env_rate",
    "env_str",
    "env_unix_user",
}


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def variables_read(source: str) -> set[str]:
    """Names passed as a string (or a module constant holding one) to ``env_*()``,
    ``os.environ.get()``, ``os.getenv()`` or read as ``os.environ[...]``."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    names = set()
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if (
                (isinstance(func, ast.Name) and func.id in ENV_FUNCTIONS)
                or (isinstance(func, ast.Attribute) and func.attr == "getenv")
                or (
                    isinstance(func, ast.Attribute)
                    and func.attr == "get"
                    and _is_environ(func.value)
                )
            ):
                key = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _is_environ(node.value)
        ):
            key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            names.add(key.value)
        elif isinstance(key, ast.Name) and key.id in constants:
            names.add(constants[key.id])
    return names


# Read by the simulator's stand-in for nvidia-cuda-mps-control (scheduling/agent/mps_standin.py) as
# NVIDIA's daemon reads them: the agent sets them per GPU; they are not gpuadmin settings.
NVIDIA_TOOLS_VARIABLES = {"CUDA_MPS_PIPE_DIRECTORY"}
# Read by the CLI as every terminal program reads them (docs/operations/cli.md): not gpuadmin
# settings.
TERMINAL_VARIABLES = {"TERM", "XDG_CONFIG_HOME"}
# Read inside a job by the Ray launcher (scheduling/agent/ray_launch.py): what the executor sets
# for the job (its GPUs, host memory, Ray token; docs/users/ray.md), not gpuadmin settings.
JOB_VARIABLES = {"CUDA_VISIBLE_DEVICES", "GPUADMIN_HOST_MEMORY_MIB", "RAY_AUTH_TOKEN", "PATH"}


def read_by_the_code() -> set[str]:
    return (
        {
            name
            for package in APP_PACKAGES
            for path in (REPO_DIR / package).rglob("*.py")
            for name in variables_read(path.read_text())
        }
        - NVIDIA_TOOLS_VARIABLES
        - TERMINAL_VARIABLES
        - JOB_VARIABLES
    )


def documented_settings() -> set[str]:
    """The backquoted names in the first column of the settings page's tables."""
    page = (REPO_DIR / "docs" / "reference" / "settings.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z0-9_]+)`", row.split(" | ")[0])}


def env_example() -> set[str]:
    text = (REPO_DIR / ".env.example").read_text()
    return set(re.findall(r"^(?:# )?([A-Z0-9_]+)=", text, re.MULTILINE))


def test_the_scan_finds_each_kind_of_read():
    source = (
        'A = env_int("ONE", 1)\nB = os.environ.get("TWO")\nC = os.environ["THREE"]\n'
        'NAME = "FOUR"\nD = os.environ.get(NAME)\nos.environ["NOT_A_READ"] = "x"\n'
        'E = os.getenv("FIVE")\n'
    )
    assert variables_read(source) == {"ONE", "TWO", "THREE", "FOUR", "FIVE"}


def test_settings_module_reads_are_found():
    found = variables_read((REPO_DIR / "gpuadmin" / "settings.py").read_text())
    assert {"DATABASE_URL", "GPUADMIN_NVML", "LOG_LEVEL"} <= found


def test_every_variable_read_is_in_the_readme_table():
    assert read_by_the_code() - documented_settings() == set()


def test_every_variable_read_is_in_env_example():
    assert read_by_the_code() - env_example() == set()
