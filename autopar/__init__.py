"""autopar: auto-parallel planning of training graphs (N-D SBP under a ZeRO-aware memory budget).

The core (this package) needs only numpy and pydantic; the solver (``solver``) needs OR-Tools
and the service (``service``) FastAPI and Redis.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
