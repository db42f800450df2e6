import pytest

from image_catalog.catalog import CatalogError, is_valid_reference, load_catalog, parse_catalog


def test_shipped_catalog_loads_with_two_versions_of_one_framework():
    catalog = load_catalog()
    versions = {image.version for image in catalog.images if image.framework == "scikit-learn"}
    assert len(versions) >= 2
    for image in catalog.images:
        assert is_valid_reference(image.image)
        assert image.base is None or image.base in catalog.names()


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({}, "'images' list"),
        ({"images": [{"image": "a/b:1"}]}, "'name' is required"),
        ({"images": [{"name": "a"}]}, "'image' is required"),
        ({"images": [{"name": "Bad Name", "image": "a:1"}]}, "lower-case"),
        ({"images": [{"name": "a", "image": "UPPER/case"}]}, "not a valid image reference"),
        ({"images": [{"name": "a", "image": "a:1", "colour": "red"}]}, "unknown field(s) colour"),
        ({"images": [{"name": "a", "image": "a:1"}, {"name": "a", "image": "b:1"}]}, "duplicate"),
        ({"images": [{"name": "a", "image": "a:1", "base": "zz"}]}, "base 'zz'"),
        ({"images": [{"name": "a", "image": "a:1", "recipe": "nope"}]}, "no Dockerfile"),
        ({"images": [{"name": "a", "image": "a:1", "hidden": True}]}, "at least one image"),
        ({"images": [{"name": "a", "image": "a:1", "wheels": "torch.whl"}]}, "list of wheel"),
        ({"images": [{"name": "a", "image": "a:1", "wheels": ["/opt/t.whl"]}]}, "not paths"),
    ],
)
def test_bad_catalogs_are_refused_naming_the_problem(data, fragment):
    with pytest.raises(CatalogError) as refused:
        parse_catalog(data)
    assert fragment in str(refused.value)


def test_unreadable_catalog_file_is_a_catalog_error(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text("images: [unclosed")
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(path)


def test_catalog_lookup_and_visibility():
    catalog = parse_catalog(
        {"images": [{"name": "a", "image": "a:1"}, {"name": "b", "image": "b:1", "hidden": True}]}
    )
    assert catalog.get("b").image == "b:1"
    assert [image.name for image in catalog.visible()] == ["a"]
    with pytest.raises(KeyError):
        catalog.get("c")
