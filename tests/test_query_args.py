"""query_args.py: every text a query string can carry becomes a value in range or a Refusal (400)
that names the parameter, never another exception (which the service answers with a 500)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queue_service.core import query_args
from queue_service.core.errors import Refusal

ANY_TEXT = st.one_of(
    st.text(st.characters(exclude_categories=("Cs",))),
    st.integers().map(str),
    st.floats().map(str),
    st.dates().map(date.isoformat),
    st.datetimes(timezones=st.timezones()).map(datetime.isoformat),
)


def refused_naming(name: str, parse, *args):
    with pytest.raises(Refusal) as refused:
        parse(*args)
    assert refused.value.cause == "invalid" and f"`{name}`" in refused.value.message
    return refused.value.message


@settings(max_examples=300, deadline=None)
@given(text=ANY_TEXT)
def test_any_text_is_a_value_in_range_or_a_refusal(text):
    for parse, check in [
        (lambda t: query_args.whole(t, "n", 0, 0), lambda v: 0 <= v <= query_args.MAX_WHOLE),
        (lambda t: query_args.number(t, "n", 0, 0, 60), lambda v: 0 <= v <= 60),
        (lambda t: query_args.day(t, "d"), _day_in_range),
        (lambda t: query_args.moment(t, "m"), _moment_in_range),
        (lambda t: query_args.flag(t, "f", False), lambda v: isinstance(v, bool)),
    ]:
        try:
            value = parse(text)
        except Refusal:
            continue
        assert check(value), (text, value)


def _day_in_range(value) -> bool:
    return value is None or query_args.FIRST_DAY <= value <= query_args.LAST_DAY


def _moment_in_range(value) -> bool:
    if value is None:
        return True
    # The spans the handlers build around a moment exist: a day later, ten years before.
    return value.tzinfo == UTC and (value + timedelta(days=1)) - timedelta(days=3660) < value


@pytest.mark.parametrize(
    "text", ["²", "٣", "99999999999999999999", "9" * 5000, "-1", "1.0", " 1", "0x1"]
)
def test_a_whole_number_is_ascii_digits_in_range(text):
    message = refused_naming("offset", query_args.whole, text, "offset", 0, 0)
    assert f"from 0 to {query_args.MAX_WHOLE}" in message


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e400", "61", "-0.1", "a minute"])
def test_a_number_is_finite_and_in_range(text):
    refused_naming("wait", query_args.number, text, "wait", 0, 0, 60)


def test_above_low_leaves_out_the_low_end():
    refused_naming("hours", query_args.number, "0", "hours", 24, 0, 10, True)
    assert query_args.number("0.5", "hours", 24, 0, 10, above_low=True) == 0.5
    assert query_args.number("", "hours", 24, 0, 10, above_low=True) == 24


@pytest.mark.parametrize("text", ["9999-12-31", "9999-12-30", "0001-01-01", "1969-12-31"])
def test_dates_near_the_ends_of_the_calendar_are_refused(text):
    message = refused_naming("to", query_args.day, text, "to")
    assert "from 1970-01-01 to 2999-12-31" in message


@pytest.mark.parametrize(
    "text", ["9999-12-31T23:59:59-23:59", "0001-01-01T00:00:00+23:59", "9999-12-31"]
)
def test_moments_near_the_ends_of_the_calendar_are_refused(text):
    refused_naming("from", query_args.moment, text, "from")


def test_good_values_are_read():
    assert query_args.whole("", "limit", 100, 1, 1000) == 100
    assert query_args.whole("0042", "offset", 0, 0) == 42
    assert query_args.day("2026-11-24", "to") == date(2026, 11, 24)
    assert query_args.moment("2026-11-24T06:00:00", "to") == datetime(2026, 11, 24, 6, tzinfo=UTC)
    assert query_args.moment("2026-11-24T07:00+01:00", "to") == datetime(
        2026, 11, 24, 6, tzinfo=UTC
    )
    assert query_args.flag("TRUE", "all", False) is True
    assert query_args.flag("", "all", True) is True
    assert query_args.flag("0", "all", True) is False
    refused_naming("all", query_args.flag, "yes", "all", False)
