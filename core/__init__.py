"""Framework-agnostic annealed GP-UCB tuning for HMC (NumPy or jax.numpy)."""
