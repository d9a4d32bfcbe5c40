"""pipeline: vbcluster's data plane -- estimator, engines, CLI (feature store and Dask to come).

Imports vbcore; never imports prefect.
"""

from pipeline.estimator import VBMixture

__all__ = ["VBMixture"]
