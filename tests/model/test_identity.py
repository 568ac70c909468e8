"""Which files are a user's code (``identity.user_file``): decided on the file's real place, through any link."""

from __future__ import annotations

import os

import numpy as np

from parity.model import identity


def test_a_file_is_judged_where_its_links_lead(tmp_path):
    installed = os.path.realpath(np.__file__)
    user = tmp_path / "code" / "model.py"
    user.parent.mkdir()
    user.write_text("x = 1\n")
    (tmp_path / "linked_folder").symlink_to(user.parent)
    (tmp_path / "link_to_installed.py").symlink_to(installed)
    (tmp_path / "code" / "link_to_user.py").symlink_to(user)
    cases = {
        str(user): True,
        str(tmp_path / "linked_folder" / "model.py"): True,
        str(tmp_path / "linked_folder" / "link_to_user.py"): True,
        str(tmp_path / "link_to_installed.py"): False,  # a link out of the user's folder into site-packages
        installed: False,
        identity.__file__: False,  # parity's own
    }
    for path, expected in cases.items():
        assert identity._realpath(path) == os.path.realpath(path), path
        assert identity.user_file(path) is expected, path
