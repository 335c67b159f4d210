"""ddpipe's version: what the decode service's peers compare, and what the package says it is."""

__version__ = "0.1.0"
