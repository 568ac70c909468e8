"""The results store's common case without SQLAlchemy: verify an SQLite file that already is a store of this
version, and append one run to it, with the standard library's ``sqlite3`` (the driver SQLAlchemy itself uses for
SQLite), in ``BEGIN IMMEDIATE`` transactions with the same busy timeout. ``parity.results.store`` decides when."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


def existing_store(url: str, schema: str, version: str, timeout_s: float) -> Path | None:
    """The file of ``sqlite:///FILE`` where it already is a parity store of ``schema`` and ``version``, read in a
    ``BEGIN IMMEDIATE`` transaction as the SQLAlchemy check reads it (so a writer holding it is waited for); None
    for anything else (no file yet, not a store, another version, locked past the timeout, another URL), which the
    caller then opens or refuses through SQLAlchemy, with its reason."""
    prefix = "sqlite:///"
    path = url[len(prefix) :] if url.startswith(prefix) else ""
    if not path or "?" in path or path == ":memory:" or not os.path.isfile(path):
        return None
    try:  # mode=rw: never create a file here
        connection = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=timeout_s, isolation_level=None)
    except sqlite3.Error:
        return None
    try:
        connection.execute("BEGIN IMMEDIATE")
        tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        meta = dict(connection.execute("SELECT key, value FROM meta").fetchall()) if "meta" in tables else {}
        connection.execute("ROLLBACK")
    except sqlite3.Error:
        return None
    finally:
        connection.close()
    ours = {"meta", "runs", "series", "cells"} <= tables
    return Path(path) if ours and meta.get("schema") == schema and meta.get("version") == version else None


def append(path: Path, run: dict, series: list[dict], timeout_s: float) -> None:
    """Insert ``run`` into ``runs`` and ``series`` into ``series`` in one transaction (all or nothing); raises
    ``sqlite3.OperationalError`` (locked past ``timeout_s``, not a database) for the caller to word."""
    connection = sqlite3.connect(path, timeout=timeout_s, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        try:
            connection.execute(_insert("runs", run), tuple(run.values()))
            if series:
                connection.executemany(_insert("series", series[0]), [tuple(row.values()) for row in series])
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
    finally:
        connection.close()


def _insert(table: str, row: dict) -> str:
    """``INSERT`` of one row's columns (names of the store's own tables, never user text) as ``?`` parameters."""
    return f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})"
