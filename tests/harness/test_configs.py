"""Every model x decoder composes; unknown names get Hydra's own error listing the options."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from sjd.harness.decoder_configs import algorithm_configs, decoder_config, variant_configs

ROOT = Path(__file__).resolve().parents[2]
MODELS = sorted(p.stem for p in (ROOT / "conf" / "model").glob("*.yaml"))
DECODERS = algorithm_configs()
VARIANTS = variant_configs()
EXPERIMENTS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))


def test_every_decoder_config_composes_through_hydra_as_decoder_config_reads_it(compose_cfg):
    """`decoder=<name>` puts conf/decoder/<name>.yaml, its defaults list applied, at `decoder` and changes nothing
    else of the run config, and `model=<name>` changes nothing outside the model and its eval config: so a run
    config with any model and decoder is the model's composed config with that decoder put in (what
    test_every_model_and_decoder_composes builds)."""
    plain = OmegaConf.to_container(compose_cfg(["model=toy"]))
    for name in [*DECODERS, *VARIANTS]:
        cfg = OmegaConf.to_container(compose_cfg(["model=toy", f"decoder={name}"]))
        assert cfg.pop("decoder") == OmegaConf.to_container(decoder_config(name)), name
        assert cfg == {k: v for k, v in plain.items() if k != "decoder"}, name
    # and a model config touches the model (and the eval config named after it), never the decoder
    for model in MODELS:
        cfg = OmegaConf.to_container(compose_cfg([f"model={model}"]))
        assert cfg["decoder"] == plain["decoder"], model
        assert {k: v for k, v in cfg.items() if k not in ("model", "eval")} == {
            k: v for k, v in plain.items() if k not in ("model", "eval")
        }, model


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("decoder", DECODERS)
def test_every_model_and_decoder_composes(compose_cfg, model, decoder):
    """The model's composed run config with the decoder's config put in, as `model=<model> decoder=<decoder>` composes
    it (the test above holds the two equal): Hydra composes each model once, not each of the pairs, at a quarter of
    a second a composition. Interpolations into the model (a drafter's weights) resolve in the pair's config."""
    cfg = compose_cfg([f"model={model}"])
    cfg.decoder = decoder_config(decoder)
    assert cfg.model.name == model and cfg.decoder.name == decoder
    assert cfg.baseline.name == "ar"
    if "drafter" in cfg.decoder and cfg.model.get("drafter") is None:
        # a drafter decoder on a model with no shipped drafter stops at once, naming the key to set
        with pytest.raises(Exception, match=r"needs a trained drafter: set `decoder\.drafter\.weights`"):
            instantiate(cfg.decoder)
        d = instantiate(cfg.decoder, drafter={"weights": "random"})
    elif "heads" in cfg.decoder and cfg.decoder.heads.get("weights") is None:  # model.heads or model.spatial_heads
        # a heads decoder on a model with no shipped heads stops at once, naming the key to set
        with pytest.raises(Exception, match=r"needs draft heads: set `decoder\.heads\.weights`"):
            instantiate(cfg.decoder)
        d = instantiate(cfg.decoder, heads={"weights": "random"})
    else:
        d = instantiate(cfg.decoder)
    assert d.name == decoder


def test_a_decoder_constructors_defaults_are_its_own_configs():
    """Defaults live in one place: where a decoder class's default `name` is an algorithm config's, every default of
    its constructor equals that config's value (a drafter decoder's `drafter` aside: the config reads the model's)."""
    import inspect

    checked = 0
    for name in DECODERS:
        config = OmegaConf.to_container(decoder_config(name))
        params = inspect.signature(get_class(config["_target_"]).__init__).parameters
        defaults = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
        if defaults.get("name") != name:
            continue
        checked += 1
        own = {k: v for k, v in defaults.items() if k not in ("drafter", "heads")}
        differ = {k: (v, config.get(k)) for k, v in own.items() if config.get(k, v) != v}
        assert not differ, f"{name}: constructor default vs conf/decoder/{name}.yaml: {differ}"
    assert checked >= 15, checked


def test_every_decoder_variant_builds_its_decoder_under_its_own_name(compose_cfg):
    """A variant (conf/decoder/<name>.yaml with a defaults list) composes through Hydra as decoder_config composes
    it for tools (the test above), and builds its decoder under its own name."""
    for name in VARIANTS:
        cfg = compose_cfg(["model=toy", f"decoder={name}"])
        assert "_target_" in cfg.decoder and instantiate(cfg.decoder).name == name


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_composes_and_builds_its_decoders(compose_cfg, experiment):
    from sjd.harness.runner import build_decoders

    cfg = compose_cfg([f"experiment={experiment}"])
    assert cfg.experiment_name == experiment
    if "drafter" in cfg.decoder and cfg.decoder.drafter.weights is None:  # a paper overlay needing released weights
        with pytest.raises(Exception, match=r"decoder\.drafter\.weights"):
            build_decoders(cfg)
        cfg = compose_cfg([f"experiment={experiment}", "decoder.drafter.weights=random"])
    decoders, baseline = build_decoders(cfg)
    if cfg.get("baseline") is None:  # a forwards-only study: no AR to time against
        assert baseline is None and cfg.study is not None and not cfg.save_images
    else:
        assert baseline == "ar" and decoders[0].name == "ar"


# Settings that are the harness's improvements, never the official code's: (attribute, its harness value).
HARNESS_ONLY = (
    ("schedule", "harness"),  # the official SJD loop's window rule is `official`
    ("forced_drafts", True),  # the official samplers draft grammar-forced slots like any other
    ("verification", "block"),  # block verification (Sun et al.) is no published row's rule
    ("init", "vertical_dist"),  # our distribution drafts
)
PUBLISHED = pd.read_csv(ROOT / "results" / "paper" / "published.csv")
PAPER_OVERLAYS = sorted(set(EXPERIMENTS) & set(PUBLISHED["table"]))


def harness_only_settings(decoder) -> list[str]:
    """`key=value` for each harness-only improvement the built decoder has switched on."""
    return [f"{key}={value}" for key, value in HARNESS_ONLY if key in vars(decoder) and vars(decoder)[key] == value]


def published_rows(cfg):
    """The decoders a paper overlay builds, as run.py builds them, less its `_harness` rows."""
    from sjd.harness.runner import build_decoders

    return [d for d in build_decoders(cfg)[0] if not d.name.endswith("_harness")]


@pytest.mark.parametrize("table", PAPER_OVERLAYS)
def test_published_rows_of_paper_overlays_enable_no_harness_only_improvement(compose_cfg, table):
    """Every row of a paper overlay not named `_harness` runs the official algorithm: the official
    schedule and drafts, the method's own verification and drafts."""
    cfg = compose_cfg([f"experiment={table}"])
    rows = published_rows(cfg)
    assert {d.name for d in rows} & set(PUBLISHED.query("table == @table")["method"]), table
    offending = {d.name: harness_only_settings(d) for d in rows if harness_only_settings(d)}
    assert not offending, f"{table}: published-method rows with harness-only settings: {offending}"


@pytest.mark.parametrize(
    "override, expected",
    [
        ("decoder.forced_drafts=true", "forced_drafts=True"),
        ("decoder.schedule=harness", "schedule=harness"),
        ("decoder.verification=block", "verification=block"),
        ("named_decoders.jacobi.forced_drafts=true", "forced_drafts=True"),
    ],
)
def test_the_overlay_check_catches_a_published_row_with_a_harness_improvement(compose_cfg, override, expected):
    cfg = compose_cfg(["experiment=sjd_lumina_coco5k", override])
    assert any(expected in harness_only_settings(d) for d in published_rows(cfg)), override


STUDY_COMMANDS = [
    (path.stem, command)
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml"))
    for command in (OmegaConf.load(path).get("study") or {}).get("commands", [])
]


@pytest.mark.parametrize("experiment, command", STUDY_COMMANDS, ids=[c for _, c in STUDY_COMMANDS])
def test_every_study_command_composes_and_writes_to_its_study_csv(compose_cfg, experiment, command):
    from sjd.harness.runner import build_decoders

    words = command.split()
    assert words[:2] == ["python", "run.py"] and words[2] == f"experiment={experiment}", command
    cfg = compose_cfg(words[2:])
    build_decoders(cfg)
    assert cfg.results_csv == f"results/studies/{cfg.study.page}.csv"
    assert cfg.experiment_name == experiment


def test_default_config_is_toy_sjd_against_ar(compose_cfg):
    cfg = compose_cfg()
    assert (cfg.model.name, cfg.decoder.name, cfg.baseline.name, cfg.prompts.name) == ("toy", "sjd", "ar", "toy")
    get_class(cfg.model.adapter._target_)


@pytest.mark.parametrize("group, name", [("model", "nosuchmodel"), ("decoder", "nosuchdecoder")])
def test_unknown_names_list_the_options(group, name):
    """...before anything heavy is imported: run.py imports the runner (torch, the models) once Hydra has composed
    the config (`-X importtime` lists every module the process imported)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", str(ROOT / "run.py"), f"{group}={name}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert f"Could not find '{group}/{name}'" in proc.stderr
    assert "Available options" in proc.stderr and ("toy" in proc.stderr or "sjd" in proc.stderr)
    imported = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "hydra" in imported and not {"torch", "transformers", "sjd.harness.runner"} & imported


@pytest.mark.slow
def test_a_sweep_through_the_submitit_local_launcher_is_collected(tmp_path):
    sweep = tmp_path / "sweep"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "--multirun", "hydra/launcher=local", "decoder=sjd,csjd",
         "decoder.window=8,16", f"hydra.sweep.dir={sweep}", "prompts.n=1", "warmup=0", "save_images=false",
         "results_csv=null", "eval=none"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(sweep.glob(".submitit/*"))  # the jobs went through submitit
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "collect_sweep.py"), str(sweep)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    table = pd.read_csv(sweep / "sweep.csv")
    assert len(table) == 8 and table["job"].nunique() == 4  # AR + the decoder per job: the README's sweep
    jobs = {(d, json.loads(c)[d]["window"]) for d, c in zip(table["decoder"], table["decoder_configs"]) if d != "ar"}
    assert jobs == {("sjd", 8), ("sjd", 16), ("csjd", 8), ("csjd", 16)}


# An overlay that re-runs another's decoders under the same names, for a page that reads both runs together
# (the goal page's per-run parts, the regime map's cells keyed by model, decoder and window): (overlay,
# overlay it shares names with, overrides both take).
SHARED_NAMES = [
    ("beyond_sjd_pac_sized", "beyond_sjd_pac", []),
    ("regime_variants", "regime_map", ["decoder.window=16"]),
    ("regime_variants", "regime_map", ["decoder.window=64"]),
    ("regime_drafters", "regime_map", ["decoder.window=16", "model=toy", "prompts=toy"]),
    ("regime_drafters", "regime_map", ["decoder.window=64", "model=standin_lumina_512_cal"]),
    ("drafters", "beyond_sjd_pac", []),
    ("drafters_confirm", "drafters", []),
    ("heads", "drafters", []),
]


@pytest.mark.parametrize(("overlay", "other", "overrides"), SHARED_NAMES)
def test_a_decoder_name_two_overlays_share_means_the_same_settings(compose_cfg, overlay, other, overrides):
    from sjd.harness.runner import build_decoders

    def configs(experiment: str) -> dict:
        decoders, _ = build_decoders(compose_cfg([f"experiment={experiment}", *overrides]))
        return {d.name: d.config() for d in decoders}

    mine, theirs = configs(overlay), configs(other)
    shared = sorted(set(mine) & set(theirs))
    assert len(shared) >= 3, shared
    assert {n: mine[n] for n in shared} == {n: theirs[n] for n in shared}


def test_an_overlay_names_a_decoder_config_and_changes_only_what_differs(compose_cfg):
    """`- /decoder@named_decoders.<row>: <name>` in an overlay's defaults builds conf/decoder/<name>.yaml with the
    overlay's changes, in the overlay's order; a bad setting there is named at start-up with its key."""
    from sjd.harness.config_check import check_run_config
    from sjd.harness.runner import build_decoders

    cfg = compose_cfg(["experiment=drafters"])
    built = {d.name: d for d in build_decoders(cfg)[0]}
    assert list(built)[2:] == list(cfg.named_decoders)  # after AR and the run's decoder, in the overlay's order
    pac = built["csjd_pac_drafter_w64"]
    assert (pac.continuation, pac.window, pac.branches) == (16, 64, 4)  # conf/decoder/csjd_pac_drafter.yaml
    assert built["csjd_pac_drafter_c4_w64"].continuation == 4  # the overlay's change
    bad = compose_cfg(["experiment=drafters", "+named_decoders.csjd_drafter_c16_w64.no_such_setting=1"])
    with pytest.raises(ValueError, match=r"named_decoders\.csjd_drafter_c16_w64"):
        check_run_config(bad)


def test_an_overlays_rows_are_named_by_their_rows_and_its_window_rows_follow_the_run(compose_cfg):
    """`named_decoders.<row>` is named `<row>` whatever config it builds, and `named_window: ${decoder.window}` runs
    every row of the window family at the command's window, while PJD's row window and ZipAR keep their own."""
    from sjd.harness.runner import build_decoders

    cfg = compose_cfg(["experiment=regime_map", "model=toy", "prompts=toy", "decoder.window=32"])
    built = {d.name: d for d in build_decoders(cfg)[0]}
    assert set(cfg.named_decoders) <= set(built)
    assert type(built["csjd_harness"]).__name__ == "CoupledSJDDecoder"  # conf/decoder/csjd.yaml, named by its row
    window_rows = [n for n in cfg.named_decoders if hasattr(built[n], "window_schedule")]
    assert len(window_rows) >= 10 and {built[n].window for n in window_rows} == {32}
    assert built["pjd"].window == decoder_config("pjd").window != 32
    assert built["zipar_c8"].context == 8


def test_without_named_window_each_row_keeps_its_configs_window(compose_cfg):
    from sjd.harness.runner import build_decoders

    cfg = compose_cfg(["experiment=regime_map", "model=toy", "prompts=toy", "named_window=null"])
    built = {d.name: d for d in build_decoders(cfg)[0]}
    assert built["csjd_pac"].window == decoder_config("csjd_pac").window == 64 and cfg.decoder.window == 16


def test_a_named_window_below_one_is_refused_by_its_key(compose_cfg):
    from sjd.harness.config_check import ConfigError, check_run_config

    with pytest.raises(ConfigError, match="named_window"):
        check_run_config(compose_cfg(["experiment=regime_map", "model=toy", "prompts=toy", "named_window=0"]))
