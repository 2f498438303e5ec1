"""Summaries of repeated timings: the median, and the interquartile range relative to it."""

import statistics
from dataclasses import dataclass

from planner.schemas import DType


@dataclass(frozen=True, slots=True)
class Timing:
    """Median seconds of the repeats, and their spread (IQR / median, 0 for one sample)."""

    median_s: float
    spread: float

    @staticmethod
    def of(samples_s: list[float]) -> "Timing":
        """Summarize ``samples_s`` (at least one)."""
        median = statistics.median(samples_s)
        if len(samples_s) < 2 or median <= 0:
            return Timing(median, 0.0)
        q1, _, q3 = statistics.quantiles(samples_s, n=4, method="inclusive")
        return Timing(median, (q3 - q1) / median)


@dataclass(frozen=True, slots=True)
class GemmSample:
    """One rank's median time of an (m x k) @ (k x n) GEMM."""

    m: int
    n: int
    k: int
    dtype: DType
    median_s: float
    spread: float
