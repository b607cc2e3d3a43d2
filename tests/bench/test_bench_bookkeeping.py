"""The bookkeeping benchmark (scripts/bench_bookkeeping.py) at its tiniest: the table's shape and the
invariants that hold whatever the timings (never the timings themselves)."""

import pytest

from sjd.bench import bookkeeping
from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.stages import STAGES
from sjd.types import Prompt

FRACS = [f"{s}_frac" for s in STAGES]


@pytest.fixture(scope="module")
def tiny_table():
    return bookkeeping.measure("toy", ["ar", "sjd"], windows=(16,), batches=(1,), n_batches=1, say=lambda _: None)


def test_one_row_per_decoder_window_and_batch(tiny_table):
    assert list(tiny_table.columns) == bookkeeping.COLUMNS
    assert sorted(zip(tiny_table.decoder, tiny_table.window, tiny_table.batch)) == [("ar", 16, 1), ("sjd", 16, 1)]
    assert dict(zip(tiny_table.decoder, tiny_table.windowed)) == {"ar": False, "sjd": True}
    assert (tiny_table.n_decodes == 1).all()


def test_ratios_are_to_sjd_and_the_split_is_a_partition(tiny_table):
    sjd = tiny_table.set_index("decoder").loc["sjd"]
    assert sjd.bookkeeping_ratio == 1.0
    ar = tiny_table.set_index("decoder").loc["ar"]
    assert ar.bookkeeping_ratio == pytest.approx(ar.bookkeeping_ms / sjd.bookkeeping_ms)
    ms = [c for c in tiny_table.columns if c.endswith("_ms")]
    assert (tiny_table[ms] >= 0).all().all()
    fracs = tiny_table[[*FRACS, "outside_model_frac"]]
    assert ((fracs >= 0) & (fracs <= 1)).all().all()
    assert tiny_table[FRACS].sum(axis=1).to_numpy() == pytest.approx(1.0, abs=1e-6)
    # bookkeeping is the non-forward stages, per forward of the decode loop
    parts = tiny_table[[f"{s}_ms" for s in bookkeeping.BOOKKEEPING_STAGES]].sum(axis=1)
    assert parts.to_numpy() == pytest.approx(tiny_table.bookkeeping_ms.to_numpy(), rel=1e-6)


def test_iterations_are_the_forwards_after_prefill(tiny_table, toy):
    ar = tiny_table.set_index("decoder").loc["ar"]
    assert ar.iterations == toy.layout.n_tokens - 1  # AR: one forward per token after the prefill's
    assert 0 < tiny_table.set_index("decoder").loc["sjd"].iterations < ar.iterations


def test_decoders_the_model_cannot_run_are_skipped_by_name(toy):
    said = []
    field = bookkeeping.entrants(bookkeeping.decoder_configs(["sjd", "sjd2"]), toy, [16, 64], said.append)
    assert [(e.name, e.window) for e in field] == [("sjd", 16), ("sjd", 64)]
    assert [e.decoder.window for e in field] == [16, 64]
    assert len(said) == 1 and "sjd2" in said[0] and "embeds" in said[0]
    with pytest.raises(ValueError, match="no_such_decoder"):
        bookkeeping.decoder_configs(["sjd", "no_such_decoder"])


def test_iterations_count_the_model_calls_of_the_decode_loop(toy, monkeypatch):
    """A batch of two: the loop runs until its slower row is done, so iterations = its forwards."""
    calls = []
    for method in ("forward", "forward_at"):
        real = getattr(toy, method)
        monkeypatch.setattr(toy, method, lambda *a, _real=real: calls.append(1) or _real(*a))
    adapter_field = bookkeeping.entrants(bookkeeping.decoder_configs(["sjd"]), toy, [16], lambda _: None)
    prompts = [Prompt("a", "large red circle center"), Prompt("b", "small blue square top left on green")]
    result = adapter_field[0].decoder.generate(
        toy, prompts, SamplingConfig(3.0, 1.0, 200), make_generators(0, ["a", "b"], toy.device)
    )
    assert calls and bookkeeping.row([bookkeeping.Decode(adapter_field[0], 2, result)])["iterations"] == len(calls)


def test_bad_sizes_are_refused_naming_the_flag():
    with pytest.raises(ValueError, match="--windows"):
        bookkeeping.measure("toy", ["sjd"], windows=(0,), batches=(1,), n_batches=1)
    with pytest.raises(ValueError, match="--model 'no_such_model'"):
        bookkeeping.measure("no_such_model", ["sjd"], windows=(16,), batches=(1,), n_batches=1)


def test_the_written_csv_records_its_model_command_and_git_hash(tmp_path):
    """`--out` writes the table with what produced it: the model, the clock, the command as typed and the commit."""
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    root = Path(__file__).resolve().parents[2]
    args = ["--model", "toy", "--prompts", "1", "--decoders", "ar,sjd", "--windows", "16", "--batches", "1"]
    out = tmp_path / "bookkeeping.csv"
    proc = subprocess.run([sys.executable, "scripts/bench_bookkeeping.py", *args, "--out", str(out)],
                          cwd=root, capture_output=True, text=True)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pd.read_csv(out)
    assert set(table["model"]) == {"toy"} and set(table["clock"]) == {"CPU time of one thread"}
    assert table["command"].iloc[0] == "python scripts/bench_bookkeeping.py " + " ".join(args) + f" --out {out}"
    assert len(table["git_hash"].iloc[0]) >= 40
