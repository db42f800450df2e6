"""Sphinx configuration of the fGPU hub's documentation site (built by `scripts/docs`)."""

import sys
from pathlib import Path

here = Path(__file__).resolve().parent
# The repository's packages, for autodoc-traits and the generated reference pages.
sys.path.insert(0, str(here.parents[1]))
sys.path.insert(0, str(here / "_ext"))

project = "fGPU hub"
author = "the fGPU hub's authors"
copyright = "the fGPU hub's authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "autodoc_traits",
    "fgpu_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The configurable classes' own help text: only what they document, in the order they define it.
autodoc_member_order = "bysource"
autodoc_typehints = "none"

html_theme = "pydata_sphinx_theme"
html_title = "fGPU hub"
html_static_path = ["_static"]
# Long code in table cells (test paths, scopes) wraps, so that tables fit a desktop's width.
html_css_files = ["fgpu.css"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_show_sourcelink = False
