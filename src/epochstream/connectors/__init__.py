"""connectors layer (see docs/architecture.md)."""
