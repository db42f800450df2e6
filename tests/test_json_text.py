"""fgpu_shared/json_text.py: JSON text that must hold an object."""

from __future__ import annotations

import pytest

from fgpu_shared.json_text import json_object


class Refused(ValueError):
    pass


def test_an_object_is_read():
    assert json_object('{"a": [1, null]}', "the file", Refused) == {"a": [1, None]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "the file is not JSON: Expecting property name"),
        ("[1]", "the file holds no JSON object with a name"),
        ('"text"', "the file holds no JSON object with a name"),
    ],
)
def test_what_is_not_an_object_is_refused_with_its_source_named(text, message):
    with pytest.raises(Refused, match=message):
        json_object(text, "the file", Refused, "with a name")
