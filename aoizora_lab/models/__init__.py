"""Models the planner optimises: Wan 2.1 DiT, its attention backends and parallel strategies."""
