"""A small world-action model: frames + proprioception -> the next action chunk and future frame latents.

    frames (B, C, K, 3, H, W) ─ FrameEncoder (shared conv) ─┐
                                                             ├─ fusion MLP ─┬─ action head  -> (B, chunk, A)
    proprio (B, T, D) ───────── ProprioEncoder (MLP) ───────┘              └─ latent head  -> (B, C, latent)

The future-latent target is the frame encoder's EMA copy applied to the future frame (BYOL/JEPA
style: a slowly moving target cannot collapse with the online encoder). Loss = MSE(actions) +
``future_weight`` * MSE(latents). Sizes come from ``ModelConfig``; the default is tiny and trains
on CPU in the demo.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelConfig:
    cameras: int = 3
    frames: int = 2
    image_size: tuple[int, int] = (64, 64)
    proprio_steps: int = 40
    proprio_dim: int = 15
    action_chunk: int = 25
    action_dim: int = 8
    channels: tuple[int, ...] = (16, 32, 64)  # conv widths, each stride 2
    latent: int = 64
    width: int = 256
    depth: int = 2
    future_weight: float = 0.5
    ema: float = 0.99  # target encoder: target = ema * target + (1 - ema) * online, after each step

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        d = dict(d)
        for k in ("image_size", "channels"):
            if k in d:
                d[k] = tuple(d[k])
        return cls(**d)


class FrameEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        layers, c_in = [], 3
        for c in cfg.channels:
            layers += [nn.Conv2d(c_in, c, 3, stride=2, padding=1), nn.GroupNorm(1, c), nn.GELU()]
            c_in = c
        self.conv = nn.Sequential(*layers)
        self.proj = nn.Linear(c_in, cfg.latent)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) uint8 or float in [0, 1] -> (N, latent)."""
        x = images.float() / 255.0 if images.dtype == torch.uint8 else images
        return self.proj(self.conv(x).mean(dim=(2, 3)))


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(self.norm(x))))


class WorldActionModel(nn.Module):
    def __init__(self, cfg: ModelConfig = ModelConfig()):
        super().__init__()
        self.cfg = cfg
        self.encoder = FrameEncoder(cfg)
        self.target_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
        self.proprio_norm = nn.LayerNorm(cfg.proprio_dim)
        self.proprio = nn.Sequential(nn.Linear(cfg.proprio_steps * cfg.proprio_dim, cfg.width), nn.GELU())
        self.fuse = nn.Linear(cfg.cameras * cfg.frames * cfg.latent + cfg.width, cfg.width)
        self.blocks = nn.Sequential(*[Block(cfg.width) for _ in range(cfg.depth)])
        self.out_norm = nn.LayerNorm(cfg.width)
        self.action_head = nn.Linear(cfg.width, cfg.action_chunk * cfg.action_dim)
        self.latent_head = nn.Linear(cfg.width, cfg.cameras * cfg.latent)

    def forward(self, frames: torch.Tensor, proprio: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, c, k = frames.shape[:3]
        z = self.encoder(frames.reshape(b * c * k, *frames.shape[3:])).reshape(b, c * k * self.cfg.latent)
        p = self.proprio(self.proprio_norm(proprio).reshape(b, -1))
        h = self.out_norm(self.blocks(self.fuse(torch.cat([z, p], dim=1))))
        actions = self.action_head(h).reshape(b, self.cfg.action_chunk, self.cfg.action_dim)
        latents = self.latent_head(h).reshape(b, c, self.cfg.latent)
        return actions, latents

    def loss(self, batch: dict) -> tuple[torch.Tensor, dict[str, float]]:
        actions, latents = self(batch["frames"], batch["proprio"])
        future = batch["future"]
        b, c = future.shape[:2]
        with torch.no_grad():
            target = self.target_encoder(future.reshape(b * c, *future.shape[2:])).reshape(b, c, -1)
        action_loss = F.mse_loss(actions, batch["actions"])
        latent_loss = F.mse_loss(latents, target)
        total = action_loss + self.cfg.future_weight * latent_loss
        return total, {
            "loss": float(total.detach()),
            "action_loss": float(action_loss.detach()),
            "latent_loss": float(latent_loss.detach()),
        }

    @torch.no_grad()
    def update_target(self) -> None:
        for t, o in zip(self.target_encoder.parameters(), self.encoder.parameters(), strict=True):
            t.lerp_(o, 1.0 - self.cfg.ema)


__all__ = ["ModelConfig", "WorldActionModel"]
