"""The protocol kernel: what every role of a pool must agree on (docs/architecture.md)."""
