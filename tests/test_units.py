import math

import pytest

from image_catalog.units import format_size, parse_size

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


@pytest.mark.parametrize("bad", ["", "G", "1X", "-1G", "1.2.3G", "one", "1 G B", None, True, [1]])
def test_parse_size_refuses_what_is_not_a_size(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1.5])
def test_parse_size_refuses_non_whole_byte_counts(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(
    "nbytes, text", [(GIB, "1G"), (GIB * 3 // 2, "1.5G"), (256 * 1024**2, "256M"), (512, "512B")]
)
def test_format_size_round_trips(nbytes, text):
    assert format_size(nbytes) == text
    assert parse_size(text) == nbytes
