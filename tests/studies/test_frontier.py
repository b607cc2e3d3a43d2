"""The frontier figure and the published-speedup lines of a frontier study's page (studies.frontier)."""

import json

import pandas as pd

from studies.frontier import frontier, published_lines


def run_rows(lo: float, hi: float) -> pd.DataFrame:
    lossless = json.dumps({"ar": True, "sjd": True, "ssd": False})
    return pd.DataFrame(
        {
            "decoder": ["ar", "sjd", "ssd"],
            "model": "standin_lumina_512_cal",
            "baseline": "ar",
            "decoder_lossless": lossless,
            "modelled_speedup": [1.0, 1.9, (lo + hi) / 2],
            "modelled_speedup_lo": [1.0, 1.8, lo],
            "modelled_speedup_hi": [1.0, 2.0, hi],
            "tf_excess_nats": [0.0, 0.001, 0.05],
            "tf_var_nats2": [2.0, 2.0, 2.0],
            "tf_n_tokens": [16384, 16384, 16384],
        }
    )


PUBLISHED = pd.DataFrame(
    {
        "table": ["ssd_lumina"] * 2,
        "model": "lumina",
        "method": ["ar", "ssd"],
        "latency_speedup": [1.0, 10.0],
        "source": "a paper",
    }
)


def test_a_published_speedup_is_judged_by_the_interval():
    inside = published_lines(run_rows(9.0, 11.0), PUBLISHED)
    assert any("`ssd`: modelled 10.00x AR (9.00-11.00) against the published 10.00x" in line for line in inside)
    assert any("agrees within 15%" in line for line in inside)
    assert any("does not agree" in line for line in published_lines(run_rows(3.0, 4.0), PUBLISHED))
    assert any("not distinguishable" in line for line in published_lines(run_rows(8.0, 10.0), PUBLISHED))
    assert published_lines(run_rows(3.0, 4.0), PUBLISHED[PUBLISHED["method"] == "ar"]) == []
    assert published_lines(run_rows(9.0, 11.0), PUBLISHED.assign(model="llamagen")) == []  # another model's


def test_the_frontier_figure_is_drawn(tmp_path):
    out = frontier(run_rows(9.0, 11.0), tmp_path / "f.png")
    assert out.stat().st_size > 1000


def test_a_model_priced_as_no_gpu_plots_step_compression(tmp_path):
    rows = run_rows(9.0, 11.0).assign(modelled_speedup=float("nan"), step_compression=[1.0, 4.0, 6.0])
    assert frontier(rows, tmp_path / "f.png").stat().st_size > 1000
    assert published_lines(rows, PUBLISHED) == []


def test_a_frontier_names_the_audit_with_power_of_each_lossless_decoder_with_its_settings():
    """The spatial heads run audits 16 images, too few for power (`no power`); Hawk's audit with power
    (experiment=audit_powered_hawk) has its settings and weights, so the page names it. The same run with Hawk's
    settings changed matches no audit, and a lossy decoder is never named."""
    from pathlib import Path

    from studies.frontier import powered_lines
    from studies.tables import latest_run

    root = Path(__file__).resolve().parents[2]
    results = pd.read_csv(root / "results" / "studies" / "spatial_heads.csv")
    rows = latest_run(results[results["command"] == "python run.py experiment=spatial_heads"])
    powered = pd.read_csv(root / "results" / "studies" / "audit_powered.csv")
    text = "\n".join(powered_lines(rows, powered))
    assert (
        "- `hawk`: `audited_lossless` True by the audit with power of `python run.py experiment=audit_powered_hawk`"
        in text
    )
    assert "`ssd`" not in text  # lossy: no claim to audit
    # Hawk's audit and this run both hashed the weights they loaded; the older audits of official SJD did not
    assert "(as `hawk`; same weights: hashed)" in text
    assert "(as `sjd_official`; same weights: n/a: no hash)" in text
    configs = json.loads(rows["decoder_configs"].iloc[0])
    configs["hawk"]["vertical"] = 0
    changed = rows.assign(decoder_configs=json.dumps(configs))
    assert "`hawk`" not in "\n".join(powered_lines(changed, powered))


def test_a_figure_published_at_another_layout_is_named_not_compared():
    """Hawk's 1.71x is at 48 x 48 codes (published.csv's image_codes): a 32 x 32 run (1024 codes an AR image) is
    not read against it, a 48 x 48 one is; AR's row sets the layout, since a decoder may audit fewer codes."""
    at_48 = PUBLISHED.assign(image_codes="48x48")
    small = run_rows(9.0, 11.0).assign(tf_n_images=16, tf_n_tokens=[16384, 16384, 14695])
    lines = published_lines(small, at_48)
    assert any("is at 48x48 codes and this run at 32x32: another layout, not compared" in line for line in lines)
    assert not any("agree" in line for line in lines)
    large = run_rows(9.0, 11.0).assign(tf_n_images=8, tf_n_tokens=[18432, 18432, 18083])
    assert any("agrees within 15%" in line for line in published_lines(large, at_48))


def test_the_spatial_heads_page_reads_hawk_only_at_its_published_layout():
    """The spatial heads page's 512 px run names Hawk's 768 px figure without a verdict; its 768 px run judges it."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "results" / "spatial_heads.md").read_text()
    hawk = [line for line in text.splitlines() if line.startswith("- `hawk`: modelled")]
    assert len(hawk) == 2
    assert "another layout, not compared" in hawk[0] and "agree" not in hawk[0]
    assert "agree" in hawk[1]
