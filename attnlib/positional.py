"""Positional encodings (placeholder: written in a later commit)."""
