"""Thin clients of the Carousel REST API: one configuration, one HTTP client, one way of
reporting errors (carousel_client.api), and the programs built on them (cli, xrd)."""
__version__ = "0.1.0"
