"""The moving-block bootstrap over steps, and the one seed every resampling starts from.

Neighbouring steps correlate (a slow spell lasts several), so intervals on a per-step mean
resample blocks of consecutive steps, not single steps. The generator is seeded, so an
answer is the same on every run of the same trace: the straggler verdict's intervals and
the ``--fail-on`` gate's (which derives its per-check seeds from :data:`BOOTSTRAP_SEED`)
both start here, below the analyses, rather than one reaching into the other.
"""

from __future__ import annotations

import numpy as np

#: Bootstrap resamples (moving blocks of about n^(1/3) steps) and their seed.
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 20240


def block_bootstrap_means(x: np.ndarray, samples: int = BOOTSTRAP_SAMPLES) -> np.ndarray:
    """Means of ``samples`` moving-block resamples of the rows of ``x`` (steps, columns).

    Blocks of about n^(1/3) consecutive steps keep the correlation of neighbouring steps
    (a slow spell lasts several); the generator is seeded, so the answer is deterministic.
    Returns (samples, columns).
    """
    n = len(x)
    block = max(1, round(n ** (1.0 / 3.0)))
    starts_n = n - block + 1
    n_blocks = -(-n // block)
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    picks = rng.integers(0, starts_n, size=(samples, n_blocks))
    counts = np.zeros((samples, starts_n))
    np.add.at(counts, (np.repeat(np.arange(samples), n_blocks), picks.ravel()), 1.0)
    c = np.concatenate([np.zeros((1, x.shape[1])), np.cumsum(x, axis=0)])
    block_sums = c[block:] - c[:-block]  # (starts_n, columns)
    return counts @ block_sums / (n_blocks * block)
