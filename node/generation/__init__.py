"""Turning (pool, node, step, counter) into a rollout file: the plan both sides derive, and the generation."""
