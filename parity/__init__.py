"""parity: prove model conversion paths numerically equivalent before timing them.

Importing this package imports no ML framework; frameworks are imported inside the
worker processes that run a path.
"""

from parity.errors import ParityError

__version__ = "0.1.0"
__all__ = ["ParityError", "__version__"]
