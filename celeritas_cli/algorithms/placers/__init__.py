"""Operator placers: the papers' algorithms and their baselines, one module each."""
