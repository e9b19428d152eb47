"""The distsched version: a module of its own, so any module can name it without a circle."""

__version__ = "0.1.0"
