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


def test_the_level_count_sees_a_class_built_on_the_deepest():
    deepest = max(decoder_classes(), key=levels_below_decoder)
    child = type("Child", (deepest,), {})
    assert levels_below_decoder(child) == levels_below_decoder(deepest) + 1


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
