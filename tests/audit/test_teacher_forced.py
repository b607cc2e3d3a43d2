"""The one-sample teacher-forced audit (sjd.audit.teacher_forced): its transform and statistics on
hand-made distributions, its calibration (exact samplers pass: U uniform, Z standard normal across
seeds) on the micro model, every lossless decoder passing, and the negative controls it catches."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from scipy import stats

from sjd.audit.controls import CONTROLS, make_control
from sjd.audit.driver import AuditDraws
from sjd.audit.in_run import block_depths
from sjd.audit.teacher_forced import (
    STATISTICS,
    TokenTerms,
    code_grid,
    exactness_statistics,
    pit_uniforms,
    position_terms,
    tokens_for_power,
    zero_share_by_block_row,
)
from sjd.core.sampling import SamplingConfig
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.harness.decoder_configs import algorithm_configs
from sjd.harness.decoder_configs import decoder_config as load_decoder_config
from sjd.models.micro import MicroAdapter

ROOT = Path(__file__).resolve().parents[2]
MICRO = SamplingConfig(cfg_scale=2.0)
TREE_CONTROLS = {"ratio_rule_top_k"}  # needs a drafter: experiment=audit_controls_drafter runs it


def micro(side: int = 2, codes: int = 3, scale: float = 6.0) -> MicroAdapter:
    return MicroAdapter(height=side, width=side, n_codes=codes, logit_scale=scale)


def test_position_terms_rank_by_probability_then_id():
    probs = torch.tensor([[[0.5, 0.3, 0.2], [0.25, 0.5, 0.25], [0.25, 0.5, 0.25], [0.0, 1.0, 0.0]]])
    tokens = torch.tensor([[1, 2, 0, 0]])
    px, above, h, second = position_terms(probs, tokens, _all_free(3))
    np.testing.assert_allclose(px[0], [0.3, 0.25, 0.25, 0.0])
    # 0.5 ranks above 0.3; at a tie the lower id ranks above: id 2 has ids 1 and 0 above it, id 0 only id 1
    np.testing.assert_allclose(above[0], [0.5, 0.75, 0.5, 1.0])
    p = np.array([0.5, 0.3, 0.2])
    np.testing.assert_allclose(h[0, 0], -(p * np.log(p)).sum())
    np.testing.assert_allclose(second[0, 0], (p * np.log(p) ** 2).sum())


def _exact_terms(rng: np.random.Generator, n: int, t: int, v: int) -> tuple[TokenTerms, np.ndarray]:
    """n sequences of t independent draws from random distributions over v ids, with their terms."""
    p = rng.dirichlet(np.full(v, 0.7), size=(n, t))
    x = (p.cumsum(-1) > rng.random((n, t, 1))).argmax(-1)
    return TokenTerms(*position_terms(torch.from_numpy(p), torch.from_numpy(x), _all_free(v))), x


def _all_free(v: int):
    return type("L", (), {"free_columns": lambda self, device: slice(0, v)})()


def _grid(t: int, stride: int):
    return type("G", (), {"tested": np.ones(t, bool), "row": np.arange(t) // stride, "row_stride": stride})()


def test_exact_draws_give_uniform_independent_u_and_standard_normal_z():
    rng = np.random.default_rng(0)
    zs, ps = [], []
    for seed in range(40):
        terms, _ = _exact_terms(rng, 40, 16, 12)
        out = exactness_statistics(terms, pit_uniforms(terms, range(seed * 40, seed * 40 + 40)), _grid(16, 4))
        zs.append(out["tf_z"])
        ps.append(out["tf_ks_p"])
    assert stats.kstest(zs, "norm").pvalue > 1e-3, zs  # Z ~ N(0, 1) across seeds
    assert stats.kstest(ps, "uniform").pvalue > 1e-3, ps  # the KS p-values are themselves uniform


def test_a_greedier_sampler_shows_negative_excess_and_an_impossible_token_fails():
    rng = np.random.default_rng(1)
    terms, _ = _exact_terms(rng, 200, 16, 12)
    greedy = TokenTerms(terms.p_token.copy(), terms.p_above.copy(), terms.entropy, terms.second)
    # every token replaced by the most likely id: p(x) = max p, nothing ranks above it
    p = rng.dirichlet(np.full(12, 0.7), size=(200, 16))
    t = TokenTerms(*position_terms(torch.from_numpy(p), torch.from_numpy(p.argmax(-1)), _all_free(12)))
    out = exactness_statistics(t, pit_uniforms(t, range(200)), _grid(16, 4))
    assert out["tf_excess_nats"] < -0.3 and out["tf_z"] < -10 and out["tf_p"] < 1e-30
    greedy.p_token[3, 5] = 0.0  # one committed token the model gives probability 0
    out = exactness_statistics(greedy, pit_uniforms(greedy, range(200)), _grid(16, 4))
    assert out["tf_zero_count"] == 1 and out["tf_p"] == 0.0 and out["tf_n_tokens"] == 200 * 16 - 1


def test_a_token_at_p_zero_that_ties_the_top_k_cutoff_is_counted_apart_not_failed():
    """A token the decode's forward ranked k-th and this forward ranks k+1-th, by float noise, is no evidence
    against the decoder: counted as a cutoff tie, left out of the test. One well below the cutoff still fails."""
    rng = np.random.default_rng(1)
    terms, _ = _exact_terms(rng, 200, 16, 12)
    terms.p_token[3, 5] = 0.0
    tie = np.zeros_like(terms.p_token, dtype=bool)
    tie[3, 5] = True
    tied = TokenTerms(terms.p_token, terms.p_above, terms.entropy, terms.second, tie)
    out = exactness_statistics(tied, pit_uniforms(tied, range(200)), _grid(16, 4))
    assert out["tf_zero_count"] == 0 and out["tf_cutoff_ties"] == 1 and out["tf_p"] > 1e-3
    assert out["tf_n_tokens"] == 200 * 16 - 1
    untied = TokenTerms(terms.p_token, terms.p_above, terms.entropy, terms.second)
    out = exactness_statistics(untied, pit_uniforms(untied, range(200)), _grid(16, 4))
    assert out["tf_zero_count"] == 1 and out["tf_cutoff_ties"] == 0 and out["tf_p"] == 0.0


def test_cutoff_ties_finds_a_token_a_float_past_the_top_k_cutoff_and_no_other():
    """Through the shared pipeline (CFG 3, top-k 2): id 2's guided logit 1e-6 under id 1's, the second largest,
    ties the cutoff; id 3's, far under it, does not; a token inside the top-k has p > 0 and is not looked at."""
    from sjd.audit.teacher_forced import cutoff_ties
    from sjd.core.sampling import logits_to_probs
    from sjd.types import Logits

    layout = micro().layout  # codes 5, 6, 7 at generated position 1
    ids = torch.nonzero(layout.free_tokens)[:, 0].tolist()
    cond = torch.full((1, 3, len(layout.free_tokens)), -30.0)
    cond[..., ids] = torch.tensor([2.0, 1.0, 1.0 - 1e-6])
    positions = torch.full((1, 3), 1)
    tokens = torch.tensor([[ids[2], ids[0], ids[2]]])
    sampling = SamplingConfig(cfg_scale=3.0, top_k=2)

    def p_of(logits: torch.Tensor) -> np.ndarray:
        probs = logits_to_probs(Logits(logits, logits.clone()), positions, layout, sampling)  # CFG mix: the row
        return probs.gather(-1, tokens[..., None])[..., 0].double().numpy()

    p_token = p_of(cond)
    assert p_token[0, 0] == 0 and p_token[0, 1] > 0
    assert cutoff_ties(Logits(cond, cond.clone()), positions, tokens, p_token, layout, sampling).tolist() == [
        [True, False, True]
    ]
    far = cond.clone()
    far[..., ids[2]] = -5.0
    p_token = p_of(far)
    assert p_token[0, 0] == 0 and not cutoff_ties(Logits(far, far.clone()), positions, tokens, p_token, layout,
                                                   sampling).any()  # fmt: skip


def test_forced_positions_are_not_tested_and_nothing_testable_is_nan():
    adapter = micro()
    grid = code_grid(adapter.layout)
    assert grid.tested.sum() == 4 and not grid.tested[0]
    n = adapter.layout.n_tokens
    ones = TokenTerms(np.ones((3, n)), np.zeros((3, n)), np.zeros((3, n)), np.zeros((3, n)))  # all one-point
    out = exactness_statistics(ones, pit_uniforms(ones, [0, 1, 2]), grid)
    assert out["tf_n_tokens"] == 0 and np.isnan(out["tf_p"]) and np.isnan(out["tf_z"])


def test_power_is_the_token_count_at_which_z_reaches_its_threshold():
    n = tokens_for_power(2.0)
    z_needed = stats.norm.isf(1e-3 / (2 * len(STATISTICS))) + stats.norm.isf(0.2)
    assert n * 0.01 / np.sqrt(n * 2.0) == pytest.approx(z_needed)
    assert tokens_for_power(4.0) == pytest.approx(2 * n) and np.isnan(tokens_for_power(0.0))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ar_on_the_micro_model_passes_with_uniform_u(seed):
    adapter = micro()
    draws = AuditDraws(adapter, MICRO, "a", 2000, 2000, seed)
    out = draws.one_sample(draws.reference[:2000], "r")
    assert out["tf_n_tokens"] == 2000 * 4 and out["tf_zero_count"] == 0
    assert out["tf_p"] > 1e-3 and abs(out["tf_z"]) < 4, out


def decoder_config(name: str, window: int = 4):
    """conf/decoder/<name>.yaml resolved on the micro model (a drafter decoder takes its `model.drafter`), at
    `window` where the decoder has one."""
    run = OmegaConf.create(
        {"decoder": load_decoder_config(name),
         "model": OmegaConf.load(ROOT / "conf" / "model" / "micro.yaml")}
    )  # fmt: skip
    cfg = OmegaConf.create(OmegaConf.to_container(run.decoder, resolve=True))
    if "window" in cfg:
        cfg.window = window
    return cfg


def lossless_configs() -> list[str]:
    """Every algorithm config that claims to be lossless and runs on the micro model (AR aside): found by
    globbing, so a new lossless decoder is audited without editing this file."""
    names = []
    for name in algorithm_configs():
        decoder = instantiate(decoder_config(name))
        if decoder.lossless and not isinstance(decoder, ARDecoder) and decoder.requires <= MicroAdapter.capabilities:
            names.append(name)
    return names


LOSSLESS = lossless_configs()


def lossless_decoder(name: str, window: int = 4):
    decoder = instantiate(decoder_config(name, window))
    assert decoder.lossless
    return decoder


def test_the_lossless_list_is_found_not_written():
    assert {"sjd", "csjd_pac", "sjd_pac", "eagle", "eagle_sampled"} <= set(LOSSLESS)
    assert "gsd" not in LOSSLESS and "ar" not in LOSSLESS


@pytest.mark.parametrize("name", LOSSLESS)
@pytest.mark.parametrize("seed", [0, 1])
def test_every_lossless_decoder_passes_on_a_micro_model(name, seed, one_thread):
    adapter = micro(3, 6, 3.0)  # 9 free codes, 6 ids each
    decoder = lossless_decoder(name)
    decoder.check(adapter)
    draws = AuditDraws(adapter, MICRO, "a", 1000, 1000, seed)
    out = draws.one_sample(draws.draw(decoder))
    assert out["tf_n_tokens"] == 9000 and out["tf_p"] > 1e-3, (name, out)


@pytest.mark.parametrize(
    ("control", "n", "alpha"),
    [("resample_from_p", 4000, 1e-6), ("q_before_top_k", 1000, 1e-6), ("ratio_rule_top_k", 1000, 1e-6)],
)
def test_negative_controls_are_caught_on_the_micro_model(control, n, alpha):
    adapter = micro()
    draws = AuditDraws(adapter, MICRO, "a", n, n, 0)
    out = draws.one_sample(draws.draw(make_control(control)))
    assert out["tf_p"] < alpha, out


# The three slips the micro model cannot show act only where a model's distributions move with their context
# (a stale q is wrong only when p changed under a kept draft) or where the window slides one token a step
# (a slot's Gumbel vector reused): so each is asserted on the smallest model where it acts, beside the exact
# decoder it corrupts, which must pass at the same size and seed. The sizes are the ones docs/algorithms.md
# (section 11.9) lists, each the fewest images at which its control fails by many orders of magnitude (at seed 0:
# the stale q p ~ 1e-44 at 30 images, the float8 drafts p ~ 1e-15 at 2, the reused Gumbel vector p ~ 1e-17 at 4,
# where 2 give only 1e-4); the controls study's third and fourth commands run every control at these sizes or more.
@pytest.mark.slow
def test_a_stale_q_is_caught_on_the_toy_at_window_64_where_exact_maximal_coupling_passes(toy, one_thread):
    from sjd.decoders.coupled import CoupledSJDDecoder

    sampling = SamplingConfig(cfg_scale=3.0)
    draws = AuditDraws(toy, sampling, "large red circle center and small blue square top left on green", 30, 30, 0)
    faulty = draws.one_sample(draws.draw(make_control("stale_q_maximal", window=64)))
    exact = draws.one_sample(draws.draw(CoupledSJDDecoder(name="csjd", window=64, coupling="maximal")))
    assert faulty["tf_p"] < 1e-6 and faulty["tf_n_tokens"] == 30 * 144, faulty
    assert exact["tf_p"] > 1e-3, exact


@pytest.fixture(scope="module")
def lumina_standin():
    from sjd.standin.adapter import StandinLuminaAdapter

    return StandinLuminaAdapter(asset="standin_lumina_512")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("control", "exact", "images"), [("slot_gumbel", "gumbel", 4), ("low_precision_drafts", "sjd", 2)]
)
def test_a_reused_gumbel_vector_and_low_precision_drafts_are_caught_on_a_lumina_standin(
    lumina_standin, one_thread, control, exact, images
):
    """Images of 1024 codes at about 5 nats a token, Lumina-mGPT's settings (top-k 2000, CFG 3)."""
    sampling = SamplingConfig(cfg_scale=3.0, top_k=2000)
    draws = AuditDraws(lumina_standin, sampling, "a rippled red field with blue patches", images, images, 0)
    faulty = draws.one_sample(draws.draw(make_control(control, window=16)))
    from sjd.decoders.coupled import CoupledSJDDecoder

    # the decoder each control corrupts: Gumbel-coupled SJD with a vector per position, and plain SJD
    same = (
        CoupledSJDDecoder(name="csjd_gumbel", window=16, coupling="gumbel")
        if exact == "gumbel"
        else SJDDecoder(window=16)
    )
    passing = draws.one_sample(draws.draw(same))
    assert faulty["tf_p"] < 1e-6 and faulty["tf_n_tokens"] == images * 1024, faulty
    assert passing["tf_p"] > 1e-3, passing


def test_ar_is_its_own_control_in_the_same_test():
    adapter = micro()
    draws = AuditDraws(adapter, MICRO, "a", 500, 500, 3)
    ar = draws.one_sample(draws.draw(ARDecoder()))
    assert ar["tf_n_images"] == 500 and np.isfinite(ar["tf_tokens_needed"]) and ar["tf_var_nats2"] > 0


def test_the_controls_study_audits_every_control_in_one_run(compose_cfg, tmp_path):
    """`python run.py experiment=audit_controls` at tiny size: every control and exact SJD get the one-sample
    audit of their own samples and the two-sample audit, with AR as the control; the decoders are the
    deliberately faulty ones of sjd/audit/controls.py, each claiming to be lossless."""
    from sjd.harness.runner import run

    cfg = compose_cfg(["experiment=audit_controls", "prompts.n=1", "seeds_per_prompt=3", "audit.n=6",
                       "decoder.window=4", "results_csv=null"])  # fmt: skip
    summary = run(cfg, tmp_path / "run").set_index("decoder")
    window_controls = [name for name in CONTROLS if name not in TREE_CONTROLS]  # the tree one has its own overlay
    assert list(summary.index) == ["ar", "sjd", *window_controls]
    tree_overlay = compose_cfg(["experiment=audit_controls_drafter"])
    assert {d["name"] for d in tree_overlay.extra_decoders} == TREE_CONTROLS  # every control has a study
    assert (summary["tf_n_images"] == 3).all() and (summary["tf_control_p"] == summary.loc["ar", "tf_p"]).all()
    assert summary["tf_p"].between(0, 1).all() and (summary["audit_n"] == 6).all()
    assert set(summary["tf_verdict"]) <= {"pass", "fail", "no power", "paths disagree (AR fails)"}


# -- the in-run audit (audit.teacher_forced) ------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["~baseline"], "audit.teacher_forced=true needs baseline=ar"),
        (["model.sampling.temperature=0"], "audit.teacher_forced=true needs random samples"),
        (["audit.teacher_forced=yes"], "audit.teacher_forced must be true or false"),
        (["audit.teacher_forced_batch=0"], "audit.teacher_forced_batch must be an integer >= 1"),
    ],
)
def test_a_bad_teacher_forced_setting_fails_at_start_up_naming_the_key(compose_cfg, tmp_path, overrides, message):
    from sjd.harness.runner import run

    cfg = compose_cfg(["audit.teacher_forced=true", *overrides])
    if overrides == ["audit.teacher_forced=yes"]:
        cfg.audit.teacher_forced = "yes"
    with pytest.raises(ValueError, match=message):
        run(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "samples.jsonl").exists()  # nothing was decoded


def test_a_run_audits_its_own_samples_with_ar_as_the_control(compose_cfg, tmp_path):
    from sjd.harness.runner import run

    cfg = compose_cfg(["model=micro", "prompts.n=4", "seeds_per_prompt=4", "batch_size=16", "decoder.window=4",
                       "warmup=0",
                       "save_images=false", "results_csv=null", "eval=none", "audit.teacher_forced=true"])  # fmt: skip
    summary = run(cfg, tmp_path / "run").set_index("decoder")
    assert summary.loc["ar", "tf_n_images"] == 16 and summary.loc["ar", "tf_n_tokens"] == 16 * 4
    assert (summary["tf_control_p"] == summary.loc["ar", "tf_p"]).all()
    assert summary.loc["ar", "tf_p"] > 1e-3 and summary.loc["sjd", "tf_p"] > 1e-3
    # 64 tokens are far fewer than a 0.01 nats/token excess needs: a pass without power is not a pass, for the
    # decoder and for AR, its control, alike
    assert summary.loc["sjd", "tf_verdict"] == "no power" and summary.loc["ar", "tf_verdict"] == "no power"
    assert summary.loc["sjd", "tf_tokens_needed"] > 64
    written = pd.read_csv(tmp_path / "run" / "summary.csv")
    assert {"tf_p", "tf_z", "tf_verdict", "tf_n_tokens"} <= set(written.columns)
    assert written[["tf_zero_share_top_row", "tf_zero_share_rows_below"]].isna().all().all()  # no blocks: NaN


def test_impossible_tokens_are_split_by_the_row_of_their_block():
    """tf_zero_share_top_row counts the impossible tokens among a block's top-row tokens only, and
    tf_zero_share_rows_below among the rows below only (SSD's `block_depth`: 0 top, >= 1 below, -1 no block)."""
    terms, _ = _exact_terms(np.random.default_rng(7), 4, 12, 6)
    depth_of_position = np.array([-1, 0, 0, 0, 1, 1, 1, 1, 2, 2, 0, -1])  # 4 top-row tokens, 6 below, per image
    depth = np.tile(depth_of_position, (4, 1))
    grid = type("G", (), {"tested": depth_of_position >= 0, "row": np.arange(12) // 4, "row_stride": 4})()
    for image, position in [(0, 1), (1, 2), (2, 10), (3, 3)]:  # 4 of the 16 top-row tokens
        terms.p_token[image, position] = 0.0
    for image, position in [(0, 4), (2, 8), (3, 9)]:  # 3 of the 24 tokens below
        terms.p_token[image, position] = 0.0
    split = zero_share_by_block_row(terms, grid, depth)
    assert split == {"tf_zero_share_top_row": 4 / 16, "tf_zero_share_rows_below": 3 / 24}
    whole = exactness_statistics(terms, pit_uniforms(terms, range(4)), grid)
    assert whole["tf_zero_share"] == pytest.approx(7 / 40)  # the two shares weigh back to the whole
    assert all(np.isnan(v) for v in zero_share_by_block_row(terms, grid, None).values())  # no blocks: NaN
    one_row = zero_share_by_block_row(terms, grid, np.where(depth > 0, 0, depth))  # every block one row tall
    assert one_row["tf_zero_share_top_row"] == 7 / 40 and np.isnan(one_row["tf_zero_share_rows_below"])


def test_the_in_run_audit_reads_the_block_rows_from_the_sample_records():
    """The audit takes SSD's record from each sample's extras, and only when every sample has one."""
    samples = pd.DataFrame({"extras": [{"block_depth": [-1, 0, 1]}, {"block_depth": [-1, 1, 0]}]})
    np.testing.assert_array_equal(block_depths(samples), [[-1, 0, 1], [-1, 1, 0]])
    assert block_depths(samples.assign(extras=[{"block_depth": [-1, 0, 1]}, {}])) is None
    assert block_depths(pd.DataFrame({"tokens": [[1, 2, 3]]})) is None
