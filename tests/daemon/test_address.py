"""The HTTP server's address (daemon/service/address.py): HOST:PORT parsed and checked, and a bind
probe that finds a port in use before the server starts."""

from __future__ import annotations

import socket

import pytest

from deltastream.daemon.service.address import check_bindable, parse_address
from deltastream.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:9464", ("127.0.0.1", 9464)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        (":9464", ("127.0.0.1", 9464)),
        ("[::1]:9464", ("::1", 9464)),
        ("localhost:65535", ("localhost", 65535)),
    ],
)
def test_good_addresses(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("9464", "--http must be HOST:PORT (e.g. 127.0.0.1:9464), not '9464'"),
        ("localhost", "--http must be HOST:PORT (e.g. 127.0.0.1:9464), not 'localhost'"),
        ("http://127.0.0.1:9464", "--http must be HOST:PORT"),
        ("a b:80", "--http must be HOST:PORT"),
        ("h:65536", "--http 'h:65536': the port must be a number from 0 to 65535, not '65536'"),
        ("h:-1", "--http 'h:-1': the port must be a number from 0 to 65535, not '-1'"),
        ("h:http", "--http 'h:http': the port must be a number from 0 to 65535"),
    ],
)
def test_bad_addresses_name_the_setting(text: str, message: str) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        parse_address(text, "--http")
    assert str(e.value).startswith(message)


def test_a_port_in_use_is_found_and_a_free_one_left_free() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(InvalidArgumentError) as e:
            check_bindable(f"127.0.0.1:{port}")
        assert str(e.value) == f"cannot listen on 127.0.0.1:{port}: Address already in use"
    check_bindable(f"127.0.0.1:{port}")  # free now; the probe released it again
    with socket.socket() as again:
        again.bind(("127.0.0.1", port))


def test_a_host_that_is_not_this_machines_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match=r"cannot listen on nosuch\.invalid:80: "):
        check_bindable("nosuch.invalid:80")
