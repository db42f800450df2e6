"""image_catalog/labextension.py: which recipe folders are JupyterLab extensions, the cache key of
their compiled output, and the compile itself (the host's Node.js and npm, a real JupyterLab core)."""

from __future__ import annotations

import json

import pytest

from image_catalog import labextension
from image_catalog.build import cache_dir
from image_catalog.catalog import RECIPES_DIR, load_catalog


def test_only_a_package_that_says_it_is_a_jupyterlab_extension_is_one(tmp_path):
    (tmp_path / "ext").mkdir()
    (tmp_path / "ext" / "package.json").write_text(json.dumps({"jupyterlab": {"extension": True}}))
    (tmp_path / "tool").mkdir()
    (tmp_path / "tool" / "package.json").write_text(json.dumps({"name": "tool"}))
    assert labextension.extension_sources(tmp_path) == [tmp_path / "ext"]


def test_the_cache_key_follows_the_source_and_the_jupyterlab_version():
    files = {"index.js": b"export default {};", "package.json": b"{}"}
    key = labextension.source_hash(files, "4.6.6")
    assert key == labextension.source_hash(dict(reversed(files.items())), "4.6.6")
    assert key != labextension.source_hash(files, "4.6.7")
    assert key != labextension.source_hash({**files, "index.js": b"//"}, "4.6.6")


def test_the_base_recipe_carries_the_session_status_item_and_pins_its_jupyterlab():
    (source,) = labextension.extension_sources(RECIPES_DIR / "jupyter-base")
    assert source.name == "session-status"
    base = next(i for i in load_catalog().images if i.recipe == "jupyter-base")
    assert base.build_args["JUPYTERLAB_VERSION"]


def test_the_session_status_item_is_compiled_to_a_prebuilt_extension_and_cached():
    """The build cache's copy (the image build compiled it before the tests, cold on a fresh
    machine): a prebuilt extension of that name, with its remote entry; asked again, the cache
    answers without compiling."""
    source = RECIPES_DIR / "jupyter-base" / "session-status"
    version = next(
        i.build_args["JUPYTERLAB_VERSION"]
        for i in load_catalog().images
        if i.recipe == "jupyter-base"
    )
    output = labextension.compiled(source, version, cache_dir())
    built = json.loads((output / "package.json").read_text())
    assert built["name"] == "fgpu-session-status"
    assert any(p.name.startswith("remoteEntry.") for p in (output / "static").iterdir())
    # Both plugins, "Run as a batch job…" with them; JupyterLab's own packages are shared from
    # the page (its file browser's, its menus'), not bundled a second time.
    code = "".join(p.read_text() for p in (output / "static").glob("*.js"))
    assert "fgpu-session-status:plugin" in code and "fgpu-session-status:run-as-job" in code
    assert "Run as a batch job…" in code
    assert "class DirListing" not in code and '"@jupyterlab/filebrowser"' in code
    assert labextension.compiled(source, version, cache_dir(), log=_fail) == output


def test_a_missing_tool_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(labextension.ExtensionBuildError, match="npm is not installed"):
        labextension._run(["npm", "--version"], tmp_path)


def _fail(message: str) -> None:
    raise AssertionError(f"compiled again: {message}")
