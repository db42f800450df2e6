"""Every query parameter of every endpoint, fuzzed against the real hub and service: a bad or
extreme value is a 4xx with a message, never a 500.

The endpoints and their parameters come from the service's own route table
(`queue_service.handlers.routes`, each handler's `query_arguments`), so a new endpoint or parameter
is fuzzed without touching this module; `test_every_parameter_a_handler_reads_is_declared` keeps
the declarations whole. Values are drawn by hypothesis (a fixed seed: the same requests each run),
mixing well-formed values of each kind (dates across all of `date`'s range, huge numbers) with
arbitrary text. Only GET is fuzzed: it changes nothing, so the shared hub is left as it was.
"""

from __future__ import annotations

import inspect
import re
from datetime import UTC, timedelta, timezone

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queue_service.handlers import routes
from queue_service.handlers.base import BaseHandler
from queue_service.handlers.grants import SpawnerHandler

from .harness import QueueUser

pytestmark = [pytest.mark.docker, pytest.mark.hub]
PREFIX = "/services/queue/"
#: A value for each kind of path argument in the route table (a session id no one has, etc.).
PATH_SAMPLES = {
    "([0-9a-f]+)": "0badc0de",
    "([a-z0-9][a-z0-9._-]*)": "python-3.11",
    r"(\w+)": "running",
    "([^/]+)": "no-such-node",
    "(.*)": "no-such-file.js",
    "([0-9a-f]{32})": "0badc0de" * 4,
    "([0-9]+)": "7",
    "([A-Za-z0-9_-]{1,64})": "no-such-token",
}
#: Values that broke the service before (500s), and their kin.
EXTREMES = [
    "",
    " ",
    "²",
    "٣",
    "-1",
    "0",
    "99999999999999999999",
    "9" * 5000,
    "1e400",
    "-1e400",
    "nan",
    "inf",
    "0x10",
    "1_000",
    "0001-01-01",
    "9999-12-30",
    "9999-12-31",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    "2026-02-30",
    "2026-11-24T25:00",
    "../../etc/passwd",
    "%00",
    "a/b",
    "admin",
    "<script>",
]
EXAMPLES_PER_PARAMETER = 50


def endpoints() -> list[tuple[str, type, dict[str, str]]]:
    """(concrete path, handler, its query arguments) for every route of the service."""
    found = []
    for route in routes(PREFIX):
        pattern, handler = route[0], route[1]
        path = pattern
        for group in re.findall(r"\([^)]*\)", pattern):
            assert group in PATH_SAMPLES, f"add a sample for the path argument {group}"
            path = path.replace(group, PATH_SAMPLES[group], 1)
        found.append((path, handler, getattr(handler, "query_arguments", {})))
    return found


ENDPOINTS = endpoints()
#: (path, handler, parameter, its kind): one case for each parameter of each endpoint.
PARAMETERS = [
    (path, handler, name, kind)
    for path, handler, arguments in ENDPOINTS
    for name, kind in arguments.items()
]

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
WELL_FORMED = {
    "flag": st.sampled_from(["1", "0", "true", "false", "TRUE", "yes"]),
    "whole": st.one_of(st.integers(-5, 2000), st.integers()).map(str),
    "number": st.one_of(st.floats(0, 1), st.floats(allow_nan=True, allow_infinity=True)).map(str),
    "date": st.dates().map(lambda d: d.isoformat()),
    "moment": st.one_of(
        st.datetimes().map(lambda t: t.isoformat()),
        st.datetimes(
            timezones=st.sampled_from([UTC, timezone(timedelta(hours=-23, minutes=-59))])
        ).map(lambda t: t.isoformat()),
        st.dates().map(lambda d: d.isoformat()),
    ),
    "choice": st.sampled_from(["json", "csv", "user", "idle", "error", "xml"]),
    "text": st.sampled_from(["admin", "", "nobody-here"]),
}


def value_of(kind: str):
    return st.one_of(WELL_FORMED[kind], st.sampled_from(EXTREMES), TEXT)


def query_with(handler: type, name: str, value: str, others: dict | None = None) -> dict:
    """`name=value` (with `others`), plus `finished=1` where it decides whether `name` is read
    (the history's own parameters on api/sessions)."""
    query = {**(others or {}), name: value}
    if "finished" in handler.query_arguments and name != "finished":
        query["finished"] = "1"
    return query


@pytest.fixture(scope="module")
def callers(hub):
    """An admin (who may read every endpoint) and the spawner (the grants API's only caller)."""
    admin = QueueUser(hub, "admin").http
    spawner = requests.Session()
    spawner.headers["Authorization"] = f"token {hub.spawner_token}"
    return {"admin": admin, "spawner": spawner, "url": hub.url}


def get(callers, handler: type, path: str, query: dict) -> requests.Response:
    who = "spawner" if issubclass(handler, SpawnerHandler) else "admin"
    return callers[who].get(f"{callers['url']}{path}", params=query, timeout=120)


def assert_clear_answer(response: requests.Response, handler: type, query: dict) -> None:
    assert response.status_code < 500, (response.url, query, response.status_code, response.text)
    json_api = issubclass(handler, BaseHandler) and handler.json_errors
    if response.status_code >= 400 and json_api:
        assert response.headers["Content-Type"].startswith("application/json"), response.text
        assert response.json()["message"], response.text


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("usage?from=9999-12-30&to=9999-12-31", "to"),
        ("usage?to=0001-01-01", "to"),
        ("sessions?finished=1&to=9999-12-31", "to"),
        ("sessions?finished=1&from=0001-01-01T00:00:00%2B23:59", "from"),
        ("sessions?finished=1&offset=99999999999999999999", "offset"),
        ("sessions?finished=1&offset=%C2%B2", "offset"),
        ("sessions?finished=1&limit=%D9%A3", "limit"),
        ("utilization?to=9999-12-31T23:59:59-23:59", "to"),
        ("images?all=yes", "all"),
    ],
)
def test_the_reported_extremes_are_a_400_that_names_the_parameter(callers, path, name):
    response = callers["admin"].get(f"{callers['url']}{PREFIX}api/{path}", timeout=60)
    assert response.status_code == 400, (path, response.status_code, response.text)
    assert f"`{name}`" in response.json()["message"], response.text


def case_id(case) -> str:
    return f"{case[0].removeprefix(PREFIX)}?{case[2]}"


@pytest.mark.parametrize("case", PARAMETERS, ids=case_id)
def test_no_extreme_value_of_any_parameter_is_a_500(callers, case):
    path, handler, name, _ = case
    for value in EXTREMES:
        query = query_with(handler, name, value)
        assert_clear_answer(get(callers, handler, path, query), handler, query)


@pytest.mark.parametrize("case", PARAMETERS, ids=case_id)
@settings(
    max_examples=EXAMPLES_PER_PARAMETER,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(data=st.data())
def test_no_drawn_value_of_any_parameter_is_a_500(callers, case, data):
    """The parameter's value drawn, with some of the endpoint's other parameters beside it."""
    path, handler, name, kind = case
    arguments = handler.query_arguments
    others = data.draw(st.lists(st.sampled_from(sorted(arguments)), unique=True, max_size=3))
    query = {other: data.draw(value_of(arguments[other])) for other in others}
    query = query_with(handler, name, data.draw(value_of(kind)), query)
    assert_clear_answer(get(callers, handler, path, query), handler, query)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda endpoint: endpoint[0])
def test_unknown_parameters_are_ignored_without_a_500(callers, endpoint):
    path, handler, _ = endpoint
    query = {"offset": "²", "from": "9999-12-31", "x": "\u0000"}
    assert_clear_answer(get(callers, handler, path, query), handler, query)


def test_every_parameter_a_handler_reads_is_declared():
    """The fuzz covers only the declared parameters: a handler that reads another must say so."""
    for path, handler, declared in ENDPOINTS:
        source = "".join(inspect.getsource(c) for c in handler.__mro__ if _is_ours(c))
        read = set(re.findall(r"get_argument\(\s*\"(\w+)\"", source))
        assert read <= set(declared), f"{handler.__name__} ({path}) reads {read - set(declared)}"


def _is_ours(cls: type) -> bool:
    return cls.__module__.startswith("queue_service.handlers")
