from fgpu_spawner.grant import Grant


def test_grant_round_trips_through_json():
    grant = Grant("s1", "node-a", {"GPU-a": 1.0, "GPU-b": 0.5})
    assert Grant.from_json(grant.to_json()) == grant


def test_grant_without_gpus_reads_back_empty():
    assert Grant.from_json('{"session_id": "s", "node": "n"}').gpus == {}
