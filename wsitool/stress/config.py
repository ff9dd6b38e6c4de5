"""The configuration of a stress run: defaults, argument checks, levels, the report's and the child's config
(floor 6, consumers).

:func:`plan_run` checks the arguments of :func:`~wsitool.stress.run_stress`
and opens the slide once in the parent (its levels, the output shape of a
read), before anything starts, so that bad input is an exception, not a
verdict.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

import numpy as np

from ..errors import InvalidOptionError, InvalidRegionError
from ..ground.device import cuda_device_id
from ..ground.naming import about
from ..opening import Location
from ..read.request import output_shape
from ..slide import open_slide, pyramid_levels
from .memory import WARMUP_READS_PER_WORKER, WarmUp
from .regions import size_bounds
from .samplers import SAMPLERS

#: Growth of RSS after warm-up (MiB) above which the verdict is ``leak``.
#: Clean 16-worker, 10,000-iteration runs on the shared samples (JPEG, JPEG
#: 2000, zstd, deflate) grow by 1.8 to 4.9 MiB, less than a tenth of this
#: (figures in ``docs/benchmarks/``); the leaks this check exists for grew by 1.6 GB to
#: 19 GB over such a run.  Small steady leaks show in ``slope_mb_per_1k`` of
#: a longer run (e.g. 50,000 iterations) before they cross the threshold.
DEFAULT_MAX_GROWTH_MB = 64.0
DEFAULT_VERIFY_EVERY = 10
DEFAULT_WARMUP = 0.1
DEFAULT_SAMPLE_INTERVAL = 0.1
DEFAULT_STALL_TIMEOUT = 120.0


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """A checked stress run of the slide at ``location``: ``config`` goes into the report,
    ``child`` (less the pipe's ``fd``) to the child process; ``iterations`` is None in
    duration mode."""

    location: Location
    iterations: int | None
    warm: WarmUp
    slide_info: dict
    config: dict
    child: dict


def parse_levels(spec: str | Sequence[int] | None, level_count: int) -> list[int]:
    """Level indices from ``"all"``, ``"0,2"`` or a sequence; None means all (messages without the
    slide: :func:`probe_slide` names it).

    Raises:
        InvalidRegionError: a level is not an integer or out of range.
    """
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "all"):
        return list(range(level_count))
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    out: list[int] = []
    for item in items:
        try:
            lv = int(str(item).strip())
        except ValueError:
            raise InvalidRegionError(f"bad level {item!r} in --levels (use 'all' or e.g. '0,1')") from None
        if not 0 <= lv < level_count:
            raise InvalidRegionError(
                f"level {lv} out of range (the slide has {level_count} level(s): 0..{level_count - 1})"
            )
        if lv not in out:
            out.append(lv)
    if not out:
        raise InvalidRegionError("--levels selects no level")
    return out


def plan_run(location: Location, *, workers: int, iterations: int | None, duration: float | None,
             region_size: int, levels: str | Sequence[int] | None, seed: int, verify_every: int,
             max_growth_mb: float, warmup: float, sample_interval: float, stall_timeout: float,
             mode: str, read_threads: int, device: str, samplers: Iterable[str]) -> RunPlan:
    """Check the arguments of :func:`~wsitool.stress.run_stress` and probe the slide at ``location``.

    Raises what ``run_stress`` documents for bad input: DeviceUnavailableError,
    InvalidRegionError, and the errors of :func:`wsitool.open_slide`.
    """
    shown = location.shown
    if device != "cpu":
        cuda_device_id(device)  # DeviceUnavailableError: "no CUDA device available ..."
    kind = "cpu" if device == "cpu" else "cuda"
    iterations = check_arguments(
        shown, workers=workers, iterations=iterations, duration=duration, region_size=region_size, seed=seed,
        verify_every=verify_every, warmup=warmup, mode=mode, read_threads=read_threads,
        sample_interval=sample_interval, stall_timeout=stall_timeout, max_growth_mb=max_growth_mb)
    probe = probe_slide(location, levels, mode)
    all_samplers = list(SAMPLERS.get(kind, [])) + list(samplers)
    lo, hi = size_bounds(region_size)
    per_worker_warmup = WARMUP_READS_PER_WORKER * workers
    warmup_iterations = (max(math.ceil(warmup * iterations), per_worker_warmup)
                         if iterations is not None else None)
    warmup_seconds = warmup * duration if duration is not None else None
    config = {
        "workers": workers, "iterations": iterations, "duration_s": duration,
        "region_size": region_size, "size_range": [lo, hi], "levels": probe.level_ids, "seed": seed,
        "verify_every": verify_every, "max_growth_mb": max_growth_mb, "warmup": warmup,
        "sample_interval_s": sample_interval, "stall_timeout_s": stall_timeout, "mode": mode,
        "read_threads": read_threads, "device": device, "samplers": all_samplers,
    }
    child = {
        "location": location.wire(),  # (options included: sent on the child's stdin, never its command line)
        "levels": probe.levels, "mode": mode,
        "device": device, "read_threads": read_threads, "seed": seed, "verify_every": verify_every,
        "iterations": iterations, "duration": duration, "workers": workers,
        "region_size": region_size, "size_bounds": [lo, hi], "channels": probe.channels,
        "dtype": probe.dtype.str, "itemsize": probe.dtype.itemsize,
        "sample_interval": sample_interval, "samplers": all_samplers,
        "warmup_iterations": warmup_iterations,
    }
    return RunPlan(location=location, iterations=iterations,
                   warm=WarmUp(per_worker_warmup, warmup_iterations, warmup_seconds),
                   slide_info=probe.slide_info, config=config, child=child)


def check_arguments(shown: str, *, workers: int, iterations: int | None, duration: float | None,
                    region_size: int, seed: int, verify_every: int, warmup: float, mode: str,
                    read_threads: int, sample_interval: float, stall_timeout: float,
                    max_growth_mb: float) -> int | None:
    """Check the numeric and mode arguments of a run; return ``iterations`` (None in duration mode).

    ``shown``: the slide as messages name it (a URL without its query).

    Raises:
        InvalidOptionError: an argument out of range (also a ValueError); the message
            starts with ``shown``.
    """

    def bad(msg: str) -> InvalidOptionError:
        return InvalidOptionError(f"{shown}: {msg}")

    if workers < 1:
        raise bad(f"workers must be >= 1, got {workers}")
    if duration is not None:
        if not duration > 0:
            raise bad(f"duration must be > 0 seconds, got {duration}")
        iterations = None
    elif iterations is None or iterations < 1:
        raise bad(f"iterations must be >= 1, got {iterations}")
    if region_size < 1:
        raise bad(f"region_size must be >= 1, got {region_size}")
    if seed < 0:
        raise bad(f"seed must be >= 0, got {seed}")
    if verify_every < 1:
        raise bad(f"verify_every must be >= 1, got {verify_every}")
    if not 0 <= warmup <= 0.9:
        raise bad(f"warmup must be a fraction in [0, 0.9], got {warmup}")
    if mode not in ("rgb", "rgba", "raw"):
        raise bad(f"mode must be rgb, rgba or raw, got {mode!r}")
    if read_threads < 1:
        raise bad(f"read_threads must be >= 1, got {read_threads}")
    if not sample_interval > 0 or not stall_timeout > 0 or not max_growth_mb >= 0:
        raise bad("sample_interval and stall_timeout must be > 0, max_growth_mb >= 0")
    return iterations


@dataclasses.dataclass(frozen=True)
class SlideProbe:
    """What a run needs to know of the slide: the levels read (``level_ids``; ``levels``: their
    index, width, height, downsample for the child), the report's ``slide`` section
    (``slide_info``), and the samples per pixel and dtype of a read in the run's mode."""

    level_ids: list[int]
    levels: list[dict]
    slide_info: dict
    channels: int
    dtype: np.dtype


def probe_slide(location: Location, levels: str | Sequence[int] | None, mode: str) -> SlideProbe:
    """Open the slide at ``location`` once (in the parent) and describe what the run will read.

    Raises:
        InvalidRegionError: bad ``levels`` (:func:`parse_levels`), or levels that differ
            in samples or dtype for ``mode``.
        FileNotFoundError, UnsupportedFormatError, CorruptFileError: as :func:`wsitool.open_slide`.
    """
    shown = location.shown
    with open_slide(location) as probe:
        with about(shown):
            level_ids = parse_levels(levels, probe.level_count)
        lv_info = [{"index": lv.index, "width": lv.width, "height": lv.height,
                    "downsample": lv.downsample} for lv in probe.levels if lv.index in level_ids]
        slide_info = {
            "path": shown,  # a URL without its query (tokens)
            "vendor": probe.vendor,
            "levels": [{"index": lv.index, "width": lv.width, "height": lv.height,
                        "downsample": lv.downsample, "tile_width": lv.tile_width,
                        "tile_height": lv.tile_height, "compression": lv.compression,
                        "decoder": lv.decoder} for lv in probe.levels],
        }
        (_, _, channels), dtype = output_shape(pyramid_levels(probe)[level_ids[0]], (1, 1), mode)
        shapes = {output_shape(pyramid_levels(probe)[i], (1, 1), mode) for i in level_ids}
        if len(shapes) != 1:  # levels always share samples and dtype; keep the guard
            raise InvalidRegionError(f"{shown}: levels {level_ids} differ in samples or dtype for mode {mode!r}")
    return SlideProbe(level_ids, lv_info, slide_info, channels, np.dtype(dtype))
