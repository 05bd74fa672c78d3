"""graph layer (see docs/architecture.md)."""
