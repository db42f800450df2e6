"""A grant request read into a record's fields (queue_service/grant_requests.py): its types
guarded, a malformed one refused with what is wrong, never queued."""

from __future__ import annotations

import json

import pytest

from queue_service.grant_requests import Refused, parse_key, parse_request

REQUEST = {"user": "alice", "image": "python-3.11", "cpu": "1.5", "mem": 2**30, "fgpu": 0.5}


def test_a_request_becomes_the_records_fields_with_their_types():
    fields = parse_request(REQUEST)
    assert fields["cpu"] == 1.5 and fields["mem"] == 2**30 and fields["fgpu"] == 0.5
    assert fields["server_name"] == "" and fields["account"] == "" and fields["job_json"] is None
    assert fields["resource_group"] is None
    job = json.dumps({"command": "python train.py"})
    assert parse_request({**REQUEST, "job": job})["job_json"] == job  # kept as it came


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"cpu": "many"}, "could not convert"),
        ({"mem": None}, "Malformed grant request"),
        ({"account": "yesterday"}, "account must be an account key"),
        ({"job": "[1, 2]"}, "job must be a batch job's JSON object"),
    ],
)
def test_a_malformed_request_is_refused_with_what_is_wrong(change, words):
    with pytest.raises(Refused, match=words):
        parse_request({**REQUEST, **change})


def test_a_key_is_a_uuid4s_hex_digits_or_none():
    assert parse_key({}) is None
    assert parse_key({"id": "0" * 32}) == "0" * 32
    for bad in ("0" * 31, "G" * 32, 7):
        with pytest.raises(Refused, match="32 hex digits"):
            parse_key({"id": bad})
