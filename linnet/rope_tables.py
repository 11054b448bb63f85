"""Rotary embedding frequencies for every scaling Linnet supports (none, linear, llama3, yarn).

Plain numpy in float64, shared by both backends' runtimes so that their
tables agree to the last bit.
"""

from __future__ import annotations

import math

import numpy as np


def inv_frequencies(head_dim: int, theta: float, scaling: str = "none", factor: float = 1.0,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0, original_max: int = 8192,
                    beta_fast: float = 32.0, beta_slow: float = 1.0, truncate: bool = True,
                    attention_factor: float | None = None) -> tuple[np.ndarray, float]:
    """Returns (inverse frequencies [head_dim // 2], attention factor applied to cos and sin).

    `attention_factor`, where given, is the factor whatever the scaling (DeepSeek's YaRN derives
    its own from mscale and mscale_all_dim, as Hugging Face's `attention_factor` key sets it)."""
    inv_freq, derived = _inv_frequencies(head_dim, theta, scaling, factor, low_freq_factor, high_freq_factor,
                                         original_max, beta_fast, beta_slow, truncate)
    return inv_freq, derived if attention_factor is None else attention_factor


def _inv_frequencies(head_dim: int, theta: float, scaling: str, factor: float, low_freq_factor: float,
                     high_freq_factor: float, original_max: int, beta_fast: float, beta_slow: float,
                     truncate: bool) -> tuple[np.ndarray, float]:
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling in ("none", ""):
        return inv_freq, 1.0
    if scaling == "linear":
        return inv_freq / factor, 1.0
    if scaling == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        low_wavelen = original_max / low_freq_factor
        high_wavelen = original_max / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (original_max / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, blended, scaled), 1.0
    if scaling == "yarn":
        def correction_dim(rotations: float) -> float:
            return (head_dim * math.log(original_max / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        # The ramp's ends, rounded outward to whole dims unless `truncate` is off (gpt-oss).
        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolation = 1 - ramp
        interpolated = inv_freq / factor
        inv = interpolated * (1 - extrapolation) + inv_freq * extrapolation
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
        return inv, attention_factor
    raise ValueError(f"unknown rope scaling {scaling!r}")


def llama3_divisors(head_dim: int, theta: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max: int) -> np.ndarray:
    """llama3 scaling as llama.cpp stores it (`rope_freqs.weight`): each plain frequency over its
    scaled one, which llama.cpp divides the frequency by."""
    plain, _ = inv_frequencies(head_dim, theta)
    scaled, _ = inv_frequencies(head_dim, theta, "llama3", factor, low_freq_factor, high_freq_factor, original_max)
    return plain / scaled


def llama3_from_divisors(divisors, head_dim: int, theta: float) -> dict | None:
    """llama3 parameters that give these divisors (the inverse of `llama3_divisors`), or None.

    The divisors fix the factor (the largest) and, through the blended band, only two ratios of
    the other three parameters; low_freq_factor = 1 is taken (Llama 3.x's own value) and the
    others solved for. A table no llama3 scaling reproduces gives None."""
    d = np.asarray(divisors, dtype=np.float64)
    factor = float(d.max())
    if factor <= 1.0 + 1e-6:
        return None
    plain, _ = inv_frequencies(head_dim, theta)
    x = plain / (2 * math.pi)  # 1 / wavelength
    # In the band, 1/d = (1 - s)/factor + s with s = orig * x / (high - low) - low / (high - low).
    band = (d > 1.0 + 1e-6) & (d < factor * (1 - 1e-6))
    candidates = []
    if band.sum() >= 2:
        s = (1.0 / d[band] - 1.0 / factor) / (1.0 - 1.0 / factor)
        slope, intercept = np.polyfit(x[band], s, 1)
        if slope > 0 and intercept < 0:
            width = -1.0 / intercept  # high - low, with low = 1
            candidates.append((1.0, round(1.0 + width, 6), slope * width))
    # Fewer than two points in the band pin nothing down: try Llama 3's own ratios at each length.
    candidates += [(1.0, 4.0, float(2 ** k)) for k in range(4, 21)]
    for low, high, original in candidates:
        params = dict(factor=factor, low_freq_factor=low, high_freq_factor=float(high), original_max=int(round(original)))
        if np.allclose(llama3_divisors(head_dim, theta, **params), d, rtol=1e-5, atol=1e-6):
            return params
    return None
