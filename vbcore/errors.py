"""Typed exceptions for vbcluster.

Every user-facing error is a subclass of :class:`VBClusterError`, and the ones about bad input or bad
settings are also :class:`ValueError`, so ``except ValueError`` in scikit-learn style code keeps working.
Messages say what is wrong, where (parameter, array, row) and what to change.

This module holds every exception class of the project (numpy-free, importable from any layer);
other modules import them from here.
"""

from __future__ import annotations


class VBClusterError(Exception):
    """Base class of all vbcluster errors."""


class InputError(VBClusterError, ValueError):
    """The data is unusable: wrong shape, non-finite values, too few rows."""


class InputTypeError(InputError, TypeError):
    """The data holds values that are not numbers (for example objects in an object array)."""


class ConfigError(VBClusterError, ValueError):
    """A parameter or prior is invalid (unknown name, non-positive value, wrong shape)."""


class NumericalError(VBClusterError, ValueError):
    """A posterior became numerically unusable (for example a covariance that is not positive definite)."""


class StoreError(VBClusterError, ValueError):
    """A feature store is missing, malformed, from a newer schema, or cannot take the data."""


class CheckpointError(VBClusterError, OSError):
    """A checkpoint could not be written or no usable checkpoint matches the run."""


class RunLockedError(VBClusterError, RuntimeError):
    """Another live process holds the run directory."""


class FitInterrupted(VBClusterError):
    """A fit stopped on request (SIGINT, SIGTERM) after finishing an iteration.

    ``signum`` is the signal, ``iteration`` the last finished iteration and ``checkpoint`` the
    checkpoint written for it (None without a checkpoint directory)."""

    def __init__(self, signum: int, iteration: int, checkpoint: str | None) -> None:
        where = f"; checkpoint {checkpoint}" if checkpoint else "; no checkpoint directory, nothing kept"
        super().__init__(f"interrupted after iteration {iteration}{where}")
        self.signum, self.iteration, self.checkpoint = signum, iteration, checkpoint


class TruncationWarning(UserWarning):
    """A DP fit ended with (nearly) every component of its truncation in use and could not grow it
    (growth off, the upper limit ``max_components`` reached, or the iterations ran out while it was
    still growing): the truncation, not the data, may have decided the number of clusters."""


#: the words each face speaks in :func:`truncation_message`: the command line's flags ('cli', also the
#: report of a run directory) and the estimator's parameters ('python', ``VBMixture``)
FACE_WORDS: dict[str, dict[str, str]] = {
    "cli": {"limit": "--max-components {}", "raise": "--max-components or -k", "max_iter": "--max-iter",
            "grow_off": "--no-grow", "pca": "--pca", "full": "--covariance full", "reg_covar": "--reg-covar"},
    "python": {"limit": "max_components = {}", "raise": "max_components or n_components",
               "max_iter": "max_iter", "grow_off": "grow=False", "pca": "pca",
               "full": "covariance_type='full'", "reg_covar": "reg_covar"},
}


class FacedWarning(UserWarning):
    """A warning that names settings, kept as a template of :data:`FACE_WORDS` keys: ``str()`` is in
    the estimator's words (what a Python caller sees), :meth:`worded` in another face's (the command
    line prints ``worded('cli')``)."""

    def __init__(self, template: str) -> None:
        super().__init__(template.format(**FACE_WORDS["python"]))
        self.template = template

    def worded(self, face: str) -> str:
        return self.template.format(**FACE_WORDS[face])
#: the hints a truncation entry may name (``info['hint']``), in the face's words
TRUNCATION_HINTS = {
    "projected_diag": "on principal components ({pca}) diag covariances tile each class with several "
                      "components: where classes have many more rows than P^2/2, try {full}",
}


def truncation_message(info: dict, face: str = "cli") -> str:  # type: ignore[type-arg]
    """The one line the estimator (``face='python'``), the CLI summary and the report (``'cli'``)
    print when a limit was hit, naming what to change in the words of that face."""
    words = FACE_WORDS[face]
    fix = f"raise {words['raise']}"
    if info.get("max_iter_hit"):
        why = "the fit stopped at its iteration limit while the truncation was still growing"
        fix = f"raise {words['max_iter']}"
    elif info.get("growth"):
        why = f"the upper limit {words['limit'].format(info['limit'])} was reached"
    else:
        why = f"the truncation did not grow ({words['grow_off']}, or a learner that does not grow it)"
    hint = info.get("hint")  # (e.g. diag covariances after pca; a run of before issue 53: the text)
    hint = f"; {TRUNCATION_HINTS[hint].format(**words) if hint in TRUNCATION_HINTS else hint}" if hint else ""
    return (f"the fit uses {info['used']} of its {info['final']} components and {why}: the truncation "
            f"may have decided the number of clusters; {fix}{hint}")
