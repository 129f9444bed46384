"""Local development and test tooling. Never part of the deploy archive."""
