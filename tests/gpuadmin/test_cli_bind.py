"""`--bind` of `gpuadmin up` and `gpuadmin serve`: HOST:PORT, refused at once otherwise."""

import argparse

import pytest

from gpuadmin.cli import bind_address, build_parser


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
