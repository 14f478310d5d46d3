"""Random choices for building rule instances, drawn through hypothesis so that a failing
instance shrinks to a small one: every choice lists its simplest option first (the smallest
number, `False`, the first item), which is where hypothesis's shrinker moves it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

import numpy as np
from hypothesis import strategies as st

T = TypeVar("T")


class Draws:
    """One instance's choices; weights and inputs come from a numpy generator whose seed is
    itself a drawn choice (so it shrinks to 0 as well)."""

    def __init__(self, draw):
        self._draw = draw
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def integer(self, low: int, high: int) -> int:
        return self._draw(st.integers(low, high))

    def choice(self, options: Iterable[T]) -> T:
        return self._draw(st.sampled_from(list(options)))

    def flag(self) -> bool:
        return self._draw(st.booleans())

    def permutation(self, size: int) -> list[int]:
        """A permutation of range(size), drawn so that it shrinks to the identity."""
        return self._draw(st.permutations(range(size)))

    def normal(self, shape, scale: float = 1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    def positive(self, shape, low: float = 0.5, high: float = 2.0) -> np.ndarray:
        return self.rng.uniform(low, high, shape).astype(np.float32)

    def away_from_zero(self, shape) -> np.ndarray:
        """Values in +-[0.5, 2]: safe denominators."""
        return (self.positive(shape) * self.rng.choice([-1.0, 1.0], shape)).astype(np.float32)

    def data_shape(self, ranks=(1, 2, 3, 4, 5), channels: int = 6, size: int = 6) -> tuple[int, ...]:
        """[N, C, spatial...] of a rank in `ranks`: batch 1-2, small channels and sizes."""
        rank = self.choice(ranks)
        dims = [self.integer(1, 2), self.integer(1, channels)] + [self.integer(1, size) for _ in range(rank - 2)]
        return tuple(dims[:rank]) if rank >= 2 else (self.integer(1, size),)
