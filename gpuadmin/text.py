"""Text PostgreSQL cannot store, and the middleware that refuses it in URLs.

PostgreSQL refuses a NUL character in any text (and in ``jsonb``), and a lone surrogate cannot
be encoded as UTF-8: either would reach the database as a ``DataError`` (a 500). In bodies the
API's JSON parser (``gpuadmin.parsers``), form and serializer fields and the job service refuse
such text; lookups (a path's ``<hostname>``, a query's ``?node=``) are refused here, once for
every page and endpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse


def unstorable(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (in DRF's words), or None when it can."""
    if "\x00" in value:
        return "Null characters are not allowed."
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        return f"Surrogate characters are not allowed: U+{ord(value[exc.start]):X}."
    return None


def is_api_view(view_func: Callable[..., Any]) -> bool:
    # DRF's as_view() (APIView's and viewsets') marks the views it makes with ``cls``;
    # importing rest_framework.views here would be circular (DRF's settings import the parser).
    return hasattr(view_func, "cls")


class StorableTextMiddleware:
    """A path argument that cannot be stored is a 404 (nothing can be named so); a query
    parameter, name or value, a 400 naming it: JSON ``{"<param>": ["..."]}`` for the API, a
    plain-text page otherwise. It reads the query first, so Django's refusal of too many
    parameters is the API's JSON 400 here too."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., Any],
        view_args: tuple[Any, ...],
        view_kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        api = is_api_view(view_func)
        for value in [*view_args, *view_kwargs.values()]:
            if isinstance(value, str) and unstorable(value):
                if api:
                    return JsonResponse({"detail": "Not found."}, status=404)
                raise Http404("No such object.")
        try:
            query = request.GET.lists()
        except SuspiciousOperation as exc:  # more than DATA_UPLOAD_MAX_NUMBER_FIELDS
            if not api:
                raise  # Django's 400 page, logged as Django logs it
            logging.getLogger(f"django.security.{type(exc).__name__}").warning("%s", exc)
            return JsonResponse({"detail": str(exc)}, status=400)
        for name, values in query:
            problem = next(filter(None, map(unstorable, [name, *values])), None)
            if problem is None:
                continue
            if unstorable(name) is None:
                body: dict[str, Any] = {name: [problem]}
                text = f"{name}: {problem}"
            else:
                text = f"A query parameter's name: {problem}"
                body = {"detail": text}
            if api:
                return JsonResponse(body, status=400)
            return HttpResponseBadRequest(text + "\n", content_type="text/plain")
        return None
