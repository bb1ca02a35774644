"""Plugins for PyMC, NumPyro and BlackJAX; each imports only its own framework."""
