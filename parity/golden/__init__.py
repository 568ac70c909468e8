"""Golden data: read and verify a golden folder, build it (the zoo's in three frameworks, a user model's in one)
and its worker tasks. Imports platform, interop, model, check, and the sources and runtimes its tasks run.
"""
