"""The CLI's side of the HTTP API: one request with the caller's token, the server's refusal as
one line, and the frame every API verb runs in (exit status, Ctrl-C, a closed pipe).

Standard library only, and no Django: the API verbs (``gpuadmin status``, ``gpuadmin jobs``
...) run on any machine that reaches the web server and start in a tenth of a second.
``GPUADMIN_URL`` (default ``http://127.0.0.1:8000``) and ``GPUADMIN_TOKEN`` (an API token) come
from the environment, else from the credentials ``gpuadmin login`` keeps (docs/operations/cli.md).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import urlencode

DEFAULT_URL = "http://127.0.0.1:8000"
# Exit statuses of every verb (docs/operations/cli.md): argparse exits 2 on a usage error itself.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_CLOSED_PIPE = 141  # 128 + SIGPIPE: the reader went away (`| head`)
# The header that names the verb behind a request; the server writes it into the audit rows the
# request causes (gpuadmin.request_id.CHANNEL_HEADER; this module stays free of Django).
CHANNEL_HEADER = "X-Gpuadmin-Channel"


class ApiError(Exception):
    """The server refused the request (``status``), or could not be reached (``None``)."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Api:
    url: str
    token: str
    timeout_s: float = 30.0
    channel: str = ""  # what the audit rows of its requests name as their channel
    # (user name, password): HTTP basic auth instead of the token (gpuadmin login)
    password: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, channel: str = "") -> Api:
        """``GPUADMIN_URL`` and ``GPUADMIN_TOKEN``; where one is unset, what ``gpuadmin login``
        kept. The kept token goes only to the server it came from."""
        url, token = os.environ.get("GPUADMIN_URL", ""), os.environ.get("GPUADMIN_TOKEN", "")
        saved = None if url and token else Credentials.load()
        url = url or (saved.url if saved else DEFAULT_URL)
        if not token and saved and same_server(saved.url, url):
            token = saved.token
        return cls(url, token, channel=channel)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: Mapping[str, str] | None = None,
        **params: Any,
    ) -> Any:
        """One JSON request (with ``headers`` besides the API's own); ``ApiError`` with the
        server's reason on anything but 2xx, and for an answer that is not the API's.
        Redirects are not followed: they would turn a POST into a GET and carry the token to
        wherever they point."""
        if self.token and not TOKEN_TEXT.fullmatch(self.token):
            raise ApiError(None, "GPUADMIN_TOKEN is not a token (printable ASCII, no spaces)")
        query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        try:
            request = urllib.request.Request(
                self.url.rstrip("/") + path + (f"?{query}" if query else ""),
                data=None if body is None else json.dumps(body).encode(),
                method=method,
                headers={"Accept": "application/json", "Content-Type": "application/json"},
            )
            if self.password:
                pair = ":".join(self.password).encode()
                request.add_header("Authorization", f"Basic {base64.b64encode(pair).decode()}")
            elif self.token:
                request.add_header("Authorization", f"Bearer {self.token}")
            if self.channel:
                request.add_header(CHANNEL_HEADER, self.channel)
            for name, value in (headers or {}).items():
                request.add_header(name, value)
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                raw, answered = response.read(), response.headers
        except urllib.error.HTTPError as exc:
            raise ApiError(exc.code, _reason(exc.code, exc.read(), exc.headers)) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise ApiError(None, f"cannot reach {self.url}: {one_line(str(reason))}") from None
        kind = answered.get_content_type()
        if SERVER_HEADER not in answered or (raw and kind != "application/json"):
            raise ApiError(None, f"{self.url} answered {kind}, not as gpuadmin's API: {NOT_API}")
        return json.loads(raw) if raw else None

    def every(self, path: str, **params: Any) -> list[Any]:
        """Every item of a paginated list (``?limit=``/``?offset=``), page after page."""
        found: list[Any] = []
        while True:
            page = self.call("GET", path, limit=PAGE_LIMIT, offset=len(found), **params)
            found += page["results"]
            if not page["next"] or not page["results"]:
                return found


# A GPU's or MIG device's UUID as NVML gives it: what tells a GPU from a node in an argument.
GPU_UUID = re.compile(r"(GPU|MIG)-[0-9A-Fa-f-]{8,}")
# The most items one page of a list holds (gpuadmin.api.Pagination.max_limit).
PAGE_LIMIT = 1000
# An API token as gpuadmin issues them, and what any HTTP header may carry.
TOKEN_TEXT = re.compile(r"[!-~]+")
# Every answer of gpuadmin's server carries it (gpuadmin.request_id.HEADER; this module stays
# free of Django): an answer without it is some other server's.
SERVER_HEADER = "X-Request-ID"
NOT_API = "is GPUADMIN_URL the gpuadmin server's address?"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # the 3xx is raised as an HTTPError, and reported with its Location


_OPENER = urllib.request.build_opener(_NoRedirects)


def _reason(status: int, raw: bytes, headers: Any = None) -> str:
    """The error body as one line: ``detail``, or ``field: message`` for each field (a nested
    field as ``env.A``); a redirect with where it points; anything else its first words."""
    location = headers.get("Location") if headers is not None else None
    if 300 <= status < 400:
        return f"HTTP {status}: redirected to {location or '?'} ({NOT_API})"
    try:
        body = json.loads(raw)
    except ValueError:
        text = re.sub(r"<[^>]*>", " ", raw[:2000].decode(errors="replace"))
        return f"HTTP {status}: {one_line(text)[:200] or 'no reason given'} ({NOT_API})"
    if isinstance(body, dict) and set(body) == {"detail"}:
        message = one_line(str(body["detail"]))
    elif isinstance(body, dict):
        message = "; ".join(_field_errors(body))
    else:
        message = one_line(str(body))
    if status == 401:
        message += " (gpuadmin login, or set GPUADMIN_TOKEN to an API token)"
    return f"HTTP {status}: {message}"


def _field_errors(errors: Any, prefix: str = "") -> list[str]:
    """``field: message`` for each field of a 400's body; a nested field's parts named
    ``field.part`` (``env.A``, ``gpus.0``)."""
    if isinstance(errors, dict):
        return [
            line
            for field, inner in errors.items()
            for line in _field_errors(
                inner, f"{prefix}{field}" if not prefix else f"{prefix}.{field}"
            )
        ]
    if isinstance(errors, list) and all(isinstance(item, str) for item in errors):
        return [f"{prefix}: {one_line(' '.join(errors))}"]
    return [f"{prefix}: {one_line(str(errors))}"]


def one_line(text: str) -> str:
    return " ".join(text.split())


Verb = Callable[["Api", argparse.Namespace, TextIO], int]


def run_verb(verb: Verb, *, from_env: bool = True) -> Callable[[argparse.Namespace], int]:
    """``verb`` with the API from the environment (``from_env``; else with no address nor
    token: ``gpuadmin login`` finds its own), its requests naming the verb (``cli jobs
    cancel``) as their channel. A refusal or an unreachable server is one line on stderr and
    status 1; Ctrl-C is 130; a reader that went away (``| head``) ends it quietly (141)."""

    def run(args: argparse.Namespace) -> int:
        name = verb_name(args)
        channel = f"cli {name}"
        try:
            api = Api.from_env(channel) if from_env else Api("", "", channel=channel)
            status = verb(api, args, sys.stdout)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            return status
        except ApiError as exc:
            sys.stderr.write(f"gpuadmin {name}: {exc}\n")
            return EXIT_FAILED
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        except BrokenPipeError:
            # Python would report the pipe again when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_CLOSED_PIPE

    return run


def verb_name(args: argparse.Namespace) -> str:
    """The words that named the verb: ``status``, ``jobs cancel`` (argparse's ``verb`` and, for a
    verb group, ``action``)."""
    words = (getattr(args, "verb", None), getattr(args, "action", None))
    return " ".join(word for word in words if word)


# --------------------------------------------------------------------------- gpuadmin login

CREDENTIALS_FILE = "credentials"


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/gpuadmin``, else ``~/.config/gpuadmin`` (a relative
    ``XDG_CONFIG_HOME`` is ignored, as the XDG Base Directory specification says)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if os.path.isabs(base) else Path.home() / ".config"
    return root / "gpuadmin"


def same_server(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


@dataclass(frozen=True)
class Credentials:
    """What ``gpuadmin login`` keeps: the server, whose token it is, the token and its id
    (``gpuadmin logout`` revokes it by its id)."""

    url: str
    username: str
    token: str
    token_id: int

    @staticmethod
    def path() -> Path:
        return config_dir() / CREDENTIALS_FILE

    @classmethod
    def load(cls) -> Credentials | None:
        """The kept credentials, None when there are none; ``ApiError`` for a file that is
        not theirs."""
        path = cls.path()
        try:
            data = json.loads(path.read_bytes())
            return cls(
                str(data["url"]), str(data["username"]), str(data["token"]), int(data["token_id"])
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ApiError(
                None, f"{path}: unreadable ({one_line(str(exc))}); gpuadmin login replaces it"
            ) from None

    def save(self) -> Path:
        """Write them where ``load`` reads them: the folder mode 0700, the file 0600 from its
        first byte (written aside, then renamed over the old one)."""
        path = self.path()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
        try:
            with os.fdopen(handle, "w") as file:  # mkstemp creates it 0600
                json.dump(asdict(self), file, indent=2)
                file.write("\n")
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def forget(cls) -> None:
        cls.path().unlink(missing_ok=True)
