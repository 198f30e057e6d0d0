"""The architecture page (docs/development/architecture.md) matches the code: its module map
names every module of the four packages and nothing else, every signal, registry hook and Celery
task is on it, and every module or name it writes in backticks exists."""

from __future__ import annotations

import ast
import importlib
import re
from collections import Counter
from pathlib import Path

from gpuadmin.celery import app
from tests.conftest import APP_PACKAGES, REPO_DIR

PAGE = REPO_DIR / "docs" / "development" / "architecture.md"
MAP_ROW = re.compile(r"^\| `([^`]+)` \|", re.MULTILINE)
CODE = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
DOTTED = re.compile(rf"^(?:{'|'.join(APP_PACKAGES)})(?:\.\w+)+$")
PATH = re.compile(rf"^(?:{'|'.join(APP_PACKAGES)})/[\w./-]*$")


def page_text() -> str:
    return PAGE.read_text()


def section(text: str, title: str) -> str:
    """The page's "## <title>" section, up to the next section of its level."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def source_files() -> list[Path]:
    """The Python files of the four packages, migrations aside."""
    return [
        path
        for package in APP_PACKAGES
        for path in (REPO_DIR / package).rglob("*.py")
        if "migrations" not in path.relative_to(REPO_DIR).parts
    ]


def dotted_name(path: Path) -> str:
    return path.relative_to(REPO_DIR).with_suffix("").as_posix().replace("/", ".")


def defines_something(path: Path) -> bool:
    """Whether a module holds more than its docstring."""
    body = ast.parse(path.read_text()).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def modules() -> set[str]:
    """Every module of the four packages as the map names it: ``app/sub/module.py``, or
    ``app/sub/`` for a package's ``__init__.py`` that defines something. Migrations aside."""
    found = set()
    for path in source_files():
        relative = path.relative_to(REPO_DIR)
        if path.name != "__init__.py":
            found.add(relative.as_posix())
        elif defines_something(path):
            found.add(f"{relative.parent.as_posix()}/")
    return found


def named_in_map() -> list[str]:
    return MAP_ROW.findall(section(page_text(), "Module map"))


def test_every_module_is_in_the_map() -> None:
    missing = sorted(modules() - set(named_in_map()))
    assert not missing, f"add to the module map of {PAGE.name}: {missing}"


def test_the_map_names_only_modules_that_exist() -> None:
    def exists(entry: str) -> bool:
        path = REPO_DIR / entry
        if entry.split("/", 1)[0] not in APP_PACKAGES or "migrations" in path.parts:
            return False
        if entry.endswith("/"):
            return (path / "__init__.py").is_file()
        return entry.endswith(".py") and path.is_file()

    gone = [entry for entry in named_in_map() if not exists(entry)]
    assert not gone, f"the module map of {PAGE.name} names modules that do not exist: {gone}"


def test_the_map_names_each_module_once() -> None:
    twice = [entry for entry, count in Counter(named_in_map()).items() if count > 1]
    assert not twice, twice


def module_file(dotted: str) -> Path | None:
    path = REPO_DIR.joinpath(*dotted.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def top_level_names(body: list[ast.stmt]) -> set[str]:
    """What a module or class body defines or imports."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def resolves(dotted: str) -> bool:
    """Whether ``app.module.name`` (or ``app.module.Class.method``) is defined: the longest
    prefix that is a module, then a name it defines, then a name in that class's body."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        if (path := module_file(".".join(parts[:split]))) is not None:
            break
    else:
        return False
    rest = parts[split:]
    if not rest:
        return True
    tree = ast.parse(path.read_text())
    if rest[0] not in top_level_names(tree.body):
        return False
    if len(rest) == 1:
        return True
    classes = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    return any(node.name == rest[0] and rest[1] in top_level_names(node.body) for node in classes)


def names_in_code() -> set[str]:
    return set(CODE.findall(FENCED.sub("", page_text())))


def tasks_in_code() -> dict[str, str]:
    """Every Celery task's name and the module that defines it, as Celery registered them once
    the modules that call ``shared_task`` are imported (a name may be a constant)."""
    defining = {dotted_name(path) for path in source_files() if "@shared_task" in path.read_text()}
    for module in defining:
        importlib.import_module(module)
    return {
        name: f"{task.__module__.replace('.', '/')}.py"
        for name, task in app.tasks.items()
        if task.__module__ in defining
    }


def tasks_on_page() -> dict[str, str]:
    """The Celery tasks table: each task's name and the module it names."""
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", section(page_text(), "Celery tasks"), re.M)
    return dict(rows)


def test_every_celery_task_is_on_the_page() -> None:
    in_code = tasks_in_code()
    assert in_code, "no task found: the test no longer finds them"
    assert tasks_on_page() == in_code, f"the Celery tasks of {PAGE.name} differ from the code"


def test_dotted_names_on_the_page_exist() -> None:
    tasks = tasks_in_code()
    gone = sorted(
        name
        for name in names_in_code()
        if DOTTED.match(name) and name not in tasks and not resolves(name)
    )
    assert not gone, f"{PAGE.name} names what the code no longer defines: {gone}"


def test_paths_on_the_page_exist() -> None:
    gone = sorted(
        name
        for name in names_in_code()
        if PATH.match(name) and not (REPO_DIR / name.rstrip("/")).exists()
    )
    assert not gone, f"{PAGE.name} names paths that do not exist: {gone}"


def defined_by_call(path: Path, callee: str) -> set[str]:
    """The module-level names assigned a call of ``callee`` (``Signal()``, ``Hook(...)``)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        value, targets = None, []
        if isinstance(node, ast.Assign):
            value, targets = node.value, node.targets
        elif isinstance(node, ast.AnnAssign):
            value, targets = node.value, [node.target]
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == callee
        ):
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return names


def test_every_signal_is_on_the_page() -> None:
    signals = {
        f"{dotted_name(path)}.{name}"
        for path in source_files()
        for name in defined_by_call(path, "Signal")
    }
    assert signals, "no signal found: the test no longer finds them"
    table = section(page_text(), "Signals")
    missing = sorted(signal for signal in signals if f"| `{signal}` " not in table)
    assert not missing, f"add to the signals of {PAGE.name}: {missing}"


def test_every_registry_hook_is_on_the_page() -> None:
    hooks = defined_by_call(REPO_DIR / "gpuadmin" / "registry.py", "Hook")
    assert hooks, "no hook found: the test no longer finds them"
    table = section(page_text(), "Registry hooks")
    missing = sorted(hook for hook in hooks if f"| `{hook}` " not in table)
    assert not missing, f"add to the registry hooks of {PAGE.name}: {missing}"
