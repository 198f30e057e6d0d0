"""Django's messages (the pages' one-time notices) set up for the pages only."""

from __future__ import annotations

from django.contrib.messages.middleware import MessageMiddleware
from django.http import HttpRequest

from gpuadmin.api import is_api_path


class PageMessageMiddleware(MessageMiddleware):
    """``MessageMiddleware`` for the pages: an API request (``is_api_path``) neither adds nor
    shows a message, and skips the storage Django builds for every request (a cookie and a
    session store: about 2 % of a job submission's CPU). Django's ``process_response`` leaves
    a request without storage alone, so a page's pending message waits for the next page."""

    def process_request(self, request: HttpRequest) -> None:
        if not is_api_path(request):
            super().process_request(request)
