"""Unit tests for the demo login's address check (fgpu_spawner/demo_login.py)."""

import pytest

from fgpu_spawner.demo_login import (
    ALLOW_ENV,
    comes_from_this_machine,
    demo_login_refusal,
    is_loopback_url,
)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:8000", "http://127.0.0.2:8000/", "http://[::1]:8000", "http://localhost:80"],
)
def test_loopback_addresses(url):
    assert is_loopback_url(url)
    assert demo_login_refusal(url, allowed=False) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://0.0.0.0:8000",
        "http://:8000",
        "http://[::]:8000",
        "http://10.0.0.5:8000",
        "https://hub.example.org",
        "http+unix://%2Fsrv%2Fhub.sock",
    ],
)
def test_other_addresses_are_refused_with_a_message_that_says_what_to_do(url):
    assert not is_loopback_url(url)
    refusal = demo_login_refusal(url, allowed=False)
    assert "demo login" in refusal and url in refusal
    assert ALLOW_ENV in refusal and "authenticator" in refusal


def test_an_explicit_setting_allows_any_address():
    assert demo_login_refusal("http://0.0.0.0:8000", allowed=True) is None


@pytest.mark.parametrize("peer", [None, "127.0.0.1", "127.0.0.9", "::1", "::ffff:127.0.0.1"])
def test_connections_from_this_machine_are_taken(peer):
    assert comes_from_this_machine(peer)


@pytest.mark.parametrize("peer", ["203.0.113.9", "172.31.250.7", "2001:db8::5", "::ffff:10.9.8.7"])
def test_connections_from_addresses_this_machine_does_not_have_are_refused(peer):
    # A session's address is its container's, which no interface of this machine has.
    assert not comes_from_this_machine(peer)
