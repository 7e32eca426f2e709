"""The engine: the model, inference, generation and proofs (docs/architecture.md)."""
