"""The results store: every ``run``, ``check`` and ``bench`` appended to one database, the memory ``history`` and
``--against`` read.

SQLite in the workspace by default (``.parity/results.sqlite``), any SQLAlchemy URL for a shared server. Tables:
``meta`` (what this store is: ``schema`` = ``parity.store``, ``version``), ``runs`` (one per run: id, time, command,
workspace, git commit, hardware, device, precision, exit code, the whole result document as JSON with its
environment manifest, package versions and raw samples) and ``series`` (one row per path checked and per series
timed: verdict, worst error in tolerance units, median with its CI, spread, runs, raw samples), for queries.

A run is appended in one transaction (``BEGIN IMMEDIATE`` on SQLite: concurrent writers wait for each other up to
``LOCK_TIMEOUT_S``, none is lost); a store that is not a parity store, was written by another schema version, is
locked past the timeout, or names a driver that is not installed is refused with one line (``StoreError``), before
anything is written.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import sqlite3
import subprocess
import time
from pathlib import Path

from parity.platform.errors import UsageError, one_line
from parity.report.json_report import sanitize
from parity.results import sqlite_fast

SCHEMA, VERSION = "parity.store", 3
# columns each version added to ``series``, for the migration of a store written by an older one
ADDED = {2: ("peak_rss_mb", "artifact_mb"), 3: ("gate_value", "gate_golden")}
DEFAULT = Path(".parity") / "results.sqlite"
# the columns of ``series`` a run fills (all but its own id), in the order of the table (a test compares them)
SERIES_COLUMNS = (
    "run_id",
    "model",
    "path",
    "device",
    "precision",
    "kind",
    "key",
    "verdict",
    "reason",
    "tol_units",
    "median_ms",
    "ci_lo_ms",
    "ci_hi_ms",
    "spread",
    "runs",
    "samples_ms",
    "peak_rss_mb",
    "artifact_mb",
    "gate_value",
    "gate_golden",
)
LOCK_TIMEOUT_S = 30.0


class StoreError(UsageError):
    """A store that cannot be used: one line, exit code 2."""


def default_url(workspace_root: Path) -> str:
    return f"sqlite:///{(Path(workspace_root) / DEFAULT).resolve()}"


def _tables(sa):
    metadata = sa.MetaData()
    meta = sa.Table(
        "meta", metadata, sa.Column("key", sa.String(64), primary_key=True), sa.Column("value", sa.Text, nullable=False)
    )
    runs = sa.Table(
        "runs",
        metadata,
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("created", sa.Float, nullable=False, index=True),
        sa.Column("command", sa.String(32), nullable=False),
        sa.Column("workspace", sa.Text, nullable=False),
        sa.Column("git_commit", sa.String(64)),
        sa.Column("hardware", sa.Text, nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("precision", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer, nullable=False),
        sa.Column("document", sa.Text, nullable=False),
    )
    series = sa.Table(
        "series",
        metadata,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(40), sa.ForeignKey("runs.id"), nullable=False, index=True),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("path", sa.String(200), nullable=False),
        sa.Column("device", sa.String(32), nullable=False),
        sa.Column("precision", sa.String(16), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),  # check | batch | shape | train_step | ttft | decode_step
        sa.Column("key", sa.String(200), nullable=False),  # the batch size or shape; "" for check and train_step
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("tol_units", sa.Float),
        sa.Column("median_ms", sa.Float),
        sa.Column("ci_lo_ms", sa.Float),
        sa.Column("ci_hi_ms", sa.Float),
        sa.Column("spread", sa.Float),
        sa.Column("runs", sa.Integer),
        sa.Column("samples_ms", sa.Text),
        sa.Column("peak_rss_mb", sa.Float),  # the series' peak resident memory above its worker's idle size
        sa.Column("artifact_mb", sa.Float),
        sa.Column("gate_value", sa.Float),  # a quantized path's check: its gate metric, and the float64 golden's
        sa.Column("gate_golden", sa.Float),
    )
    cells = sa.Table(
        "cells",
        metadata,  # each cell of a distributed run as it finishes: what --resume keeps
        sa.Column("run_id", sa.String(40), primary_key=True),
        sa.Column("cell", sa.String(400), primary_key=True),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("result", sa.Text, nullable=False),
    )
    return metadata, meta, runs, series, cells


def hardware(env: dict) -> str:
    """What timings depend on, as one string: CPU model and count, GPU name(s)."""
    gpu = env.get("gpu")
    gpus = (
        ", ".join(g.get("name", "?") for g in gpu)
        if isinstance(gpu, list)
        else (gpu or {}).get("name")
        if isinstance(gpu, dict)
        else None
    )
    return f"{env.get('cpu') or 'unknown CPU'} x{env.get('cpu_count')}" + (f"; {gpus}" if gpus else "")


def git_commit(folder: Path) -> str | None:
    """The commit the workspace is at (``+dirty`` with uncommitted changes), None outside a git repository."""
    try:
        head = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _finite(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) else None


def series_rows(document: dict) -> list[dict]:
    """One row per path checked and per series timed, from a result document."""
    rows = []
    for r in document.get("results", []):
        base = {
            "model": r["model"],
            "path": r["path"],
            "device": r.get("device") or "cpu",
            "precision": r.get("precision") or "fp32",
        }
        worst = max(
            (_finite(s.get("tol_units")) or 0.0 for s in (r.get("outputs") or {}).values() if isinstance(s, dict)),
            default=None,
        )
        gate = r.get("gate") or {}
        if "value" in gate:  # judged by the task metric: its int8 outputs are off by more than any tolerance
            worst = None
        rows.append(
            {
                **base,
                "kind": "check",
                "key": "",
                "verdict": r["verdict"],
                "reason": r.get("reason"),
                "tol_units": worst,
                "gate_value": _finite(gate.get("value")),
                "gate_golden": _finite(gate.get("golden")),
            }
        )
        timing = r.get("timing") or {}
        entries = [("batch", k, e) for k, e in (timing.get("batches") or {}).items()]
        entries += [("shape", k, e) for k, e in (timing.get("shapes") or {}).items()]
        if timing.get("train_step"):
            entries.append(("train_step", "", timing["train_step"]))
        for kind, key, e in entries:
            ci = e.get("ci95_ms") or [None, None]
            rows.append(
                {
                    **base,
                    "kind": kind,
                    "key": str(key),
                    "verdict": e.get("verdict") or "error",
                    "reason": e.get("reason"),
                    "median_ms": _finite(e.get("median_ms")),
                    "ci_lo_ms": _finite(ci[0]),
                    "ci_hi_ms": _finite(ci[1]),
                    "spread": _finite(e.get("spread")),
                    "runs": e.get("runs"),
                    "samples_ms": json.dumps(e["samples_ms"]) if e.get("samples_ms") else None,
                    "peak_rss_mb": _finite((e.get("memory") or {}).get("peak_rss_mb")),
                    "artifact_mb": _finite(e.get("artifact_mb")),
                }
            )
        rows += _generation_rows(r, base)
    return rows


GENERATION_KINDS = {"ttft": "ttft_ms", "decode_step": "decode_step_ms"}  # series kind -> its interval in the row


def _generation_rows(result: dict, base: dict) -> list[dict]:
    """A generation path's timed series (``generation.timing``): per batch size its time to first token and its
    decode step time, each with its median, 95 % interval and raw samples (one per generation); the series' peak
    memory is told once, on the decode step's row."""
    block = result.get("generation")
    timing = block.get("timing") if isinstance(block, dict) else None
    batches = timing.get("batches") if isinstance(timing, dict) else None
    rows = []
    for key, entry in batches.items() if isinstance(batches, dict) else ():
        if not isinstance(entry, dict):
            continue
        samples: dict = entry["samples_ms"] if isinstance(entry.get("samples_ms"), dict) else {}
        for kind, field in GENERATION_KINDS.items():
            interval: dict = entry[field] if isinstance(entry.get(field), dict) else {}
            rows.append(
                {
                    **base,
                    "kind": kind,
                    "key": str(key),
                    "verdict": "pass" if _finite(interval.get("median")) else "error",
                    "reason": None if _finite(interval.get("median")) else f"no {field} in its timing",
                    "median_ms": _finite(interval.get("median")),
                    "ci_lo_ms": _finite(interval.get("low")),
                    "ci_hi_ms": _finite(interval.get("high")),
                    "runs": interval.get("n") if isinstance(interval.get("n"), int) else None,
                    "samples_ms": json.dumps(samples[kind]) if samples.get(kind) else None,
                    "peak_rss_mb": _finite(entry.get("peak_rss_mb")) if kind == "decode_step" else None,
                }
            )
    return rows


def new_run_id() -> str:
    """Sortable by time, unique across machines: ``20261125-170304-3fa9c1``."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(3)


class Store:
    """An opened, verified store. ``Store.open(url)`` creates an empty SQLite store where none exists.

    An SQLite file that already is a store of this version is verified and appended to with the standard library's
    ``sqlite3`` (SQLAlchemy's own SQLite driver, with the same ``BEGIN IMMEDIATE`` transactions and busy timeout):
    a check that only appends its run never imports SQLAlchemy (about 0.17 s). Everything else (a new
    store, a migration, a server URL, every query) goes through SQLAlchemy, made on first use."""

    def __init__(self, engine, url: str, sa, sqlite_file: Path | None = None):
        self.url, self.sqlite_file = url, sqlite_file
        if engine is not None:
            self._use(engine, sa)

    def _use(self, engine, sa) -> None:
        self.engine, self.sa = engine, sa
        self.metadata, self.meta, self.runs, self.series, self.cells = _tables(sa)

    def __getattr__(self, name: str):
        # the SQLAlchemy side of a store opened with sqlite3, made when a query first needs it
        if name in ("engine", "sa", "metadata", "meta", "runs", "series", "cells") and self.__dict__.get("sqlite_file"):
            import sqlalchemy as sa

            self._use(_sqlite_engine(sa, f"sqlite:///{self.sqlite_file}"), sa)
            return self.__dict__[name]
        raise AttributeError(name)

    @classmethod
    def open(cls, url: str, create: bool = True) -> Store:
        existing = sqlite_fast.existing_store(url, SCHEMA, str(VERSION), LOCK_TIMEOUT_S)
        if existing is not None:
            return cls(None, url, None, sqlite_file=existing)
        try:
            import sqlalchemy as sa
        except ImportError:
            raise StoreError("the results store needs SQLAlchemy: pip install sqlalchemy") from None
        shown = _shown(url)
        try:
            parsed = sa.engine.make_url(url)
        except Exception as error:  # noqa: BLE001 - SQLAlchemy's URL parser raises several kinds
            raise StoreError(one_line(f"--store {shown}: not a database URL ({error})", 300)) from None
        sqlite = parsed.get_backend_name() == "sqlite"
        if sqlite and parsed.database not in (None, "", ":memory:"):
            path = Path(parsed.database)
            if not path.exists():
                if not create:
                    raise StoreError(f"no results store at {path}: nothing has been stored there yet")
                path.parent.mkdir(parents=True, exist_ok=True)
            elif not path.is_file():
                raise StoreError(f"--store {path} is not a file")
        try:
            engine = _sqlite_engine(sa, url) if sqlite else sa.create_engine(url)
        except (ImportError, sa.exc.NoSuchModuleError) as error:
            raise StoreError(
                one_line(
                    f"--store {shown}: its database driver is not installed ({error}); install "
                    "it, e.g. pip install psycopg2-binary for postgresql://",
                    300,
                )
            ) from None
        except sa.exc.ArgumentError as error:
            raise StoreError(one_line(f"--store {shown}: {error}", 300)) from None
        store = cls(engine, shown, sa)
        store._verify_or_create()
        return store

    def _refuse(self, why: str) -> StoreError:
        return StoreError(one_line(f"results store {self.url}: {why}", 300))

    def _verify_or_create(self) -> None:
        sa = self.sa
        try:
            with self.engine.begin() as conn:
                names = set(sa.inspect(conn).get_table_names())
                if not names:
                    self.metadata.create_all(conn)
                    conn.execute(
                        self.meta.insert(),
                        [{"key": "schema", "value": SCHEMA}, {"key": "version", "value": str(VERSION)}],
                    )
                    return
                if "meta" not in names:
                    raise self._refuse(f"not a parity store (it has tables {', '.join(sorted(names))}, no 'meta')")
                meta = dict(conn.execute(sa.select(self.meta.c.key, self.meta.c.value)).all())
        except StoreError:
            raise
        except sa.exc.OperationalError as error:
            raise self._refuse(_operational(error)) from None
        except sa.exc.DatabaseError as error:
            raise self._refuse(f"not a parity store (not a database this driver reads: {_orig(error)})") from None
        if meta.get("schema") != SCHEMA:
            raise self._refuse(f"not a parity store (its schema is {meta.get('schema')!r})")
        version = meta.get("version")
        if version in {str(v) for v in range(1, VERSION)}:
            self._migrate(int(version))
        elif version != str(VERSION):
            raise self._refuse(
                f"written by store schema version {version}, this parity reads version {VERSION} "
                "(no migration between them): use a parity of that version, or a new --store"
            )

    def _migrate(self, version: int) -> None:
        """A store of an older version brought to this one in one transaction: the columns added since (its older
        rows hold none of their figures)."""
        sa = self.sa
        with self.engine.begin() as conn:
            for newer in range(version + 1, VERSION + 1):
                for name in ADDED[newer]:
                    conn.execute(sa.text(f"ALTER TABLE series ADD COLUMN {name} FLOAT"))
            conn.execute(self.meta.update().where(self.meta.c.key == "version").values(value=str(VERSION)))

    def add_cell(self, run_id: str, cell: str, result: dict) -> None:
        """One finished cell of a distributed run, kept so that ``--resume`` reruns only the cells without one."""
        row = {
            "run_id": run_id,
            "cell": cell,
            "created": time.time(),
            "result": json.dumps(sanitize(result), allow_nan=False),
        }
        try:
            with self.engine.begin() as conn:
                conn.execute(self.cells.delete().where((self.cells.c.run_id == run_id) & (self.cells.c.cell == cell)))
                conn.execute(self.cells.insert(), [row])
        except self.sa.exc.OperationalError as error:
            raise self._refuse(_operational(error)) from None

    def cell_results(self, run_id: str) -> dict[str, dict]:
        """The finished cells of ``run_id`` (cell -> result); a run id the store has never seen is refused."""
        sa = self.sa
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(self.cells.c.cell, self.cells.c.result).where(self.cells.c.run_id == run_id)
            ).all()
            known = rows or conn.execute(sa.select(self.runs.c.id).where(self.runs.c.id == run_id)).first()
        if not known:
            raise self._refuse(f"has no run {run_id!r} to resume")
        return {cell: json.loads(result) for cell, result in rows}

    def append(self, document: dict, command: str, workspace: Path, exit_code: int, run_id: str | None = None) -> str:
        """Append one run (its document and series rows) in one transaction; its run id (``run_id``: one given
        before the run, under which its cells were kept)."""
        run_id = run_id or new_run_id()
        env = document.get("env") or {}
        results = document.get("results") or [{}]
        row = {
            "id": run_id,
            "created": time.time(),
            "command": command,
            "workspace": str(workspace),
            "git_commit": git_commit(workspace),
            "hardware": hardware(env),
            "device": results[0].get("device") or "cpu",
            "precision": results[0].get("precision") or "fp32",
            "exit_code": exit_code,
            "document": json.dumps(sanitize({**document, "run_id": run_id}), allow_nan=False),
        }
        if "engine" not in self.__dict__:  # opened with sqlite3: appended with it
            series = [{c: r.get(c) for c in SERIES_COLUMNS} | {"run_id": run_id} for r in series_rows(document)]
            assert self.sqlite_file is not None  # a store without an engine was opened on its file
            try:
                sqlite_fast.append(self.sqlite_file, row, series, LOCK_TIMEOUT_S)
            except sqlite3.OperationalError as error:
                raise self._refuse(_operational(error)) from None
            return run_id
        try:
            with self.engine.begin() as conn:
                conn.execute(self.runs.insert(), [row])
                columns = [c.name for c in self.series.columns if c.name != "id"]
                rows = [{c: r.get(c) for c in columns} | {"run_id": run_id} for r in series_rows(document)]
                if rows:
                    conn.execute(self.series.insert(), rows)
        except self.sa.exc.OperationalError as error:
            raise self._refuse(_operational(error)) from None
        return run_id

    def run_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(self.sa.select(self.runs.c.id).order_by(self.runs.c.created)).scalars())

    def document(self, run_id: str) -> dict:
        """The stored result document of ``run_id`` (``last``: the newest run)."""
        sa = self.sa
        query = sa.select(self.runs.c.document)
        query = (
            query.order_by(self.runs.c.created.desc()).limit(1)
            if run_id == "last"
            else query.where(self.runs.c.id == run_id)
        )
        with self.engine.connect() as conn:
            found = conn.execute(query).scalar()
        if found is None:
            raise self._refuse("holds no run yet" if run_id == "last" else f"has no run {run_id!r}")
        return json.loads(found)

    def history(self, models=(), patterns=(), with_env: bool = True) -> list[dict]:
        """Every run (oldest first) as ``{"id", "created", "git_commit", "hardware", "env", "rows"}``, its series rows
        (without their raw samples) restricted to ``models`` and path globs ``patterns``; ``env`` (each run's
        environment manifest, read from its whole document) only ``with_env``."""
        from fnmatch import fnmatchcase

        sa = self.sa
        columns = [self.runs.c.id, self.runs.c.created, self.runs.c.git_commit, self.runs.c.hardware]
        series = sa.select(*(c for c in self.series.columns if c.name != "samples_ms")).order_by(self.series.c.id)
        if models:
            series = series.where(self.series.c.model.in_(list(models)))
        with self.engine.connect() as conn:
            runs = conn.execute(
                sa.select(*columns, *([self.runs.c.document] if with_env else [])).order_by(self.runs.c.created)
            ).all()
            rows = conn.execute(series).mappings().all()
        by_run: dict[str, list[dict]] = {}
        for row in rows:
            if not patterns or any(fnmatchcase(row["path"], p) for p in patterns):
                by_run.setdefault(row["run_id"], []).append(dict(row))
        return [
            {
                "id": r.id,
                "created": r.created,
                "git_commit": r.git_commit,
                "hardware": r.hardware,
                "env": (json.loads(r.document).get("env") or {}) if with_env else None,
                "rows": by_run.get(r.id, []),
            }
            for r in runs
        ]


def _sqlite_engine(sa, url: str):
    engine = sa.create_engine(url, connect_args={"timeout": LOCK_TIMEOUT_S})
    _immediate_transactions(sa, engine)
    return engine


def _immediate_transactions(sa, engine) -> None:
    """SQLite: every transaction takes the write lock when it begins, so two writers queue on the busy timeout
    instead of one failing at once on a lock upgrade (pysqlite's own transaction handling is turned off)."""

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record):
        dbapi_connection.isolation_level = None

    @sa.event.listens_for(engine, "begin")
    def _begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def _orig(error) -> str:
    return str(getattr(error, "orig", error)).strip()


def _operational(error) -> str:
    text = _orig(error)
    if "locked" in text or "busy" in text:
        return f"locked by another process for more than {LOCK_TIMEOUT_S:g} s ({text})"
    if "file is not a database" in text or "malformed" in text:
        return f"not a parity store (not an SQLite database: {text})"
    return f"cannot be used ({text})"


def _shown(url: str) -> str:
    """The URL with any password masked (it goes into messages)."""
    try:
        import sqlalchemy as sa

        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - shown as given where it does not parse
        return url


def resolve(url: str | None, workspace_root: Path) -> str:
    """``--store`` as given (a bare path: an SQLite file), else ``$PARITY_STORE``, else the workspace's own."""
    url = url or os.environ.get("PARITY_STORE")
    if not url:
        return default_url(workspace_root)
    return url if "://" in url else f"sqlite:///{os.path.abspath(url)}"
