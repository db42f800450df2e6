"""image_catalog.labels: catalog fields read from an image's Docker labels."""

import pytest

from image_catalog.labels import LabelError, entry_fields_from_labels


def test_fgpu_labels_become_entry_fields():
    fields = entry_fields_from_labels(
        {
            "fgpu.display-name": "PyTorch 2.4 (CPU)",
            "fgpu.framework": "torch",
            "fgpu.version": "2.4.1",
            "fgpu.description": "  PyTorch on CPU  ",
            "fgpu.gpu": "true",
            "fgpu.resource.min.cpu": "1",
            "fgpu.resource.min.mem": "1G",
            "fgpu.resource.default.mem": "2G",
            "fgpu.resource.max.fgpu": "2",
            "maintainer": "someone",
        }
    )
    assert fields == {
        "display_name": "PyTorch 2.4 (CPU)",
        "framework": "torch",
        "version": "2.4.1",
        "description": "PyTorch on CPU",
        "gpu": True,
        "resources": {
            "min": {"cpu": "1", "mem": "1G"},
            "default": {"mem": "2G"},
            "max": {"fgpu": "2"},
        },
    }


def test_backend_ai_minimums_are_read_where_no_fgpu_label_says_otherwise():
    fields = entry_fields_from_labels(
        {
            "ai.backend.resource.min.cpu": "2",
            "ai.backend.resource.min.mem": "4g",
            "ai.backend.resource.min.cuda.shares": "0.5",
            "fgpu.resource.min.cpu": "1",
        }
    )
    assert fields["resources"] == {"min": {"cpu": "1", "mem": "4g", "fgpu": "0.5"}}


def test_no_labels_give_no_fields():
    assert entry_fields_from_labels(None) == {}
    assert entry_fields_from_labels({"fgpu.recipe-hash": "abc", "fgpu.framework": " "}) == {}


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        ({"fgpu.gpu": "maybe"}, "true or false"),
        ({"fgpu.resource.min.cpu": "lots"}, "must be a number"),
        ({"fgpu.resource.min.mem": "4G", "fgpu.resource.max.mem": "1G"}, "exceeds the max"),
    ],
)
def test_unusable_labels_are_refused_naming_the_label(labels, fragment):
    with pytest.raises(LabelError, match=fragment):
        entry_fields_from_labels(labels)
