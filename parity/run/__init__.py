"""How one step of a path runs: the path matrix, worker processes (inside one, the parent's handles, the pool), their
export and check tasks, the export cache and what an export came from. Imports every stage before it, never bench,
diagnose, report or pipeline.
"""
