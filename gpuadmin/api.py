"""What every app's API shares."""

from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    """``?limit=`` (default 100, at most 1,000) and ``?offset=`` on every list endpoint."""

    default_limit = 100
    max_limit = 1000
