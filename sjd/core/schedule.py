"""Window schedules: how many forward inputs a row of SJD's loop gets at each iteration.

Three schedules (`decoder.schedule`):

- `harness` (the default): a window of `window` inputs, one token per forward at generated
  positions below `ar_prefix` and in the last `ar_suffix`, shrunk to the tokens left.
- `official`: the window rule of the official SJD sampler (`_sample` in its Lumina-mGPT
  scheduler, which its Anole, Emu3 and LlamaGen paths reuse). It runs Jacobi iterations only while
  the generated length is in [l, r), with a window of min(window, r - g), else one token per
  forward; g is the generated length *before* the iteration that just ran, because the sampler
  computes the next window before it updates its length. So the window lags one iteration: it is
  sized from where the row stood one commit ago, and the last window before r may reach past r by
  what that commit added. r comes from the image layout by the rule the official scripts use
  for each model family (`official_interval`); l is `official_l`, 1 by default: the value of the
  official evaluation loaders for every family (the repository's Lumina-mGPT demo script uses 3).
- `adaptive` (ours): the harness schedule with each window sized from what the row's last forward
  committed: ADAPTIVE_GAIN times that many tokens, at least ADAPTIVE_FLOOR, at most `window`. Where
  drafts keep being rejected (high entropy) a wide window forwards inputs that are never committed;
  where a run of drafts has converged the window grows back. The width depends only on tokens
  already committed, so the decoder stays exactly as lossless as under a fixed window.

All three are pure: `width(committed, previous)` maps a row's committed length and its committed length
one iteration earlier (0 before the prefill's token) to the next window, 0 when the row is complete.
Windows never run past the image (the official loop stops there at its end-of-sequence token).
"""

from __future__ import annotations

from dataclasses import dataclass

from sjd.types import ImageLayout

SCHEDULES = ("harness", "official", "adaptive")
ADAPTIVE_GAIN = 2  # adaptive windows: this many inputs per token the last forward committed,
ADAPTIVE_FLOOR = 4  # and never fewer than this (a window of 1 is AR and could not grow back)


@dataclass(frozen=True)
class JacobiInterval:
    """Generated positions [l, r) are decoded with Jacobi windows, the others one per forward."""

    l: int  # noqa: E741 - the official code's name
    r: int


OFFICIAL_L = 1  # jacobi_loop_interval_l of the official evaluation loaders, for every model family


def official_interval(family: str, layout: ImageLayout, window: int, l: int = OFFICIAL_L) -> JacobiInterval:  # noqa: E741
    """The official scripts' jacobi_loop_interval_l/r for a model family at this layout's size.

    Taken from the loaders its evaluation script (eval_model.py, behind the paper's COCO and Parti
    tables) uses; h is the number of code rows, which those scripts compute as target_size // 16
    (// 8 on Emu3) and assume square. Those loaders use l = 1 for every family; `l` overrides it
    (the repository's demo script test_lumina_mgpt.py uses l = 3: begin-of-image and the two size
    tokens decoded one per forward). The r rules:
      lumina    r = h * (w + 1) - 10: the image body (rows with their end-of-line) minus 10,
                so the last 15 of Lumina's tokens (2357 at 768 px, r = 2342) are single steps
                (the demo script uses the same r).
      anole     r = h * h + h - 10: Lumina's formula reused; Anole has no end-of-line
                token, so r lies past the image and only the end shrinks the window.
      emu3      r = h * (w + 1) - 1.
      llamagen  r = h * w - window - 2.
      generic   r = h * row_stride: the official sampler's own default (sized for a
                768 px Lumina image: 48 * 48 + 48), for models the official code never ran
                (the toy, the micro audit model, Janus-Pro).
    """
    h, w, stride = layout.height, layout.width, layout.row_stride
    right = {
        "lumina": h * (w + 1) - 10,
        "anole": h * h + h - 10,
        "emu3": h * (w + 1) - 1,
        "llamagen": h * w - window - 2,
        "generic": h * stride,
    }
    if family not in right:
        raise ValueError(f"unknown official schedule family {family!r}; known: {sorted(right)}")
    check_official_l(l)
    return JacobiInterval(l, right[family])


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


@dataclass(frozen=True)
class AdaptiveSchedule(HarnessSchedule):
    """The harness schedule's width, capped by what the row's last forward committed."""

    def width(self, committed: int, previous: int) -> int:
        widest = super().width(committed, previous)
        if widest <= 1:  # complete, a single step, or one token left
            return widest
        return min(widest, max(ADAPTIVE_FLOOR, ADAPTIVE_GAIN * (committed - previous)))


WindowSchedule = HarnessSchedule | OfficialSchedule | AdaptiveSchedule


def check_schedule(schedule: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"decoder.schedule must be one of {SCHEDULES}, got {schedule!r}")


def check_official_l(l: int) -> None:  # noqa: E741
    # l = 0 would window the prefill's own forward, which the official loop never does.
    if isinstance(l, bool) or not isinstance(l, int) or l < 1:
        raise ValueError(f"decoder.official_l must be an integer >= 1, got {l!r}")


def make_schedule(
    schedule: str,
    window: int,
    ar_prefix: int,
    ar_suffix: int,
    layout: ImageLayout,
    family: str = "generic",
    official_l: int = OFFICIAL_L,
) -> WindowSchedule:
    """The schedule a decoder runs on a model: `family` names the model's official rule
    (ModelAdapter.official_schedule) and `official_l` its l; `ar_prefix` / `ar_suffix` serve the
    harness and adaptive schedules only."""
    check_schedule(schedule)
    if schedule == "official":
        interval = official_interval(family, layout, window, official_l)
        return OfficialSchedule(window, interval, layout.n_tokens)
    if schedule == "adaptive":
        return AdaptiveSchedule(window, ar_prefix, ar_suffix, layout.n_tokens)
    return HarnessSchedule(window, ar_prefix, ar_suffix, layout.n_tokens)
