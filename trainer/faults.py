"""Test-only fault injection for the trainer: a worker dies hard at a named step.

Tests (and chaos drills) set, in the environment the trainer starts in (torchrun's workers
inherit it)::

    DYNA_TRAIN_FAULT='{"step": 7, "rank": 1, "attempt": 0}'

and rank 1 of attempt 0 (torchrun's ``TORCHELASTIC_RESTART_COUNT``) SIGKILLs itself once step 7 is
done on every rank: its checkpoint started, and its metrics logged. No cleanup runs, as with an OOM
kill or a lost node. By default the checkpoints in flight complete first; ``"wait": false`` kills
without waiting, losing them.

Not part of ``TrainConfig``: a production config says what to train, never how to break it; a
config with a fault in it would train differently wherever it is copied. Unset (the default in
every launch), nothing here runs.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, fields

ENV = "DYNA_TRAIN_FAULT"

log = logging.getLogger("dyna.train")


class FaultSpecError(ValueError):
    """``DYNA_TRAIN_FAULT`` does not say a fault this module knows."""


@dataclass(frozen=True)
class Fault:
    step: int  # the kill comes after this step (1-based, as the step counter)
    rank: int = 0
    attempt: int = 0
    wait: bool = True  # let the checkpoints in flight complete first

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Fault | None:
        """The fault ``DYNA_TRAIN_FAULT`` names, or None when it is unset or empty."""
        text = (os.environ if environ is None else environ).get(ENV, "").strip()
        if not text:
            return None
        try:
            spec = json.loads(text)
        except json.JSONDecodeError as e:
            raise FaultSpecError(f"{ENV}: not JSON ({e}): {text!r}") from None
        if not isinstance(spec, dict):
            raise FaultSpecError(f'{ENV}: expected an object like {{"step": 7, "rank": 1}}, got {text!r}')
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(spec) - set(known))
        if unknown:
            raise FaultSpecError(f"{ENV}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
        if "step" not in spec:
            raise FaultSpecError(f"{ENV}: the step to die at is required: {text!r}")
        for name in ("step", "rank", "attempt"):
            if name in spec and (type(spec[name]) is not int or spec[name] < 0):
                raise FaultSpecError(f"{ENV}: {name} must be an integer >= 0, got {spec[name]!r}")
        if "wait" in spec and type(spec["wait"]) is not bool:
            raise FaultSpecError(f"{ENV}: wait must be true or false, got {spec['wait']!r}")
        return cls(**spec)

    def after_step(self, step: int, rank: int, attempt: int, ckpt) -> None:
        """Called by every rank at the end of every step; kills the named rank at the named step.

        The other ranks take part (the same variable reaches all of them): with ``wait``, every rank
        meets the victim in a barrier at the end of the step, so when it dies, they have logged the
        step; and the victim first waits for its checkpoints in flight, which return only after
        every rank's part of them, rank 0's completion marker included, is on disk (the manager's
        last collective follows the marker). Without ``wait`` nothing is waited for."""
        if step != self.step or attempt != self.attempt:
            return
        if self.wait:
            if rank == self.rank:
                ckpt.wait()
            _barrier()
        if rank != self.rank:
            return
        log.error("fault injection (%s): SIGKILL at step %d", ENV, step)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
