"""Statistics shared by the distribution tests (two-sample chi-square)."""

from __future__ import annotations

from collections import Counter

import numpy as np

#: chi-square 0.9999 quantiles by degrees of freedom (p = 1e-4: a flaky-proof bound),
#: from scipy.stats.chi2.ppf(0.9999, dof)
CHI2_9999 = {
    1: 15.1, 2: 18.4, 3: 21.1, 4: 23.5, 5: 25.7, 6: 27.9, 7: 29.9, 8: 31.8, 9: 33.7, 10: 35.6,
    11: 37.4, 12: 39.1, 13: 40.9, 14: 42.6, 15: 44.3, 16: 45.9, 17: 47.6, 18: 49.2, 19: 50.8,
    20: 52.4, 21: 54.0, 22: 55.5, 23: 57.1, 24: 58.6, 25: 60.1, 26: 61.7, 27: 63.2, 28: 64.7,
    29: 66.2, 30: 67.6,
}


def pool_rare(a: Counter, b: Counter, min_count: int = 10) -> tuple[Counter, Counter]:
    """Cells seen fewer than ``min_count`` times in both samples together, pooled into one
    (the chi-square approximation needs expected counts of a few at least)."""
    rare = {c for c in set(a) | set(b) if a.get(c, 0) + b.get(c, 0) < min_count}

    def pooled(x: Counter) -> Counter:
        out = Counter({c: n for c, n in x.items() if c not in rare})
        out["<rare>"] = sum(n for c, n in x.items() if c in rare)
        return out

    return (pooled(a), pooled(b)) if rare else (a, b)


def chi2_two_sample(a: Counter, b: Counter) -> tuple[float, int]:
    """Two-sample chi-square statistic and its degrees of freedom."""
    cells = sorted(set(a) | set(b), key=str)
    na, nb = sum(a.values()), sum(b.values())
    stat = 0.0
    for c in cells:
        x, y = a.get(c, 0), b.get(c, 0)
        if x + y:
            stat += (x * np.sqrt(nb / na) - y * np.sqrt(na / nb)) ** 2 / (x + y)
    return stat, len(cells) - 1
