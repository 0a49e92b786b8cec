"""Coarsening methods, one module each, discovered by :mod:`celeritas_cli.registry`."""
