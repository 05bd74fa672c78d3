"""deploy layer (see docs/architecture.md)."""
