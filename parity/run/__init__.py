"""How one step of a path runs: the path matrix, worker processes, their export and check tasks, the export
cache and what an export came from. Imports every stage before it, never bench, diagnose, report or pipeline.
"""
