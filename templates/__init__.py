"""Jinja templates for the spawn form and the service's pages (package data, so installs carry them)."""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).parent
