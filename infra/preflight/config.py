"""Preflight thresholds: dataclasses loaded from YAML, validated, errors name the field."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_CONFIG_PATH = Path(__file__).with_name("preflight.yaml")


class ConfigError(ValueError):
    """A bad config value; the message starts with the dotted field name."""

    def __init__(self, field_name: str, problem: str):
        super().__init__(f"{field_name}: {problem}")
        self.field_name = field_name


@dataclass(frozen=True)
class GpuConfig:
    expected_count: int = 0  # 0: a CPU node, GPU checks are skipped
    expected_model: str | None = None
    allowed_driver_versions: tuple[str, ...] = ()  # empty: any driver
    max_volatile_uncorrectable_ecc: int = 0
    warn_volatile_correctable_ecc: int | None = None
    min_max_sm_clock_mhz: int | None = None
    nvidia_smi: tuple[str, ...] = ("nvidia-smi", "-q", "-x")
    timeout_s: float = 60.0


@dataclass(frozen=True)
class KernelConfig:
    fatal_xids: tuple[int, ...] = (48, 63, 64, 74, 79, 92, 94, 95)
    log_commands: tuple[tuple[str, ...], ...] = (
        ("journalctl", "-k", "-b", "--no-pager", "-q"),
        ("dmesg",),
    )
    timeout_s: float = 30.0


@dataclass(frozen=True)
class CacheConfig:
    path: str | None = None  # None: no node cache, checks skipped
    require_mount: bool = True
    min_free_gib: float = 0.0
    min_free_percent: float = 0.0


@dataclass(frozen=True)
class RuntimeConfig:
    command: tuple[str, ...] = ()  # empty: no container runtime expected
    timeout_s: float = 15.0


@dataclass(frozen=True)
class DrainConfig:
    scontrol: str = "scontrol"
    reason_prefix: str = "preflight: "
    max_reason_chars: int = 256


@dataclass(frozen=True)
class PreflightConfig:
    gpu: GpuConfig = field(default_factory=GpuConfig)
    kernel: KernelConfig = field(default_factory=KernelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    container_runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)


def load_config(path: str | Path = DEFAULT_CONFIG_PATH) -> PreflightConfig:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from exc
    return config_from_dict(raw or {})


def config_from_dict(raw: Any) -> PreflightConfig:
    config = _build(PreflightConfig, raw, prefix="")
    _validate(config)
    return config


def _build(cls, raw: Any, prefix: str):
    if not isinstance(raw, dict):
        raise ConfigError(prefix.rstrip(".") or "config", f"must be a mapping, got {type(raw).__name__}")
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(raw) - set(hints))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}", f"unknown field (known: {', '.join(hints)})")
    values = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if dataclasses.is_dataclass(hints[key]):
            values[key] = _build(hints[key], {} if value is None else value, prefix=f"{dotted}.")
        else:
            values[key] = _coerce(dotted, value, hints[key])
    return cls(**values)


def _coerce(dotted: str, value: Any, hint: Any) -> Any:
    """Checks one YAML value against its field's annotation (only the simple types used above)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):  # X | None
        if value is None:
            return None
        return _coerce(dotted, value, next(a for a in args if a is not type(None)))
    if origin is tuple:  # tuple[X, ...]
        if not isinstance(value, list):
            raise ConfigError(dotted, f"must be a list, got {value!r}")
        return tuple(_coerce(f"{dotted}[{i}]", item, args[0]) for i, item in enumerate(value))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(dotted, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(dotted, f"must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(dotted, f"must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ConfigError(dotted, f"must be a string, got {value!r}")
        return str(value)  # YAML reads a version such as 550.54 as a float
    raise TypeError(f"{dotted}: unsupported annotation {hint!r}")


def _validate(config: PreflightConfig) -> None:
    gpu, cache = config.gpu, config.cache
    non_negative = {
        "gpu.expected_count": gpu.expected_count,
        "gpu.max_volatile_uncorrectable_ecc": gpu.max_volatile_uncorrectable_ecc,
        "cache.min_free_gib": cache.min_free_gib,
        "cache.min_free_percent": cache.min_free_percent,
    }
    for name, value in non_negative.items():
        if value < 0:
            raise ConfigError(name, f"must be >= 0, got {value}")
    positive = {
        "gpu.timeout_s": gpu.timeout_s,
        "kernel.timeout_s": config.kernel.timeout_s,
        "container_runtime.timeout_s": config.container_runtime.timeout_s,
        "drain.max_reason_chars": config.drain.max_reason_chars,
    }
    for name, value in positive.items():
        if value <= 0:
            raise ConfigError(name, f"must be > 0, got {value}")
    if cache.min_free_percent > 100:
        raise ConfigError("cache.min_free_percent", f"must be <= 100, got {cache.min_free_percent}")
    if gpu.expected_count > 0 and not gpu.nvidia_smi:
        raise ConfigError("gpu.nvidia_smi", "must name a command when gpu.expected_count > 0")
    if not config.kernel.log_commands:
        raise ConfigError("kernel.log_commands", "must list at least one command")
    for i, command in enumerate(config.kernel.log_commands):
        if not command:
            raise ConfigError(f"kernel.log_commands[{i}]", "must not be an empty command")
