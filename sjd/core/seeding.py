"""Per-prompt random generators: a sample's randomness depends only on (run seed, prompt id, seed index)."""

from __future__ import annotations

import hashlib

import torch


def prompt_seed(seed: int, prompt_id: str) -> int:
    """A prompt's generator seed depends only on (run seed, prompt id): never on batch or order."""
    digest = hashlib.sha256(f"{seed}:{prompt_id}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def make_generators(seed: int, prompt_ids: list[str], device: torch.device) -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(prompt_seed(seed, pid)) for pid in prompt_ids]


def sample_generators(seed: int, samples: list[tuple[str, int]], device: torch.device) -> list[torch.Generator]:
    """Generators for (prompt id, seed index) samples: sample k of a prompt is seeded as that prompt
    in a run with seed + k, so seeds_per_prompt=4 holds the samples of runs with seeds seed..seed+3."""
    return [torch.Generator(device=device).manual_seed(prompt_seed(seed + k, pid)) for pid, k in samples]
