"""Decoder classes stay flat and take their settings one way (docs/adding-a-decoder.md §1-§2): each is a dataclass
whose fields are its settings, at most four levels below `Decoder`; a change several decoders share is a part put
before the decoder in its bases (`Coupled`, `DrafterContinuation`, `HeadsContinuation`, `DrafterPart`), not a
parent."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import sjd.decoders
from sjd.decoders.base import Decoder

MAX_LEVELS = 4
MODULES = [f"sjd.decoders.{info.name}" for info in pkgutil.iter_modules(sjd.decoders.__path__)] + ["sjd.audit.controls"]


def decoder_classes() -> list[type]:
    out = []
    for name in MODULES:
        module = importlib.import_module(name)
        out += [
            cls
            for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Decoder) and cls is not Decoder and cls.__module__ == name
        ]
    return out


def levels_below_decoder(cls: type) -> int:
    """How many decoder classes stand between `cls` and `Decoder`, `cls` included (parts do not count)."""
    return sum(1 for k in cls.__mro__ if issubclass(k, Decoder) and k is not Decoder)


def test_no_decoder_class_is_more_than_four_levels_below_decoder():
    classes = decoder_classes()
    assert len(classes) >= 20, [c.__name__ for c in classes]
    deep = {c.__name__: levels_below_decoder(c) for c in classes if levels_below_decoder(c) > MAX_LEVELS}
    assert deep == {}, f"{deep}: make what the parent adds a part (sjd/decoders/coupled.py's Coupled is one)"


def test_each_real_decoder_class_has_one_decoder_parent_and_puts_its_parts_first():
    """On the classes themselves: each has exactly one decoder among its bases, the last one, and stands one level
    below it; every other base is a part (`Coupled`, `DrafterContinuation`, `HeadsContinuation`, `DrafterPart`,
    `WindowSettings`: none a Decoder), which adds no level. So the deepest, SJD-PAC's drafter and heads hybrids,
    stand four below Decoder: Decoder, WindowDecoder, SJDDecoder, SJDPACDecoder, then theirs."""
    from sjd.decoders.drafted import SJDPACDrafterDecoder
    from sjd.decoders.headed import SJDPACHeadsDecoder
    from sjd.decoders.sjd_pac import SJDPACDecoder

    parts = set()
    for cls in decoder_classes():
        parents = [b for b in cls.__bases__ if issubclass(b, Decoder)]
        assert len(parents) == 1 and cls.__bases__[-1] is parents[0], f"{cls.__name__}: bases {cls.__bases__}"
        above = 0 if parents[0] is Decoder else levels_below_decoder(parents[0])
        assert levels_below_decoder(cls) == above + 1, cls.__name__
        parts |= set(cls.__bases__[:-1])
    assert {p.__name__ for p in parts} >= {"Coupled", "DrafterContinuation", "HeadsContinuation", "DrafterPart"}
    assert not any(issubclass(p, Decoder) for p in parts)
    for hybrid in (SJDPACDrafterDecoder, SJDPACHeadsDecoder):
        assert levels_below_decoder(hybrid) == MAX_LEVELS == levels_below_decoder(SJDPACDecoder) + 1


@pytest.mark.parametrize("cls", decoder_classes(), ids=lambda c: c.__name__)
def test_every_decoder_takes_its_settings_as_dataclass_fields(cls):
    assert dataclasses.is_dataclass(cls), f"{cls.__name__} is not a dataclass"
    fields = dataclasses.fields(cls)
    assert all(f.kw_only for f in fields if f.init), f"{cls.__name__}: use @dataclass(eq=False, kw_only=True)"
    assert inspect.isabstract(cls) or "name" in {f.name for f in fields}  # a decoder a config can name
    declared = set(cls.__dataclass_fields__)  # fields and InitVars: what the generated __init__ takes
    taken = set(inspect.signature(cls.__init__).parameters) - {"self"}
    assert taken <= declared, f"{cls.__name__} has a hand-written __init__ taking {sorted(taken - declared)}"


def test_a_decoder_that_is_not_a_dataclass_is_told_so_when_its_settings_are_recorded():
    class HandWritten(Decoder):
        def __init__(self) -> None:
            self.name = "hand_written"

        def generate(self, adapter, prompts, sampling, generators):
            raise NotImplementedError

    with pytest.raises(TypeError, match="HandWritten must be a dataclass"):
        HandWritten().config()
