"""Verifying rollout files: the checks of DESIGN section 7, cheapest first, and the `prime-validate` CLI."""
