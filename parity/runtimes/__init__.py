"""Runtimes: each implements the ``Runner`` contract of ``parity.runtimes.base``."""
