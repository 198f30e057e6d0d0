"""The Content-Security-Policy header on every response (Django 5.2 has no CSP of its own).

The policy (``settings.CONTENT_SECURITY_POLICY``) allows only this origin's files: no inline
or evaluated script, no inline ``<style>``; the pages load htmx and their scripts from
``static/``, and htmx is configured to need neither (``templates/_base.html``).
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


def policy(directives: dict[str, list[str]]) -> str:
    """``{"default-src": ["'self'"], ...}`` as the header's value."""
    return "; ".join(" ".join([name, *sources]) for name, sources in directives.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.value = policy(settings.CONTENT_SECURITY_POLICY)

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        response.headers.setdefault(HEADER, self.value)
        return response
