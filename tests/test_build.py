"""Unit tests for the offline image builder's pure parts (no Docker engine, no network)."""

from __future__ import annotations

import pytest

from image_catalog import Catalog, CatalogImage, load_catalog
from image_catalog.__main__ import main
from image_catalog.build import (
    LABEL_CATALOG_NAME,
    LABEL_FRAMEWORK,
    LABEL_RECIPE_HASH,
    LABEL_VERSION,
    ROOTFS_PACKAGES,
    BuildError,
    UnknownImageError,
    build_args_for,
    build_order,
    debootstrap_command,
    failure_message,
    find_debian_mirror,
    heavy_names,
    image_labels,
    parse_deb822_sources,
    parse_one_line_sources,
    prepare_context,
    recipe_hash,
    rootfs_hash,
    rootfs_reference,
    select_wheels,
)

# Placeholder hosts under the reserved .invalid domain: no real mirror is named in the repository.
MIRROR = "http://mirror.invalid/debian"
SECURITY = "http://security.invalid/debian-security"

DEB822 = f"""\
Types: deb
# a comment between fields, as Debian's own debian.sources has
URIs: {MIRROR}
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: {SECURITY}
Suites: bookworm-security
Components: main
"""

ONE_LINE = f"""\
# deb http://commented.invalid/debian bookworm main
deb-src {MIRROR}-src bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {MIRROR} bookworm main
deb {SECURITY} bookworm-security main
"""


# --- mirror discovery -------------------------------------------------------------------------


def test_deb822_picks_the_stanza_listing_the_suite():
    assert parse_deb822_sources(DEB822) == [MIRROR]


def test_deb822_does_not_match_a_suite_by_prefix():
    assert parse_deb822_sources(DEB822, suite="bookworm-security") == [SECURITY]
    assert parse_deb822_sources(DEB822, suite="bookw") == []


def test_deb822_skips_disabled_and_source_only_stanzas():
    text = (
        "Types: deb\nURIs: http://off.invalid/debian\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb-src\nURIs: http://src.invalid/debian\nSuites: bookworm\n\n"
        f"Types: deb\nURIs:\n {MIRROR}\nSuites: bookworm\n"
    )
    # The last stanza also checks a value given on a continuation line.
    assert parse_deb822_sources(text) == [MIRROR]


def test_one_line_format_with_options_and_comments():
    assert parse_one_line_sources(ONE_LINE) == [MIRROR]


def test_one_line_skips_unusable_schemes():
    text = f"deb cdrom:[Debian 12]/ bookworm main\ndeb {MIRROR} bookworm main\n"
    assert parse_one_line_sources(text) == [MIRROR]


def test_find_mirror_reads_each_file_in_its_own_format():
    sources = {
        "/etc/apt/sources.list": "# empty, as on a deb822 system\n",
        "/etc/apt/sources.list.d/debian.sources": DEB822.replace(MIRROR, MIRROR + "/"),
    }
    assert find_debian_mirror(sources) == MIRROR  # and without the trailing slash


def test_find_mirror_ignores_files_apt_ignores():
    sources = {
        "/etc/apt/sources.list.d/old.list.disabled": "deb http://old.invalid/d bookworm main\n",
        "/etc/apt/sources.list.d/debian.list": ONE_LINE,
    }
    assert find_debian_mirror(sources) == MIRROR


def test_missing_mirror_is_a_clear_error():
    sources = {"/etc/apt/sources.list.d/debian.sources": DEB822}
    with pytest.raises(BuildError) as error:
        find_debian_mirror(sources, suite="trixie")
    message = str(error.value)
    assert "trixie" in message
    assert "/etc/apt/sources.list.d/debian.sources" in message
    assert "FGPU_DEBIAN_MIRROR" in message


def test_no_source_files_at_all_is_a_clear_error():
    with pytest.raises(BuildError, match="no apt source files"):
        find_debian_mirror({})


# --- root filesystem --------------------------------------------------------------------------


def test_rootfs_hash_follows_the_package_list_not_its_order():
    packages = list(ROOTFS_PACKAGES)
    assert rootfs_hash(packages) == rootfs_hash(reversed(packages))
    assert rootfs_hash(packages) != rootfs_hash([*packages, "git"])
    assert rootfs_hash(packages) != rootfs_hash(packages, suite="trixie")


def test_rootfs_reference_names_suite_and_hash():
    digest = rootfs_hash()
    assert rootfs_reference(digest) == f"fgpu/rootfs:bookworm-{digest}"
    assert len(digest) == 12


def test_debootstrap_command():
    command = debootstrap_command("/tmp/root", MIRROR, ["python3", "tini"])
    assert command == [
        "debootstrap",
        "--variant=minbase",
        "--include=python3,tini",
        "bookworm",
        "/tmp/root",
        MIRROR,
    ]


# --- build order ------------------------------------------------------------------------------


def _image(name, base=None, recipe="r", **kw):
    return CatalogImage(
        name=name, display_name=name, image=f"fgpu/{name}:1", base=base, recipe=recipe, **kw
    )


def _names(images):
    return [image.name for image in images]


def test_bases_come_first_even_when_listed_last():
    catalog = Catalog((_image("child-a", base="mid"), _image("mid", base="root"), _image("root")))
    assert _names(build_order(catalog)) == ["root", "mid", "child-a"]


def test_named_entries_pull_in_their_bases_once():
    catalog = Catalog(
        (_image("root"), _image("a", base="root"), _image("b", base="root"), _image("c"))
    )
    assert _names(build_order(catalog, ["b", "a", "b"])) == ["root", "b", "a"]


def test_all_skips_entries_without_a_recipe_unless_they_are_a_base():
    catalog = Catalog(
        (_image("external", recipe=None), _image("other", recipe=None), _image("x", base="other"))
    )
    assert _names(build_order(catalog)) == ["other", "x"]


def test_unknown_name_lists_the_catalog():
    catalog = Catalog((_image("root"),))
    with pytest.raises(UnknownImageError, match="nope.*root"):
        build_order(catalog, ["nope"])


def test_a_base_loop_is_refused():
    catalog = Catalog((_image("a", base="b"), _image("b", base="a")))
    with pytest.raises(BuildError, match="loop"):
        build_order(catalog)


def test_shipped_catalog_builds_the_jupyter_base_first():
    order = _names(build_order(load_catalog()))
    assert order[0] == "python-3.11"
    assert set(order) == {"python-3.11", "scikit-learn-1.5", "scikit-learn-1.4"}


def test_all_leaves_out_heavy_images_but_a_name_builds_them():
    catalog = Catalog((_image("root"), _image("torch", base="root", prebuild=False)))
    assert _names(build_order(catalog)) == ["root"]
    assert _names(build_order(catalog, ["torch"])) == ["root", "torch"]


def test_shipped_catalog_has_two_versions_of_each_heavy_framework_by_name():
    catalog = load_catalog()
    for framework in ("pytorch", "tensorflow"):
        entries = [image for image in catalog.images if image.framework == framework]
        assert len({image.version for image in entries}) >= 2
        assert all(not image.prebuild and image.recipe for image in entries)
        for image in entries:
            assert _names(build_order(catalog, [image.name])) == ["python-3.11", image.name]


def test_heavy_images_built_behind_the_hub_are_the_offered_ones():
    catalog = Catalog(
        (
            _image("root"),
            _image("tf", base="root", prebuild=False),
            _image("cuda", base="root", prebuild=False, hidden=True),
            _image("ready", recipe=None, prebuild=False),
        )
    )
    assert heavy_names(catalog) == ["tf"]
    shipped = heavy_names(load_catalog())
    assert sorted(shipped) == ["pytorch-2.13-cpu", "tensorflow-2.15-cpu", "tensorflow-2.17-cpu"]


# --- local wheels -----------------------------------------------------------------------------

WHEELS = [
    "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
    "six-1.16.0-py2.py3-none-any.whl",
]


def test_wheel_patterns_pick_the_matching_files():
    image = _image("torch", wheels=("torch-2.13.0+cpu-cp311-*.whl",))
    assert select_wheels(image, WHEELS, "/w") == [WHEELS[0]]
    assert select_wheels(_image("plain"), WHEELS, "/w") == []


def test_a_missing_wheel_names_the_folder_and_the_setting():
    image = _image("torch", wheels=("torch-2.99*.whl",))
    with pytest.raises(BuildError, match=r"torch-2\.99\*\.whl.*in /w.*FGPU_WHEEL_DIR"):
        select_wheels(image, WHEELS, "/w")


# --- build arguments, hash, labels ------------------------------------------------------------


def test_build_args_include_base_image_and_hub_version():
    image = _image("sk", base="root", build_args={"SKLEARN_VERSION": "1.5.2"})
    args = build_args_for(image, "fgpu/root:1", "6.1.1")
    assert args == {
        "SKLEARN_VERSION": "1.5.2",
        "BASE_IMAGE": "fgpu/root:1",
        "JUPYTERHUB_VERSION": "6.1.1",
    }


def test_build_args_cannot_override_the_base_image():
    image = _image("sk", build_args={"BASE_IMAGE": "evil:latest"})
    assert build_args_for(image, "fgpu/rootfs:x", "6.1.1")["BASE_IMAGE"] == "fgpu/rootfs:x"


FILES = {"Dockerfile": b"FROM ${BASE_IMAGE}\n", "ca/host.crt": b"-----BEGIN CERTIFICATE-----"}
ARGS = {"BASE_IMAGE": "fgpu/base:1", "SKLEARN_VERSION": "1.5.2"}
BASE_ID = "sha256:" + "a" * 64


def test_recipe_hash_is_stable_across_dict_order():
    reordered_files = dict(reversed(list(FILES.items())))
    reordered_args = dict(reversed(list(ARGS.items())))
    assert recipe_hash(FILES, ARGS, BASE_ID) == recipe_hash(
        reordered_files, reordered_args, BASE_ID
    )


def test_recipe_hash_changes_with_a_build_arg():
    changed = {**ARGS, "SKLEARN_VERSION": "1.4.2"}
    assert recipe_hash(FILES, ARGS, BASE_ID) != recipe_hash(FILES, changed, BASE_ID)


def test_recipe_hash_changes_with_a_recipe_file():
    edited = {**FILES, "Dockerfile": b"FROM ${BASE_IMAGE}\nRUN true\n"}
    added = {**FILES, "extra.py": b""}
    renamed = {"Dockerfile.old" if k == "Dockerfile" else k: v for k, v in FILES.items()}
    original = recipe_hash(FILES, ARGS, BASE_ID)
    assert len({original, *(recipe_hash(f, ARGS, BASE_ID) for f in (edited, added, renamed))}) == 4


def test_recipe_hash_changes_with_the_base_image_id():
    assert recipe_hash(FILES, ARGS, BASE_ID) != recipe_hash(FILES, ARGS, "sha256:" + "b" * 64)


def test_image_labels():
    image = _image("sk", framework="scikit-learn", version="1.5.2")
    assert image_labels(image, "abc") == {
        LABEL_RECIPE_HASH: "abc",
        LABEL_CATALOG_NAME: "sk",
        LABEL_FRAMEWORK: "scikit-learn",
        LABEL_VERSION: "1.5.2",
    }


def test_failure_message_carries_the_last_log_lines():
    message = failure_message("building x", "exit code 1\n", ["Step 3/9", "ERROR: no wheel"])
    assert message.startswith("building x failed: exit code 1")
    assert message.endswith("Step 3/9\nERROR: no wheel")


# --- build context (temporary files only) -----------------------------------------------------


def test_context_holds_the_recipe_and_the_host_ca_certificates(tmp_path):
    ca_dir = tmp_path / "host-ca"
    (ca_dir / "sub").mkdir(parents=True)
    (ca_dir / "corp.crt").write_text("corp")
    (ca_dir / "sub" / "proxy.crt").write_text("proxy")
    (ca_dir / "README").write_text("not a certificate")
    image = load_catalog().get("python-3.11")
    context = tmp_path / "context"
    prepare_context(image, context, ca_dir=ca_dir)
    assert "ARG BASE_IMAGE" in (context / "Dockerfile").read_text()
    assert (context / "ca" / "corp.crt").read_text() == "corp"
    assert (context / "ca" / "sub" / "proxy.crt").read_text() == "proxy"
    assert not (context / "ca" / "README").exists()


def test_context_without_host_certificates_still_has_the_ca_folder(tmp_path):
    image = load_catalog().get("scikit-learn-1.4")
    prepare_context(image, tmp_path / "context", ca_dir=tmp_path / "missing")
    assert (tmp_path / "context" / "ca").is_dir()
    assert (tmp_path / "context" / "wheels").is_dir()
    assert (tmp_path / "context" / "Dockerfile").is_file()


def test_context_carries_only_the_entrys_local_wheels(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in WHEELS:
        (wheels / name).write_bytes(name.encode())
    image = load_catalog().get("pytorch-2.13-cpu")
    context = tmp_path / "context"
    prepare_context(image, context, ca_dir=tmp_path / "missing", wheels_from=wheels)
    assert sorted(p.name for p in (context / "wheels").iterdir()) == [WHEELS[0]]
    assert (context / "wheels" / WHEELS[0]).read_bytes() == WHEELS[0].encode()


def test_context_with_the_wheel_missing_fails_before_any_build(tmp_path):
    image = load_catalog().get("pytorch-2.13-cpu")
    with pytest.raises(BuildError, match="no wheel matching"):
        prepare_context(image, tmp_path / "context", wheels_from=tmp_path / "empty")


# --- command line (fails before any Docker call) ----------------------------------------------


def test_cli_unknown_name_exits_2(capsys):
    assert main(["build", "no-such-image"]) == 2
    assert "no-such-image" in capsys.readouterr().err


def test_cli_build_needs_names_or_all():
    with pytest.raises(SystemExit) as exit_info:
        main(["build"])
    assert exit_info.value.code == 2


def test_cli_heavy_names_each_image_it_could_not_build(tmp_path, capsys, monkeypatch):
    """A missing wheel fails that image alone, before any download or Docker call."""
    monkeypatch.setenv("FGPU_WHEEL_DIR", str(tmp_path))
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "images:\n"
        "  - {name: base, image: fgpu/base:1}\n"
        "  - {name: torch, image: fgpu/torch:1, recipe: pytorch, base: base, prebuild: false,\n"
        "     wheels: ['torch-9.9-*.whl']}\n"
    )
    assert main(["--catalog", str(catalog), "build", "--heavy"]) == 1
    err = capsys.readouterr().err
    assert f"torch: no wheel matching 'torch-9.9-*.whl' in {tmp_path}" in err
    assert err.rstrip().endswith("error: not built: torch")


def test_cli_list_shows_every_entry(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in load_catalog().names():
        assert name in out
