"""`--bind` of `gpuadmin up` and `gpuadmin serve`, and `serve`'s `--workers` and `--threads` (and
WEB_CONCURRENCY, WEB_THREADS): refused at once when they are not what they must be."""

import argparse

import pytest
from django.core.exceptions import ImproperlyConfigured

from gpuadmin.cli import GRPC_BIND, bind_address, build_parser


@pytest.mark.parametrize(
    ("bind", "address"),
    [
        ("127.0.0.1:8000", ("127.0.0.1", 8000)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
        ("[::1]:8000", ("::1", 8000)),
        ("gpuadmin.example.org:65535", ("gpuadmin.example.org", 65535)),
    ],
)
def test_host_and_port(bind, address):
    assert bind_address(bind) == address


# "²" is a digit to str.isdigit() but not to int(): refused, not a traceback.
@pytest.mark.parametrize(
    "bind", ["8000", "localhost", ":8000", "host:", "host:0", "host:65536", "host:80\u00b2"]
)
def test_not_host_and_port_is_refused_before_anything_starts(bind, capsys):
    with pytest.raises(argparse.ArgumentTypeError, match="is not HOST:PORT"):
        bind_address(bind)
    for verb in ("up", "serve"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([verb, "--bind", bind])
        assert exited.value.code == 2
        assert f"argument --bind: {bind!r} is not HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-1", "two", "2\u00b2", ""])
def test_workers_and_threads_are_whole_numbers_of_at_least_one(value, capsys):
    for verb, option in (
        ("serve", "--workers"),
        ("serve", "--threads"),
        ("worker", "--concurrency"),
    ):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([verb, option, value])
        assert exited.value.code == 2
        assert "is not a whole number of at least 1" in capsys.readouterr().err
    assert build_parser().parse_args(["serve", "--workers", "3"]).workers == 3


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("WEB_CONCURRENCY", "many", "WEB_CONCURRENCY='many' is not an integer"),
        ("WEB_THREADS", "0", "WEB_THREADS=0 is below the minimum of 1"),
    ],
)
def test_their_settings_are_checked_too(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfigured, match=message):
        build_parser()
    monkeypatch.setenv(name, "4")
    args = build_parser().parse_args(["serve"])
    assert (args.workers if name == "WEB_CONCURRENCY" else args.threads) == 4


def test_up_starts_the_grpc_api_unless_told_not_to(capsys):
    """``up``'s gRPC server: ``--grpc-bind`` (checked as ``--bind`` is), ``--no-grpc``: none."""
    assert build_parser().parse_args(["up"]).grpc_bind == GRPC_BIND
    assert build_parser().parse_args(["up", "--grpc-bind", "0.0.0.0:6000"]).grpc_bind == (
        "0.0.0.0:6000"
    )
    assert build_parser().parse_args(["up", "--no-grpc"]).grpc_bind == ""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["up", "--grpc-bind", "6000"])
    assert exited.value.code == 2
    assert "argument --grpc-bind: '6000' is not HOST:PORT" in capsys.readouterr().err
