"""The documentation site under ``/docs/``, from the files ``make docs`` builds
(``settings.GPUADMIN_DOCS_DIR``), so that a lab's users read it on their own server.

WhiteNoise serves it as it serves the static files: from a table of the files made at
start-up, with the same caching headers and the precompressed copies where the Docker image
made them; ``/docs/x/`` is ``x/index.html``. Material's pages run a few inline scripts of
their own (the page's depth, the colour scheme): each page is sent with the app's
Content-Security-Policy (``gpuadmin.csp``) plus the hashes of its own inline scripts, computed
when the table is made, and nothing else is allowed. A URL under ``/docs/`` that the table does
not hold reaches ``not_served`` (the URLconf's ``docs``): the 404 page, which says how to build
the site when there is none.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from wsgiref.headers import Headers

from django.conf import settings
from django.core.exceptions import MiddlewareNotUsed
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.views.decorators.http import require_safe
from whitenoise.middleware import WhiteNoiseMiddleware

from gpuadmin import csp

UNBUILT = (
    "The documentation site has not been built. Run `make docs` in gpuadmin's source folder "
    "(it builds site/), or set GPUADMIN_DOCS_DIR to a built site, then restart the server."
)
# The <script> types a browser runs; Material's configuration is an application/json block.
RUNNABLE_SCRIPT_TYPES = {None, "", "text/javascript", "module"}


def is_built(site: Path) -> bool:
    return (site / "index.html").is_file()


class _InlineScripts(HTMLParser):
    """The text of each inline ``<script>`` of a page that a browser runs."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self._chunks: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if (
            tag == "script"
            and "src" not in attributes
            and attributes.get("type") in RUNNABLE_SCRIPT_TYPES
        ):
            self._chunks = []

    def handle_data(self, data: str) -> None:
        if self._chunks is not None:
            self._chunks.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._chunks is not None:
            self.scripts.append("".join(self._chunks))
            self._chunks = None


def page_policy(html: str) -> str:
    """The app's Content-Security-Policy, its ``script-src`` extended by the hash of each of
    ``html``'s inline scripts."""
    parser = _InlineScripts()
    parser.feed(html)
    parser.close()
    hashes = [
        f"'sha256-{base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()}'"
        for script in dict.fromkeys(parser.scripts)
    ]
    directives = dict(settings.CONTENT_SECURITY_POLICY)
    directives["script-src"] = [*directives["script-src"], *hashes]
    return csp.policy(directives)


def add_page_policy(headers: Headers, path: str, url: str) -> None:
    """WhiteNoise's ``add_headers_function``: a page's own policy (``ContentSecurityPolicy
    Middleware`` leaves a policy already set)."""
    if path.endswith(".html"):
        headers[csp.HEADER] = page_policy(Path(path).read_text(encoding="utf-8"))


class _SiteOnlySettings:
    """Django's settings as ``WhiteNoiseMiddleware`` reads them (max age, autorefresh,
    charset), for an instance that serves the site alone: no static files, ``index.html``
    for a folder's URL, each page with its policy."""

    OVERRIDES: dict[str, Any] = {
        "STATIC_ROOT": None,
        "WHITENOISE_ROOT": None,
        "WHITENOISE_USE_FINDERS": False,
        "WHITENOISE_INDEX_FILE": True,
        "WHITENOISE_ADD_HEADERS_FUNCTION": add_page_policy,
    }

    def __getattr__(self, name: str) -> Any:
        if name in self.OVERRIDES:
            return self.OVERRIDES[name]
        return getattr(settings, name)


class DocsSiteMiddleware(WhiteNoiseMiddleware):
    """Serves the built site under the ``docs`` URL; not used when there is none."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        site = Path(settings.GPUADMIN_DOCS_DIR)
        if not is_built(site):
            raise MiddlewareNotUsed(f"no documentation site in {site}")
        super().__init__(get_response, settings=_SiteOnlySettings())
        self.add_files(str(site), prefix=reverse("docs"))


@require_safe
def not_served(request: HttpRequest, page: str = "") -> HttpResponse:
    """A URL under ``/docs/`` that the site does not have, or every one when it has not
    been built: the 404 page, saying which."""
    if is_built(Path(settings.GPUADMIN_DOCS_DIR)):
        raise Http404(f"The documentation has no page at {request.path}.")
    raise Http404(UNBUILT)
