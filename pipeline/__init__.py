"""pipeline: vbcluster's data plane -- estimator, engines, stores, CLI.

Imports vbcore; never imports prefect. ``VBMixture`` is imported on first use (module
``__getattr__``), so that ``vbcluster --help`` does not load scikit-learn, SciPy, pandas and Dask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.estimator import VBMixture as VBMixture

# no __all__: the documentation lists VBMixture where it lives (pipeline.estimator)


def __getattr__(name: str) -> Any:
    if name == "VBMixture":
        from pipeline.estimator import VBMixture as VBMixture

        return VBMixture
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
