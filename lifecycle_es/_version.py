"""The distribution's version, read by the build (pyproject's dynamic version) and by ``__version__``."""

__version__ = "0.2.0"
