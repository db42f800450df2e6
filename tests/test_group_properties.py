"""fgpu_shared/group_properties.py: a property typed in the admin panel means what the REST API's
object means."""

from fgpu_shared.group_properties import decoded


def test_json_text_of_an_object_or_a_list_is_read_as_it():
    typed = {"fgpu_quota": ' {"fgpu": 2, "sessions": 4}', "fgpu_presets": '[{"name": "a"}]'}
    assert decoded(typed) == {
        "fgpu_quota": {"fgpu": 2, "sessions": 4},
        "fgpu_presets": [{"name": "a"}],
    }


def test_other_values_stay_as_they_are():
    kept = {"max_session_lifetime": "8h", "broken": "{fgpu: 2", "n": 3, "obj": {"fgpu": 1}}
    assert decoded(kept) == kept
    assert decoded(None) == {}
