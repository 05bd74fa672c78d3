"""api layer (see docs/architecture.md)."""
