"""Platform helpers every stage may use: typed errors, the crash-safe file system, the cache folder and its
locks, the environment manifest, devices, precision flags. Imports nothing else of parity.
"""
