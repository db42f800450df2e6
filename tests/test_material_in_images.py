"""Every session image the hub builds and offers can pull a course's material by one link
(queue_service/core/material_links.py): git is in its root filesystem, and nbgitpuller, the
server extension that serves `/git-pull`, is enabled in its Jupyter server.

scripts/test builds the images first; a missing one fails here, never skips.
"""

from __future__ import annotations

import re

import pytest

from image_catalog import load_catalog

from .harness import docker_client

pytestmark = [pytest.mark.docker]

#: The images a course's students may be given: every entry with a recipe that is offered.
OFFERED = [image for image in load_catalog().images if image.recipe and not image.hidden]
CHECK = "git --version && jupyter server extension list 2>&1"
#: The colours `jupyter server extension list` writes its states in.
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


@pytest.mark.parametrize("image", OFFERED, ids=lambda image: image.name)
def test_an_offered_image_has_git_and_nbgitpuller(image):
    output = docker_client().containers.run(
        image.image, ["sh", "-c", CHECK], remove=True, network_disabled=True
    )
    text = COLOURS.sub("", output.decode())
    assert text.startswith("git version 2."), text
    assert "nbgitpuller enabled" in text, text
