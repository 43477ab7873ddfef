"""Fit the polynomial of tilefuse.kernels.special's float32 erfc (CPU, a few seconds).

``erfc(z) = exp(-z^2) * Q(t)`` for ``z >= 0``, ``t = 1 / (1 + 0.4 z)``: ``Q(t)`` approximates the scaled
complementary error function ``erfcx(z)`` on ``z`` in [0, 10] (``t`` in [0.2, 1]). The fit minimises the
largest relative error with Lawson's algorithm (iteratively reweighted least squares: each point's weight is
multiplied by its error, which converges to the minimax fit), in a Chebyshev basis for conditioning, then
converted to the monomial coefficients Horner's rule evaluates. ``erfcx`` in float64 comes from torch.

    python3 tools/fit_erfc.py --degree 8 5    # prints the coefficients (highest first) and the fit error
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
from numpy.polynomial import chebyshev as C
from numpy.polynomial import polynomial as Pm

SCALE = 0.4
Z_MAX = 10.0


def fit(degree: int, points: int = 4000, iterations: int = 300):
    """(coefficients highest first, largest relative error of the float64 polynomial on a fine grid)."""
    t_lo = 1.0 / (1.0 + SCALE * Z_MAX)
    t = np.cos(np.linspace(0, np.pi, points)) * (1 - t_lo) / 2 + (1 + t_lo) / 2  # Chebyshev-spaced in t
    z = (1.0 / t - 1.0) / SCALE
    f = torch.special.erfcx(torch.from_numpy(z)).numpy()
    u = (2 * t - (1 + t_lo)) / (1 - t_lo)  # t mapped to [-1, 1]
    basis = C.chebvander(u, degree) / f[:, None]  # the relative error is basis @ c - 1
    w = np.full(points, 1.0 / points)
    for _ in range(iterations):
        sw = np.sqrt(w)
        c, *_ = np.linalg.lstsq(basis * sw[:, None], sw, rcond=None)
        err = np.abs(basis @ c - 1.0)
        w = w * err
        w /= w.sum()
    # Chebyshev in u -> monomials in t: u = a t + b
    a, b = 2 / (1 - t_lo), -(1 + t_lo) / (1 - t_lo)
    mono = np.zeros(1)
    for k, ck in enumerate(C.cheb2poly(c)):  # monomials in u, then u = a t + b substituted
        mono = Pm.polyadd(mono, ck * Pm.polypow([b, a], k))
    tt = np.linspace(t_lo, 1.0, 200001)
    zz = (1.0 / tt - 1.0) / SCALE
    rel = np.abs(Pm.polyval(tt, mono) / torch.special.erfcx(torch.from_numpy(zz)).numpy() - 1.0)
    return list(mono[::-1]), float(rel.max())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--degree", type=int, nargs="+", default=[8])
    opts = p.parse_args(argv)
    for d in opts.degree:
        coefs, err = fit(d)
        print(f"degree {d}: largest relative error {err:.3g}")
        print("  " + ", ".join(repr(float(np.float32(c))) for c in coefs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
