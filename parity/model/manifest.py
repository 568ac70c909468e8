"""The golden manifest: parsed defensively, validated against a declared JSON Schema, sealed by a digest.

``manifest.json`` decides verdicts (golden metrics, the files' sha256, shapes and dtypes), so it
is verified like every golden array: its ``digest`` field is the sha256 of the canonical JSON of
every other field (sorted keys, no whitespace), and an edit that does not also recompute it is
refused. The schema (``schemas/golden-manifest.schema.json``) is the contract; any violation is
one line naming the file and the field.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from importlib import resources
from pathlib import Path

from parity.platform.errors import GoldenError, one_line

SCHEMA = "parity.golden/3"
UPGRADABLE = ("parity.golden/2",)  # older schemas `parity golden upgrade` brings to SCHEMA
MAX_BYTES = 16 << 20


def canonical_digest(manifest: dict) -> str:
    """sha256 of the canonical JSON of every field but ``digest``."""
    body = {key: value for key, value in manifest.items() if key != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def seal(manifest: dict) -> dict:
    """``manifest`` with its ``digest`` set."""
    return {**{key: value for key, value in manifest.items() if key != "digest"}, "digest": canonical_digest(manifest)}


SCHEMA_FILE = "schemas/golden-manifest.schema.json"

# sha256 of the manifest bytes this process has already found valid against the schema: the same bytes parse to
# the same document, so its schema verdict is the same (the digest and the folder are still checked on every read)
_SCHEMA_VALID: set[str] = set()
# the same verdicts kept across processes: one empty file per (schema, manifest bytes) found valid, under the cache
# folder, so a later command neither imports jsonschema (about 0.07 s) nor validates again
VALID_FOLDER = "manifests-valid"


def schema_document() -> dict:
    """The manifest's JSON Schema, as shipped in the package (checked against its metaschema by the tests)."""
    return json.loads(_schema_text())


@functools.cache
def _schema_text() -> str:
    beside = Path(__file__).resolve().parents[1] / SCHEMA_FILE  # a package on disk: no resource reader to import
    return beside.read_text() if beside.is_file() else resources.files("parity").joinpath(SCHEMA_FILE).read_text()


def _verdict_file(manifest_sha256: str) -> Path:
    """Where the verdict "these manifest bytes are valid against this schema" is kept: named by the sha256 of both,
    so a changed manifest or a changed schema is validated afresh."""
    from parity.platform.cache_dir import cache_root

    schema_sha256 = hashlib.sha256(_schema_text().encode()).hexdigest()
    key = hashlib.sha256(f"{schema_sha256}:{manifest_sha256}".encode()).hexdigest()
    return cache_root() / VALID_FOLDER / key[:2] / key


def _known_valid(manifest_sha256: str) -> bool:
    if manifest_sha256 in _SCHEMA_VALID:
        return True
    try:
        found = _verdict_file(manifest_sha256).is_file()
    except OSError:
        return False
    if found:
        _SCHEMA_VALID.add(manifest_sha256)
    return found


def _remember_valid(manifest_sha256: str) -> None:
    _SCHEMA_VALID.add(manifest_sha256)
    try:  # only a saving: a cache folder that cannot be written means validating again next time
        path = _verdict_file(manifest_sha256)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


@functools.cache
def _validator():
    import jsonschema

    return jsonschema.Draft202012Validator(schema_document())


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _field(error) -> str:
    return (
        "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path).lstrip(".")
        or "(top level)"
    )


def rebuild_hint(model: str) -> str:
    return f"rebuild deliberately with `parity golden build --model {model}`"


def upgrade_hint(model: str) -> str:
    return f"upgrade it with `parity golden upgrade --model {model}` (its arrays stay as they are)"


def read(path: Path, allow_older: bool = False) -> dict:
    """Parse, schema-check and digest-check ``path``; raise ``GoldenError`` (one line) on any problem.
    ``allow_older``: a manifest of an ``UPGRADABLE`` schema is read too (its digest checked, its schema not:
    this parity ships only the current schema), for ``parity golden upgrade``.

    Every read parses the file's bytes afresh and checks the digest and the folder; the schema check is skipped
    only for bytes (by their sha256) already found valid against this schema, by this process or an earlier one
    (a verdict file under the cache folder)."""
    path = Path(path)
    model = path.parent.name
    if not path.is_file():
        raise GoldenError(f"{path}: golden manifest missing; build it with `parity golden build --model {model}`")
    try:
        if path.stat().st_size > MAX_BYTES:
            raise GoldenError(f"{path}: malformed manifest (larger than {MAX_BYTES >> 20} MiB)")
        data = path.read_bytes()
        sha256 = hashlib.sha256(data).hexdigest()
        manifest = json.loads(data.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
    except GoldenError:
        raise
    except UnicodeDecodeError as error:
        raise GoldenError(
            f"{path}: malformed manifest (not UTF-8 at byte {error.start}); {rebuild_hint(model)}"
        ) from None
    except RecursionError:
        raise GoldenError(f"{path}: malformed manifest (nested too deeply); {rebuild_hint(model)}") from None
    except (OSError, ValueError) as error:
        raise GoldenError(f"{path}: malformed manifest ({one_line(error, 160)}); {rebuild_hint(model)}") from None
    if not isinstance(manifest, dict):
        raise GoldenError(f"{path}: malformed manifest (a JSON object expected, got {type(manifest).__name__})")
    if manifest.get("schema") in UPGRADABLE and not allow_older:
        raise GoldenError(
            f"{path}: manifest schema is {manifest['schema']!r}, this parity reads {SCHEMA!r}; {upgrade_hint(model)}"
        )
    if manifest.get("schema") != SCHEMA and not (allow_older and manifest.get("schema") in UPGRADABLE):
        found = manifest.get("schema")
        found = one_line(repr(found), 60) if found is not None else "none"
        raise GoldenError(f"{path}: manifest schema is {found}, this parity reads {SCHEMA!r}; {rebuild_hint(model)}")
    try:
        if manifest["schema"] == SCHEMA and not _known_valid(sha256):
            from jsonschema.exceptions import best_match

            invalid = best_match(_validator().iter_errors(manifest))
            if invalid is not None:
                raise GoldenError(f"{path}: invalid manifest field {_field(invalid)}: {one_line(invalid.message, 160)}")
            _remember_valid(sha256)
        digest = canonical_digest(manifest)
    except RecursionError:
        raise GoldenError(f"{path}: malformed manifest (nested too deeply); {rebuild_hint(model)}") from None
    if digest != manifest.get("digest"):
        raise GoldenError(
            f"{path}: manifest digest mismatch: recorded {manifest.get('digest')}, content {digest}. The manifest was "
            f"edited after it was built; parity will not use it. Restore it, or {rebuild_hint(model)}"
        )
    if manifest.get("model") != model:
        raise GoldenError(f"{path}: manifest is for model {manifest.get('model')!r}, the folder is {model!r}")
    return manifest
