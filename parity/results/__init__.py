"""The results store (SQLite by default, any SQLAlchemy URL), history over its runs, step detection, comparison with
a stored baseline. Imports stages up to report (never pipeline)."""
