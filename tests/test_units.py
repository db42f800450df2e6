import math
import re

import pytest

from fgpu_shared.units import (
    format_size,
    parse_amount,
    parse_duration,
    parse_positive_size,
    parse_size,
)

GIB = 1024**3


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1G", GIB),
        ("1g", GIB),
        ("1GB", GIB),
        ("1GiB", GIB),
        ("1.5GiB", GIB * 3 // 2),
        ("512M", 512 * 1024**2),
        ("2048k", 2 * 1024**2),
        ("1T", 1024**4),
        (" 2G ", 2 * GIB),
        ("1073741824", GIB),
        (".5G", GIB // 2),
        (1073741824, GIB),
        (2.0 * GIB, 2 * GIB),
    ],
)
def test_parse_size_follows_docker_binary_suffixes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "bad", ["", "G", "1X", "-1G", "1.2.3G", "one", "1 G B", None, True, [1], "9" * 400 + "G"]
)
def test_parse_size_refuses_what_is_not_a_size(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1.5])
def test_parse_size_refuses_non_whole_byte_counts(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(
    "nbytes, text",
    [(GIB, "1 GiB"), (GIB * 3 // 2, "1.5 GiB"), (256 * 1024**2, "256 MiB"), (512, "512 B")],
)
def test_format_size_round_trips(nbytes, text):
    assert format_size(nbytes) == text
    assert parse_size(text) == nbytes


def test_format_size_rounds_halves_up_as_the_pages_do():
    # 1.125 GiB is exact in binary; JavaScript's toFixed (fgpu.js) says 1.13, and so must we.
    assert format_size(GIB * 9 // 8) == "1.13 GiB"
    assert format_size(int(23.04 * GIB)) == "23.04 GiB"


@pytest.mark.parametrize("value", ["1G", 1, "0.5K"])
def test_positive_sizes_pass(value):
    assert parse_positive_size(value) == parse_size(value)


@pytest.mark.parametrize("value", [0, "0", "0G", "0.0M"])
def test_a_zero_size_is_refused_with_its_value(value):
    with pytest.raises(ValueError, match=f"greater than zero, not {re.escape(repr(value))}"):
        parse_positive_size(value)


@pytest.mark.parametrize(
    ("value", "zero_ok", "expected"),
    [(2, False, 2.0), ("0.5", False, 0.5), (0, True, 0.0), ("0", True, 0.0)],
)
def test_amounts_pass(value, zero_ok, expected):
    assert parse_amount(value, zero_ok) == expected


@pytest.mark.parametrize(
    ("value", "zero_ok", "message"),
    [
        ("lots", False, "must be a number, not 'lots'"),
        (True, False, "must be a number, not True"),
        ([1], False, "must be a number, not [1]"),
        (10**400, False, "must be a number"),
        ("inf", False, "must be a finite number"),
        (0, False, "must be greater than zero, not 0"),
        (-1, True, "must be greater than zero, not -1"),
    ],
)
def test_what_is_not_an_amount_is_refused_with_its_value(value, zero_ok, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_amount(value, zero_ok)


# --- durations (moved here from queue_service/automatic_ends.py with batch jobs' time limits) -----


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (3600, 3600.0),
        (1.5, 1.5),
        ("90", 90.0),
        (" 90m ", 5400.0),
        ("8H", 28800.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("0.5h", 1800.0),
    ],
)
def test_durations_are_seconds_or_texts_with_units(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", [0, 0.0, "0", "0m"])
def test_a_zero_duration_is_none_no_limit(value):
    assert parse_duration(value) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (-1, "-1 is not a duration (zero or more seconds)"),
        ("inf", "'inf' is not a duration (zero or more seconds)"),
        (math.nan, "nan is not a duration (zero or more seconds)"),
        ("soon", "'soon' is not a duration (seconds, or e.g. 90m, 8h, 1d, 1h30m)"),
        ("1w", "'1w' is not a duration"),
        ("1h and 2m", "'1h and 2m' is not a duration"),
        ("", "'' is not a duration"),
        (None, "None is not a duration"),
        (True, "True is not a duration"),
    ],
)
def test_what_is_not_a_duration_is_a_value_error_that_says_so(value, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_duration(value)
