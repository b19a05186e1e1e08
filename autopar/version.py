"""The release of the autopar package (part of every plan-cache key and ``autopar --version``)."""

__version__ = "0.1.0"
