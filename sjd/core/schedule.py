"""Window schedules: how many forward inputs a row of SJD's loop gets at each iteration.

Two schedules (`decoder.schedule`):

- `harness` (the default): a window of `window` inputs, one token per forward at generated
  positions below `ar_prefix` and in the last `ar_suffix`, shrunk to the tokens left.
- `official`: the window rule of the official SJD sampler (`_sample` in its Lumina-mGPT
  scheduler, which its Anole, Emu3 and LlamaGen paths reuse). It runs Jacobi iterations only while
  the generated length is in [l, r), with a window of min(window, r - g), else one token per
  forward; g is the generated length *before* the iteration that just ran, because the sampler
  computes the next window before it updates its length. So the window lags one iteration: it is
  sized from where the row stood one commit ago, and the last window before r may reach past r by
  what that commit added. l and r come from the image layout by the rule the official scripts use
  for each model family (`official_interval`).

Both are pure: `width(committed, previous)` maps a row's committed length and its committed length
one iteration earlier (0 before the prefill's token) to the next window, 0 when the row is complete.
Windows never run past the image (the official loop stops there at its end-of-sequence token).
"""

from __future__ import annotations

from dataclasses import dataclass

from sjd.types import ImageLayout

SCHEDULES = ("harness", "official")


@dataclass(frozen=True)
class JacobiInterval:
    """Generated positions [l, r) are decoded with Jacobi windows, the others one per forward."""

    l: int  # noqa: E741 - the official code's name
    r: int


def official_interval(family: str, layout: ImageLayout, window: int) -> JacobiInterval:
    """The official scripts' jacobi_loop_interval_l/r for a model family at this layout's size.

    Taken from the loaders its evaluation script (eval_model.py, behind the paper's COCO and Parti
    tables) uses; h is the number of code rows, which those scripts compute as target_size // 16
    (// 8 on Emu3) and assume square:
      lumina    l = 1, r = h * (w + 1) - 10: the image body (rows with their end-of-line) minus 10,
                so the last 15 of Lumina's tokens (2357 at 768 px, r = 2342) are single steps.
                (The repository's demo script test_lumina_mgpt.py uses l = 3 with the same r.)
      anole     l = 1, r = h * h + h - 10: Lumina's formula reused; Anole has no end-of-line
                token, so r lies past the image and only the end shrinks the window.
      emu3      l = 1, r = h * (w + 1) - 1.
      llamagen  l = 1, r = h * w - window - 2.
      generic   l = 1, r = h * row_stride: the official sampler's own default (sized for a
                768 px Lumina image: 48 * 48 + 48), for models the official code never ran
                (the toy, the micro audit model, Janus-Pro).
    """
    h, w, stride = layout.height, layout.width, layout.row_stride
    rules = {
        "lumina": (1, h * (w + 1) - 10),
        "anole": (1, h * h + h - 10),
        "emu3": (1, h * (w + 1) - 1),
        "llamagen": (1, h * w - window - 2),
        "generic": (1, h * stride),
    }
    if family not in rules:
        raise ValueError(f"unknown official schedule family {family!r}; known: {sorted(rules)}")
    return JacobiInterval(*rules[family])


@dataclass(frozen=True)
class HarnessSchedule:
    window: int
    ar_prefix: int
    ar_suffix: int
    n_tokens: int

    def width(self, committed: int, previous: int) -> int:
        remaining = self.n_tokens - committed
        if remaining <= 0:
            return 0
        if committed < self.ar_prefix or committed >= self.n_tokens - self.ar_suffix:
            return 1
        return min(self.window, remaining)


@dataclass(frozen=True)
class OfficialSchedule:
    window: int
    interval: JacobiInterval
    n_tokens: int

    def width(self, committed: int, previous: int) -> int:
        remaining = self.n_tokens - committed
        if remaining <= 0:
            return 0
        l, r = self.interval.l, self.interval.r  # noqa: E741
        if l <= previous < r:
            return min(self.window, r - previous, remaining)
        return 1


WindowSchedule = HarnessSchedule | OfficialSchedule


def check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"decoder.schedule must be one of {SCHEDULES}, got {schedule!r}")


def make_schedule(
    schedule: str, window: int, ar_prefix: int, ar_suffix: int, layout: ImageLayout, family: str = "generic"
) -> WindowSchedule:
    """The schedule a decoder runs on a model: `family` names the model's official rule
    (ModelAdapter.official_schedule); `ar_prefix` / `ar_suffix` serve the harness schedule only."""
    check_schedule(schedule)
    if schedule == "official":
        return OfficialSchedule(window, official_interval(family, layout, window), layout.n_tokens)
    return HarnessSchedule(window, ar_prefix, ar_suffix, layout.n_tokens)
