"""Measured experiments the chapters plot (placeholder: written in a later commit)."""
