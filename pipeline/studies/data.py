"""Data sets of the papers' experiments (Kuusela et al. 2009; Watanabe & Watanabe 2005).

* :func:`cluster_data` -- Kuusela et al. 2009 sec. V-A, Fig. 3(a): five spherical Gaussians, equal weights
  centred at (0, 0) and (+-R, +-R).
* :func:`spiral_data` -- Kuusela et al. 2009 sec. V-A, Fig. 3(b): a noisy three-dimensional helix.
* :func:`image_data` -- Kuusela et al. 2009 sec. V-B: one pixel = (r, g, b, x, y), scaled into the cube
  [-1, 1]^5, from a photo bundled with scikit-learn (``flower.jpg``) shrunk to 100 x 66 pixels.
* :func:`watanabe_data` -- Watanabe & Watanabe 2005 sec. 4, eq. 19: unit-variance Gaussians in the plane.

The papers do not give every constant (component spread of the cluster data, helix shape); the
values chosen here are documented in docs/studies.md.
"""

from __future__ import annotations

import numpy as np

#: standard deviation of each cluster-data component (not stated in Kuusela et al. 2009; see docs/studies.md)
CLUSTER_STD = 0.1


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def cluster_centres(R: float) -> np.ndarray:
    """The five component centres (0, 0), (R, R), (R, -R), (-R, R), (-R, -R); shape (5, 2)."""
    return np.array([[0.0, 0.0], [R, R], [R, -R], [-R, R], [-R, -R]])


def cluster_data(R: float, n: int = 1000, std: float = CLUSTER_STD,
                 seed: int | np.random.Generator | None = 0) -> tuple[np.ndarray, np.ndarray]:
    """The cluster data of Kuusela et al. 2009: a mixture of 5 spherical Gaussians with weights 0.2 each.

    Parameters
    ----------
    R : float
        Separation: the centres are (0, 0) and (+-R, +-R).
    n : int
        Number of samples (the paper: 1000; 500 for Fig. 4(a)).
    std : float
        Standard deviation of every component in each coordinate.

    Returns
    -------
    X : array of shape (n, 2)
    labels : array of shape (n,)
        The generating component of each row.
    """
    if not R >= 0 or n < 1 or not std > 0:
        raise ValueError(f"need R >= 0, n >= 1, std > 0; got R={R}, n={n}, std={std}")
    rng = _rng(seed)
    labels = rng.choice(5, size=n, p=np.full(5, 0.2))
    X = cluster_centres(R)[labels] + std * rng.standard_normal((n, 2))
    return X, labels


def spiral_data(n: int = 1000, turns: float = 2.0, noise: float = 0.05,
                seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """A three-dimensional helix (not a mixture of Gaussians), centred at the origin.

    ``t ~ U(-turns pi, turns pi)``; ``x = cos t``, ``y = sin t``, ``z = t / pi`` (so z spans
    [-turns, turns]: larger than [-1, 1], as the paper implies), plus isotropic noise ``noise``.

    Returns
    -------
    X : array of shape (n, 3)
    """
    rng = _rng(seed)
    t = rng.uniform(-turns * np.pi, turns * np.pi, size=n)
    X = np.column_stack([np.cos(t), np.sin(t), t / np.pi])
    return X + noise * rng.standard_normal(X.shape)


def load_photo(width: int = 100, height: int = 66, name: str = "flower.jpg") -> np.ndarray:
    """scikit-learn's bundled photo ``name`` resized (Lanczos) to ``height x width``; uint8 (h, w, 3)."""
    from PIL import Image
    from sklearn.datasets import load_sample_image

    img = Image.fromarray(load_sample_image(name))
    return np.asarray(img.resize((width, height), Image.Resampling.LANCZOS))


def image_features(img: np.ndarray) -> np.ndarray:
    """Pixels as (r, g, b, x, y) rows (row-major pixel order), each coordinate min-max scaled to
    [-1, 1] (Kuusela et al. 2009 sec. V-B: inside the cube of side 2 centred at the origin).

    Parameters
    ----------
    img : array of shape (h, w, 3)

    Returns
    -------
    X : array of shape (h * w, 5)
    """
    h, w, _ = img.shape
    yy, xx = np.mgrid[0:h, 0:w]
    X = np.column_stack([img.reshape(-1, 3).astype(np.float64), xx.ravel(), yy.ravel()]).astype(float)
    lo, hi = X.min(0), X.max(0)
    span = np.where(hi > lo, hi - lo, 1.0)
    return 2.0 * (X - lo) / span - 1.0


def image_data(width: int = 100, height: int = 66) -> tuple[np.ndarray, np.ndarray]:
    """The image-segmentation data: (features (h*w, 5), photo (h, w, 3) uint8)."""
    img = load_photo(width, height)
    return image_features(img), img


#: Watanabe & Watanabe 2005 eq. 19: the true distribution 1/2 N((2, 2), I) + 1/2 N((-2, -2), I)
WATANABE_MEANS = np.array([[2.0, 2.0], [-2.0, -2.0]])


def watanabe_data(n: int, means: np.ndarray = WATANABE_MEANS,
                  seed: int | np.random.Generator | None = 0) -> np.ndarray:
    """``n`` samples of an equal-weight mixture of unit-variance Gaussians at ``means`` (K0, M)."""
    rng = _rng(seed)
    means = np.asarray(means, dtype=float)
    labels = rng.integers(0, means.shape[0], size=n)
    return means[labels] + rng.standard_normal((n, means.shape[1]))


def watanabe_logpdf(X: np.ndarray, means: np.ndarray = WATANABE_MEANS) -> np.ndarray:
    """``ln p(x | theta_0)`` of the equal-weight unit-variance mixture at ``means``; shape (n,)."""
    from scipy.special import logsumexp

    means = np.asarray(means, dtype=float)
    m = means.shape[1]
    sq = ((X[:, None, :] - means[None]) ** 2).sum(-1)  # (n, K0): K0 and M are tiny
    return logsumexp(-0.5 * sq, axis=1) - np.log(means.shape[0]) - 0.5 * m * np.log(2 * np.pi)
