"""GPU state from `nvidia-smi -q -x` (element names as in NVIDIA's nvsmi DTD, drivers 550+)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuState:
    index: int
    pci_bus_id: str
    product_name: str
    # volatile counters reset at boot (or GPU reset); aggregate ones are lifetime
    volatile_uncorrectable_ecc: int
    volatile_correctable_ecc: int
    aggregate_uncorrectable_ecc: int
    aggregate_correctable_ecc: int
    remap_pending: bool
    remap_failure: bool
    retirement_pending: bool
    max_sm_clock_mhz: int | None
    hw_slowdown_active: bool


# a frozen field list like disk.py's MountEntry: alike in shape only, each the reading of its own tool
@dataclass(frozen=True)
class GpuInventory:
    driver_version: str
    cuda_version: str
    attached_gpus: int
    gpus: tuple[GpuState, ...]


def parse_nvidia_smi_xml(text: str) -> GpuInventory:
    """Raises ValueError when the text is not an nvidia_smi_log document."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise ValueError(f"nvidia-smi XML does not parse: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"expected <nvidia_smi_log>, got <{root.tag}>")
    gpus = tuple(_parse_gpu(i, element) for i, element in enumerate(root.findall("gpu")))
    attached = _count(root.findtext("attached_gpus"))
    return GpuInventory(
        driver_version=(root.findtext("driver_version") or "").strip(),
        cuda_version=(root.findtext("cuda_version") or "").strip(),
        attached_gpus=attached if attached is not None else len(gpus),
        gpus=gpus,
    )


def _parse_gpu(index: int, gpu: ET.Element) -> GpuState:
    minor = _count(gpu.findtext("minor_number"))
    return GpuState(
        index=minor if minor is not None else index,
        pci_bus_id=gpu.get("id") or (gpu.findtext("pci/pci_bus_id") or "").strip(),
        product_name=(gpu.findtext("product_name") or "").strip(),
        volatile_uncorrectable_ecc=_sum_counters(gpu.find("ecc_errors/volatile"), "uncorrectable"),
        volatile_correctable_ecc=_sum_counters(gpu.find("ecc_errors/volatile"), "correctable"),
        aggregate_uncorrectable_ecc=_sum_counters(gpu.find("ecc_errors/aggregate"), "uncorrectable"),
        aggregate_correctable_ecc=_sum_counters(gpu.find("ecc_errors/aggregate"), "correctable"),
        remap_pending=_is_yes(gpu.findtext("remapped_rows/remapped_row_pending")),
        remap_failure=_is_yes(gpu.findtext("remapped_rows/remapped_row_failure")),
        # pending_blacklist is the pre-450 name of pending_retirement
        retirement_pending=_is_yes(gpu.findtext("retired_pages/pending_retirement"))
        or _is_yes(gpu.findtext("retired_pages/pending_blacklist")),
        max_sm_clock_mhz=_count(gpu.findtext("max_clocks/sm_clock")),
        hw_slowdown_active=_hw_slowdown_active(gpu),
    )


def _sum_counters(section: ET.Element | None, kind: str) -> int:
    """Sums the counters of one kind: sram_/dram_<kind>, and the split
    sram_uncorrectable_parity/_secded of newer drivers; N/A counts as 0."""
    if section is None:
        return 0
    total = 0
    for child in section:
        tag = child.tag
        if tag.endswith(f"_{kind}") or tag.startswith(f"sram_{kind}_"):
            total += _count(child.text) or 0
    return total


def _hw_slowdown_active(gpu: ET.Element) -> bool:
    # clocks_throttle_reasons was renamed clocks_event_reasons in driver 535
    for section in ("clocks_event_reasons", "clocks_throttle_reasons"):
        for child in gpu.findall(f"{section}/*"):
            if "hw_" in child.tag and "slowdown" in child.tag and (child.text or "").strip() == "Active":
                return True
    return False


def _count(text: str | None) -> int | None:
    """'8', '1980 MHz' -> the leading integer; 'N/A' or missing -> None."""
    if text is None:
        return None
    head = text.strip().split(" ")[0]
    return int(head) if head.isdigit() else None


def _is_yes(text: str | None) -> bool:
    return (text or "").strip().lower() == "yes"
