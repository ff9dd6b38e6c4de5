"""The package version (one place; ``pyproject.toml`` reads it from here).  Ground floor."""

__version__ = "0.2.0"
