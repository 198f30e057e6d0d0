"""Every route of the URLconf is documented in the endpoints page (docs/reference/api.md), in
the first cell of a row of its tables: the pages (and the forms they post to) under "Pages",
the API's endpoints in the other sections' tables, none in both; and every path those cells
name is a route."""

from __future__ import annotations

import re

from rest_framework.views import APIView

from tests.conftest import REPO_DIR
from tests.gpuadmin.markdown_tables import CODE_SPAN, cells
from tests.gpuadmin.urlconf import ADMIN_PREFIX, routes

PAGE = REPO_DIR / "docs" / "reference" / "api.md"
PAGES_HEADING = "## Pages"

PARAMETER = re.compile(r"\(\?P<\w+>[^)]*\)|<[^>]*>")
METHOD = re.compile(r"^(?:(?:GET|POST|PUT|PATCH|DELETE),? )+")


def template(path: str) -> str:
    """One spelling of a path for both sides: every parameter is ``<>`` (``jobs/<int:pk>/``,
    a router's ``^jobs/(?P<pk>[^/.]+)/$`` and the page's ``/jobs/<id>/`` are ``/jobs/<>/``),
    without a query string, from ``/``."""
    path = PARAMETER.sub("<>", path.replace("^", "").replace("$", ""))
    return "/" + path.split("?")[0].lstrip("/")


def documented(page: str) -> dict[str, list[str]]:
    """Each path the first cells of the page's tables name, with the section of each table
    that names it (``Pages`` or ``API``)."""
    found: dict[str, list[str]] = {}
    section = "API"
    for line in page.splitlines():
        if line.startswith("## "):
            section = "Pages" if line == PAGES_HEADING else "API"
        if not line.startswith("| `"):
            continue
        for span in CODE_SPAN.findall(cells(line)[0]):
            path = METHOD.sub("", span)
            if path.startswith("/"):
                found.setdefault(template(path), []).append(section)
    return found


def served() -> set[str]:
    """The routes, the Django admin's as one (``/admin/``)."""
    return {template(route) for route in [*routes(), ADMIN_PREFIX]}


def test_both_spellings_meet():
    assert template("api/v1/^jobs/(?P<pk>[^/.]+)/cancel/$") == "/api/v1/jobs/<>/cancel/"
    assert template("gpus/<str:uuid>/mig/<int:gi_id>/destroy/") == "/gpus/<>/mig/<>/destroy/"
    assert template("/fairshare/?pool=<name>") == template("fairshare/")
    page = (
        "## Pages\n| `/jobs/<id>/`, `POST /jobs/<id>/cancel/` | a job |\n"
        "## API\n| `GET`, `PUT /x/` | x, not `/y/` |\n"
    )
    assert documented(page) == {
        "/jobs/<>/": ["Pages"],
        "/jobs/<>/cancel/": ["Pages"],
        "/x/": ["API"],
    }


def test_every_route_is_documented():
    assert sorted(served() - set(documented(PAGE.read_text()))) == []


def test_every_documented_path_is_a_route():
    assert sorted(set(documented(PAGE.read_text())) - served()) == []


def test_each_route_is_in_one_section():
    """A route's rows are all in the pages table, or all in the API's tables."""
    sections = documented(PAGE.read_text())
    assert sorted(path for path, found in sections.items() if len(set(found)) > 1) == []


def test_the_pages_table_holds_no_api_endpoint():
    pages = {path for path, found in documented(PAGE.read_text()).items() if "Pages" in found}
    api = {
        template(route)
        for route, pattern in routes().items()
        if issubclass(getattr(pattern.callback, "cls", object), APIView)
    }
    assert sorted(pages & api) == []
