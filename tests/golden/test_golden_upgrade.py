"""Golden data of the previous manifest schema: read with one line naming the upgrade, upgraded with its arrays
unchanged."""

from __future__ import annotations

import json

from click.testing import CliRunner

from parity.cli import cli
from parity.golden import store
from parity.model import manifest as manifest_lib
from parity.platform.safefs import sha256_file


def _as_schema_2(folder):
    """The folder as parity wrote it with schema 2: no shapes.npz, no shapes, the manifest sealed again."""
    manifest = json.loads((folder / "manifest.json").read_text())
    for key in ("shapes", "migrated"):
        manifest.pop(key, None)
    manifest["files"].pop("shapes.npz")
    manifest["schema"] = "parity.golden/2"
    (folder / "shapes.npz").unlink()
    (folder / "manifest.json").write_text(json.dumps(manifest_lib.seal(manifest)))


def test_an_old_manifest_names_the_upgrade_and_the_upgrade_keeps_every_array(workspace_copy):
    root = workspace_copy()
    folder = root / "golden" / "mlp"
    _as_schema_2(folder)
    before = {name: sha256_file(folder / name) for name in store.FILES if name != "shapes.npz"}

    result = CliRunner().invoke(cli, ["check", "--workspace", str(root), "--model", "mlp", "--path", "torch"])
    assert result.exit_code == 2
    assert (
        "manifest schema is 'parity.golden/2', this parity reads 'parity.golden/3'; upgrade it with "
        "`parity golden upgrade --model mlp`" in result.output
    )

    result = CliRunner().invoke(cli, ["golden", "upgrade", "--workspace", str(root), "--model", "mlp"])
    assert result.exit_code == 0, result.output
    manifest = store.verify(folder)
    assert manifest["schema"] == manifest_lib.SCHEMA and manifest["migrated"]["from_schema"] == "parity.golden/2"
    assert manifest["shapes"] == [{"batch": 1}, {"batch": 3}]
    assert {name: sha256_file(folder / name) for name in before} == before
    arrays = store.load(folder).arrays
    # the reference at batch 3 is the float64 reference of the first three eval samples
    import numpy as np

    np.testing.assert_allclose(
        arrays["shapes.npz"]["1/output/logits"], arrays["reference.npz"]["eval/logits"][:3], rtol=0, atol=1e-12
    )
