"""Providers: one folder per vendor, reached through shared/providers/registry.py."""
