"""checkpoint layer (see docs/architecture.md)."""
