"""The image catalog: which single-user images exist, what they hold, and how to build them.

A leaf package: both the spawner and the queue service import it; it imports neither.
"""

from .catalog import Catalog, CatalogError, CatalogImage, load_catalog, parse_image

__all__ = ["Catalog", "CatalogError", "CatalogImage", "load_catalog", "parse_image"]
