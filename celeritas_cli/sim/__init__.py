"""Simulation: the discrete-event simulator (the one judge) and its pictures."""
