"""The quality-against-speed frontier of one run: how far each decoder's samples are from the target's (the
one-sample audit's excess nats a token) against its modelled speedup over AR on a GPU (sjd.harness.pricing), or its
step compression on a model that stands for no priced architecture."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures go straight to files
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from studies.goal_page import POWERED_PAGE  # noqa: E402
from studies.regime import audit_verdict, flag_text, weights_match_text  # noqa: E402
from studies.tables import NO_HASH  # noqa: E402

Z95 = 1.96


def excess_interval(rows: pd.DataFrame) -> np.ndarray:
    """Half-width of the excess nats' 95% interval over the audited tokens (their variance / their count). Tokens
    of one image are not independent, so it is narrower than an interval over images: drawn, never a verdict."""
    return Z95 * np.sqrt(rows["tf_var_nats2"].astype(float) / rows["tf_n_tokens"].astype(float))


def speed_column(rows: pd.DataFrame) -> tuple[str, str]:
    """The speed a frontier plots: the modelled speedup where the run prices its model as a GPU would (a stand-in
    for a real architecture, or a real model), else step compression (the toy model stands for none)."""
    if "modelled_speedup" in rows and rows["modelled_speedup"].notna().any():
        return "modelled_speedup", "modelled speedup over AR (H100)"
    return "step_compression", "step compression over AR (no GPU price)"


def frontier(rows: pd.DataFrame, out: Path) -> Path:
    """Speed (speed_column) against excess nats a token, one point per decoder with both intervals; o a decoder that
    claims to be lossless, x one that does not; the dashed line joins the decoders no other beats on both."""
    lossless = json.loads(rows["decoder_lossless"].iloc[0])
    speed, label = speed_column(rows)
    table = rows[rows["decoder"] != rows["baseline"].iloc[0]].dropna(subset=["tf_excess_nats", speed])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    half = excess_interval(table)
    for (_, row), err in zip(table.iterrows(), half):
        y, lo, hi = (float(row.get(c, np.nan)) for c in (speed, f"{speed}_lo", f"{speed}_hi"))
        yerr = [[max(y - lo, 0.0)], [max(hi - y, 0.0)]] if np.isfinite(lo) and np.isfinite(hi) else None
        marker = "o" if lossless.get(row["decoder"], True) else "x"
        ax.errorbar(float(row["tf_excess_nats"]), y, xerr=err, yerr=yerr, fmt=marker, capsize=2, ms=6)
        ax.annotate(row["decoder"], (float(row["tf_excess_nats"]), y), fontsize=7, xytext=(4, 3),
                    textcoords="offset points")  # fmt: skip
    front, best = [], -np.inf
    for _, row in table.sort_values(["tf_excess_nats", speed], ascending=[True, False]).iterrows():
        if row[speed] > best:
            front.append((row["tf_excess_nats"], row[speed]))
            best = row[speed]
    ax.plot(*zip(*front), color="grey", lw=0.8, ls="--")
    ax.axvline(0.0, color="grey", lw=0.5)
    ax.set_xlabel("excess nats a token over the target's own (one-sample audit; 0 = the target's distribution)")
    ax.set_ylabel(label)
    ax.set_title(
        "o claims lossless, x lossy; 95% bars (excess nats: over tokens, so too narrow)",
        fontsize=8,
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def run_codes(row: pd.Series) -> str:
    """A run's image layout as published.csv's `image_codes` writes it (48x48), from the codes its baseline's row
    audited an image (tf_n_tokens over tf_n_images, a square grid: AR audits every code, where a decoder may leave
    out impossible tokens); empty where the row audited none."""
    images, tokens = float(row.get("tf_n_images", np.nan)), float(row.get("tf_n_tokens", np.nan))
    if not (np.isfinite(images) and np.isfinite(tokens)) or images <= 0:
        return ""
    side = round((tokens / images) ** 0.5)
    return f"{side}x{side}"


def other_layout(baseline: pd.Series, pub: pd.Series) -> bool:
    """Whether a published figure states a layout (`image_codes`) that the run's differs from: a decoder that works
    rows at once gains more on more rows, so a figure is read only against a run at its own layout."""
    theirs = pub.get("image_codes")
    return isinstance(theirs, str) and bool(theirs) and run_codes(baseline) != theirs


BAND = 0.15  # a modelled speedup agrees with a published one when its interval lies within 15% of it


def published_lines(rows: pd.DataFrame, published: pd.DataFrame) -> list[str]:
    """Each decoder of the run that a published row on its model names (results/paper/published.csv, `method`; the
    published `model` is part of the run's, as lumina of standin_lumina_512_cal): its modelled speedup over AR
    beside the published latency speedup, with a verdict decided by the interval; a figure published at another
    layout than the run's (other_layout) is named, not compared."""
    lines = []
    baseline = rows[rows["decoder"] == rows["baseline"].iloc[0]].iloc[-1]
    for _, row in rows[rows["decoder"] != rows["baseline"].iloc[0]].iterrows():
        model = str(row.get("model", ""))
        same_model = published["model"].astype(str).map(model.__contains__)  # lumina: standin_lumina_*
        theirs = published[(published["method"] == row["decoder"]) & published["latency_speedup"].notna() & same_model]
        if theirs.empty or pd.isna(row.get("modelled_speedup")):
            continue
        for _, pub in theirs.iterrows():
            target = float(pub["latency_speedup"])
            if other_layout(baseline, pub):
                lines.append(
                    f"- `{row['decoder']}`: modelled {row['modelled_speedup']:.2f}x AR; the published {target:.2f}x "
                    f"({pub['source']}; table `{pub['table']}`) is at {pub['image_codes']} codes and this run at "
                    f"{run_codes(baseline)}: another layout, not compared."
                )
                continue
            ours = [float(row.get(c, np.nan)) / target for c in ("modelled_speedup", "modelled_speedup_lo",
                                                                 "modelled_speedup_hi")]  # fmt: skip
            if not all(np.isfinite(ours)):
                verdict = "no interval to decide on"
            elif 1 - BAND <= ours[1] and ours[2] <= 1 + BAND:
                verdict = f"agrees within {BAND:.0%} (the interval lies inside the band)"
            elif ours[2] < 1 - BAND or ours[1] > 1 + BAND:
                verdict = f"does not agree within {BAND:.0%} (the interval lies outside the band)"
            else:
                verdict = f"is not distinguishable from the {BAND:.0%} band's edge at this size"
            lines.append(
                f"- `{row['decoder']}`: modelled {row['modelled_speedup']:.2f}x AR ({row['modelled_speedup_lo']:.2f}-"
                f"{row['modelled_speedup_hi']:.2f}) against the published {target:.2f}x ({pub['source']}; table "
                f"`{pub['table']}`): {ours[0]:.2f} ({ours[1]:.2f}-{ours[2]:.2f}) of it, which {verdict}."
            )
    if not lines:
        return []
    return ["Against the published speedups (out of sample: nothing here was fitted to them). The stand-in is a "
            "tiny network calibrated on self-drafting ratios, with heads of our recipe and our reading of the "
            "published settings; its image may be smaller than the published run's (the 512 px stand-in has 32 x 32 "
            "codes, Lumina-mGPT at 768 px 48 x 48), and a decoder that works rows at once gains more on more rows. "
            "A real model's run decides.", "", *lines, ""]  # fmt: skip


def powered_lines(rows: pd.DataFrame, powered: pd.DataFrame | None) -> list[str]:
    """Each decoder of the run that claims to be lossless and has an audit with power of its settings and weights
    (page audit_powered, studies.regime.powered_audit): that audit's verdict, which a one-sample audit of this
    run's few images cannot give (its `no power`)."""
    configs, claims = (json.loads(rows[c].iloc[0]) for c in ("decoder_configs", "decoder_lossless"))
    run = rows.iloc[0].to_dict()
    lines = []
    for own in rows.to_dict("records"):
        own["lossless"] = bool(claims.get(own["decoder"], False))
        if own["decoder"] == own["baseline"] or not own["lossless"]:
            continue
        flag, audit = audit_verdict(own, configs.get(own["decoder"], {}), powered, run)
        if audit is None:
            continue
        lines.append(
            f"- `{own['decoder']}`: `audited_lossless` {flag_text(flag)} by the audit with power of "
            f"`{audit['command']}` (as `{audit['decoder']}`; same weights: {weights_match_text(audit)}): one-sample p "
            f"{audit['tf_p']:.3g} on "
            f"{int(audit['tf_n_tokens']):,} tokens ({int(audit['tf_tokens_needed']):,} needed), excess "
            f"{audit['tf_excess_nats']:+.4f} nats/token, AR's control p {audit['tf_control_p']:.3g}."
        )
    if not lines:
        return []
    return [f"Audits with power of this run's lossless decoders (same settings and weights; page "
            f"[{POWERED_PAGE}]({POWERED_PAGE}.md)). Same weights `hashed`: both runs' rows carry the hash of the "
            f"networks they loaded; `{NO_HASH}`: a row predates those hashes, and the weights were matched by the "
            "stand-in's recorded training hash, or else the model's name:", "", *lines, ""]  # fmt: skip
