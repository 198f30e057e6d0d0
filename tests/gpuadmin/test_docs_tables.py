"""The site's tables as Python-Markdown reads them: a ``|`` inside a code span is text, so
``\\|`` there would show its backslash on the page."""

from tests.conftest import REPO_DIR
from tests.gpuadmin.markdown_tables import CODE_SPAN, cells


def test_cells_end_at_bars_outside_code_spans():
    assert cells("| `a|b` | c \\| d |") == ["`a|b`", "c \\| d"]


def test_no_code_span_in_a_table_escapes_a_bar():
    escaped = [
        f"{path.relative_to(REPO_DIR)}: {span}"
        for path in sorted((REPO_DIR / "docs").rglob("*.md"))
        for line in path.read_text().splitlines()
        if line.startswith("|")
        for span in CODE_SPAN.findall(line)
        if "\\|" in span
    ]
    assert escaped == []
