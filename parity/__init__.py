"""parity: prove model conversion paths numerically equivalent before timing them.

Importing this package imports no ML framework; frameworks are imported inside the
worker processes that run a path.
"""

import importlib
import importlib.util
import sys

from parity.platform.errors import ParityError

__version__ = "0.1.0"
__all__ = ["ParityError", "__version__"]

# Model files written by earlier versions import these names; they are the same modules, not copies.
MOVED = {"parity.spec": "parity.model.spec", "parity.usermodel": "parity.model.user"}


class _Moved:
    """Finder and loader of the moved names (the protocol of ``importlib.abc.MetaPathFinder`` and ``Loader``,
    without importing ``importlib.abc``: it pulls in ``importlib.resources`` and ``tempfile`` at start-up)."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(finder, _Moved) for finder in sys.meta_path):
    sys.meta_path.append(_Moved())
