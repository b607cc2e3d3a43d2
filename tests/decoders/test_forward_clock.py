"""ForwardClock on a GPU: each model call is bracketed by CUDA events that nothing waits for during the decode;
`model_s` resolves them once, afterwards. Run here with a stand-in for torch.cuda.Event that logs what is asked
of it (no GPU is needed to see who waits)."""

import torch

from sjd.decoders.base import ForwardClock
from sjd.types import Logits


class FakeEvent:
    log: list[str] = []
    clock = 0.0

    def __init__(self, enable_timing: bool = False) -> None:
        self.at = None

    def record(self) -> None:
        FakeEvent.clock += 1.5  # each event 1.5 ms after the one before
        self.at = FakeEvent.clock
        FakeEvent.log.append("record")

    def synchronize(self) -> None:
        FakeEvent.log.append("synchronize")

    def elapsed_time(self, end: "FakeEvent") -> float:
        return end.at - self.at


class GPUAdapter:
    name = "fake"
    device = torch.device("cuda")

    def timed_by(self, clock) -> None:
        pass


def test_no_forward_waits_for_its_events_and_model_s_resolves_them_once(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.log, FakeEvent.clock = [], 0.0
    clock = ForwardClock(GPUAdapter())
    clock.defer_finite_check = True  # as the window decoders run it
    logits = Logits(torch.zeros(1, 2, 3), torch.zeros(1, 2, 3))
    for _ in range(3):
        clock._timed(lambda: logits)
    assert "synchronize" not in FakeEvent.log and clock.calls == 3
    assert clock.model_s == 3 * 1.5 / 1000  # start to end of each call, GPU clock
    assert FakeEvent.log.count("synchronize") == 1
    assert clock.model_s == 3 * 1.5 / 1000 and FakeEvent.log.count("synchronize") == 1  # resolved once


def test_ar_starts_and_finishes_on_the_forward_clock_as_every_decoder_does(monkeypatch):
    """AR's prefill_s and decode_s are split where every decoder's are (ForwardClock.start: the prefill and
    position 0's token; finish: the rest, once the device is idle), so a latency ratio compares like with like."""
    from sjd.bench.bookkeeping import build_model, prompt_batches
    from sjd.core.seeding import make_generators
    from sjd.decoders.ar import ARDecoder

    calls = []
    for name in ("start", "finish"):
        method = getattr(ForwardClock, name)

        def spy(self, *args, _method=method, _name=name, **kwargs):
            calls.append(_name)
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(ForwardClock, name, spy)
    adapter, sampling = build_model("toy")
    (group,) = prompt_batches("toy", 1, 2)
    prompts = [p for p, _ in group]
    with torch.no_grad():
        result = ARDecoder().generate(
            adapter, prompts, sampling, make_generators(0, [p.prompt_id for p in prompts], "cpu")
        )
    assert calls == ["start", "finish"]
    assert result.prefill_s > 0 and result.decode_s > 0 and result.n_forward == [adapter.layout.n_tokens] * 2
