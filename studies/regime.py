"""The regime map: every decoder's step compression across models of different entropy, from runs.

Input: the latest run of each regime-map command (`conf/experiment/regime_map.yaml`), one model and
one window per run, with AR as the baseline and SJD under both schedules named `sjd_official` and
`sjd_harness`. Output, one row per (model, decoder, window):

    model, entropy_nats, decoder, schedule, window, step_compression, vs_official_sjd, vs_harness_sjd,
    latency_speedup, efficiency, lossless, audit_p, audit_tv, audit_noise_tv, audited_lossless,
    then the 95% interval of each ratio (`<ratio>_lo`, `<ratio>_hi`, INTERVAL_SOURCES) and step_compression_se

`window` is the run's (SJD's window; PJD and ZipAR keep their own row-wise settings in every run),
`entropy_nats` is AR's mean per-token entropy of the sampling distribution on the run's prompts (the
regime), `vs_*_sjd` are step compression over that SJD's in the same run, `lossless` is what the
decoder claims, and `audited_lossless` (`audited_lossless_flag`) is True only for a lossless claim the
one-sample teacher-forced audit backs with power: AR's control passes, the decoder passes at p > 1e-3,
and it tested at least the tokens that detect a 0.01 nats/token excess (tf_tokens_needed). It is False
for a claim that audit rejects (or no claim), and unknown (empty) without a test that has power: the
two-sample audit's p = 1 at a few samples per caption is no evidence.

The anchors compare each model with what the papers report on Lumina-mGPT 7B (768 px, COCO): SJD's
step compression over AR, and SCD's and SJD-PAC's (both at window 64, their papers' setting) over
SJD paper's at window 16, the comparison SJD-PAC's table makes (results/paper/published.csv holds
the rows; SCD's own table puts SJD at window 64, 2.31x, beside it). An anchor over AR takes its run's
bootstrap interval; one between two runs, the delta method on both runs' step_compression_se.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import pandas as pd

from sjd.audit.teacher_forced import ALPHA as TF_ALPHA
from studies.tables import NO_HASH

REGIME_COLUMNS = [
    "model", "entropy_nats", "decoder", "schedule", "window",
    "images", "step_compression", "inputs_per_token", "vs_official_sjd",
    "vs_harness_sjd", "latency_speedup", "efficiency", "lossless", "audit_p", "audit_tv", "audit_noise_tv",
    "audited_lossless",
]  # fmt: skip
# Each ratio's 95% interval (sjd.harness.intervals), NaN for rows written before runs recorded them:
# regime column -> the summary row's column holding its interval (`<that>_lo`, `<that>_hi`).
INTERVAL_SOURCES = {
    "step_compression": "step_compression",
    "vs_official_sjd": "vs_sjd_official",
    "vs_harness_sjd": "vs_sjd_harness",
    "latency_speedup": "latency_speedup",
    "efficiency": "efficiency",
}
INTERVAL_COLUMNS = [f"{c}_{end}" for c in INTERVAL_SOURCES for end in ("lo", "hi")]
TF_SHOWN = ["tf_p", "tf_excess_nats", "tf_n_tokens", "tf_tokens_needed", "tf_control_p"]  # one-sample audit
OFFICIAL_SJD, HARNESS_SJD = "sjd_official", "sjd_harness"
# The official schedule with the harness's forced drafts (the regime-map runs' reference, a config of its own):
FORCED = "_forced"
OFFICIAL_REFERENCES = (OFFICIAL_SJD, OFFICIAL_SJD + FORCED)
AUDIT_ALPHA = 0.01

# (anchor, our decoder, its window, our reference decoder, its window, published (table, method) of each)
SJD_ROW = ("sjd_lumina_coco5k", "sjd")  # SJD's step compression on Lumina-mGPT 7B: the goal's model is nearest it
ANCHORS = [
    ("SJD over AR", OFFICIAL_SJD, 16, "ar", None, SJD_ROW, ("sjd_lumina_coco5k", "ar")),
    ("SCD over SJD", "scd_official", 64, OFFICIAL_SJD, 16, ("scd_lumina_coco5k", "scd_gumbel"), SJD_ROW),
    ("SJD-PAC over SJD", "sjd_pac_official", 64, OFFICIAL_SJD, 16, ("sjd_pac_lumina_coco5k", "sjd_pac"), SJD_ROW),
]


def _record(value) -> dict:
    """A JSON column's dict (a CSV cell or a dict); {} when empty."""
    if isinstance(value, dict):
        return value
    return json.loads(value) if isinstance(value, str) and value.startswith("{") else {}


def weights_hashed(a: Mapping, b: Mapping) -> bool:
    """Whether both results rows carry the hash of the networks their runs loaded (`weights_sha`); where one does
    not, same_weights falls back to weaker identities, and a page citing the match shows tables.NO_HASH."""
    return bool(_record(a.get("weights_sha")) and _record(b.get("weights_sha")))


def same_weights(a: Mapping, b: Mapping, decoder_a: str, decoder_b: str | None = None) -> bool:
    """Whether two results rows decoded with the same weights (`decoder_a` in row a, `decoder_b` in row b, the
    same name by default), by the strongest identity both carry: the hash of the networks each run loaded
    (`weights_sha`: the model's, and the decoder's drafter's); for rows from before runs hashed them, a
    stand-in's recorded weights hash (`model_training`); else the model's name."""
    decoder_b = decoder_b or decoder_a
    loaded_a, loaded_b = _record(a.get("weights_sha")), _record(b.get("weights_sha"))
    if weights_hashed(a, b):
        return (loaded_a.get("model"), loaded_a.get(decoder_a)) == (loaded_b.get("model"), loaded_b.get(decoder_b))
    if a.get("model") != b.get("model"):
        return False
    recorded_a = _record(a.get("model_training")).get("weights_sha")
    recorded_b = _record(b.get("model_training")).get("weights_sha")
    return recorded_a == recorded_b


# Config keys that name a decoder without changing what it samples.
NAMING_KEYS = ("name",)


def sample_settings(config: Mapping) -> dict:
    """What decides a decoder's samples, as its config records it: every setting but its name, and a drafter by
    its weights' hash (its record also holds a re-measurable acceptance and notes that change no sample)."""
    settings = {k: v for k, v in config.items() if k not in NAMING_KEYS}
    drafter = settings.get("drafter")
    if isinstance(drafter, Mapping):
        weights_sha = (drafter.get("record") or {}).get("weights_sha")
        settings["drafter"] = {"weights_sha": weights_sha} if weights_sha else {
            k: v for k, v in drafter.items() if k != "record"}  # fmt: skip
    return settings


def powered_audit(powered: pd.DataFrame | None, run: Mapping, decoder: str, config: Mapping) -> dict | None:
    """The latest audit with power (results/studies/audit_powered.csv) of a decoder with the settings of
    `config` (sample_settings: whatever name either run gave it), the same weights (same_weights) and the same
    sampling as `decoder` in the run row `run`, or None. Its `weights_hashed` says whether the weights matched by
    both runs' hashes (weights_hashed) or, without one, by a weaker identity."""
    if powered is None or powered.empty:
        return None
    wanted, sampling = sample_settings(config), run.get("sampling")
    matches = []
    for row in powered.to_dict("records"):
        if isinstance(sampling, str) and isinstance(row.get("sampling"), str) and row["sampling"] != sampling:
            continue
        theirs = json.loads(row["decoder_configs"]).get(row["decoder"])
        if theirs is not None and sample_settings(theirs) == wanted and same_weights(row, run, row["decoder"], decoder):
            matches.append(row | {"weights_hashed": weights_hashed(row, run)})
    return matches[-1] if matches else None


def weights_match_text(audit: Mapping) -> str:
    """How a powered audit's weights were matched to the run's, as a page cites it: `hashed`, or tables.NO_HASH
    where a row predates the hashes (the match then rests on a stand-in's recorded training hash or the name)."""
    return "hashed" if audit.get("weights_hashed") else NO_HASH


def audit_verdict(own: Mapping, config: Mapping, powered: pd.DataFrame | None, run: Mapping) -> tuple:
    """A decoder's `audited_lossless` and the powered audit behind it: its own run's one-sample audit
    (audited_lossless_flag of `own`, its results row), unless a lossless decoder has a matching audit with
    power (powered_audit) whose flag is not unknown, which then decides. The regime, goal and drafters pages all
    decide through it."""
    flag = audited_lossless_flag(own)
    if not own["lossless"]:
        return flag, None
    audit = powered_audit(powered, run, own["decoder"], config)
    powered_flag = audited_lossless_flag(audit | {"lossless": True}) if audit else None
    return (flag if powered_flag is None else powered_flag), audit


def run_official_sjd(rows: pd.DataFrame) -> str:
    """The run's official-schedule SJD: the official sampler's drafts, or the harness's forced ones."""
    return next((d for d in OFFICIAL_REFERENCES if d in set(rows["decoder"])), OFFICIAL_SJD)


def run_table(rows: pd.DataFrame, powered: pd.DataFrame | None = None) -> pd.DataFrame:
    """The regime rows of one run (one model, one window), each decoder's `audited_lossless` by audit_verdict."""
    configs = json.loads(rows["decoder_configs"].iloc[0])
    baseline = rows["baseline"].iloc[0]
    by_name = rows.set_index("decoder")
    official = run_official_sjd(rows)
    missing = [d for d in (baseline, official, HARNESS_SJD) if d not in by_name.index]
    if missing:
        raise ValueError(f"regime map run {rows['run_dir'].iloc[0]} lacks the decoder(s) {missing}")
    window = int(configs[official]["window"])  # the run's window; PJD and ZipAR keep their own settings
    entropy = float(by_name.loc[baseline, "entropy_nats"])
    lossless = json.loads(rows["decoder_lossless"].iloc[0])
    table = pd.DataFrame(
        {
            "model": rows["model"].values,
            "entropy_nats": entropy,
            "decoder": rows["decoder"].values,
            "schedule": rows["schedule"].fillna("").values,
            "window": window,
            "images": rows["n_prompts"].values,  # samples: prompts times seeds per prompt
            "step_compression": rows["step_compression"].values,
            "inputs_per_token": rows["inputs_per_token"].values if "inputs_per_token" in rows else np.nan,
            "vs_official_sjd": rows["step_compression"].values / by_name.loc[official, "step_compression"],
            "vs_harness_sjd": rows["step_compression"].values / by_name.loc[HARNESS_SJD, "step_compression"],
            "latency_speedup": rows["latency_speedup"].values,
            "efficiency": rows["efficiency"].values,
            "lossless": [bool(lossless[d]) for d in rows["decoder"]],
        }
    )
    for column in ("audit_p", "audit_tv", "audit_noise_tv"):
        table[column] = rows[column].values if column in rows else np.nan
    for column in TF_SHOWN:
        table[column] = rows[column].values if column in rows else np.nan
    run = rows.iloc[0].to_dict()  # one model, one set of weights and one sampling a run
    table["audited_lossless"] = [audit_verdict(r, configs.get(r["decoder"], {}), powered, run)[0]
                                 for r in table.to_dict("records")]  # fmt: skip
    return table[REGIME_COLUMNS + TF_SHOWN]


def audited_lossless_flag(row: dict) -> bool | None:
    """True: a lossless claim the one-sample audit backs with power (AR's control passes, the decoder passes
    at p > TF_ALPHA on at least tf_tokens_needed tokens). False: no claim, or the audit rejects it while
    AR's control passes. None (unknown): no test with power, or AR's control fails (the paths disagree)."""
    if not row["lossless"]:
        return False
    p, control, n, needed = (row.get(k, np.nan) for k in ("tf_p", "tf_control_p", "tf_n_tokens", "tf_tokens_needed"))
    if not (np.isfinite(p) and np.isfinite(control) and control > TF_ALPHA):
        return None
    if p <= TF_ALPHA:
        return False
    return True if np.isfinite(needed) and n >= needed else None


def counts_for_goal(row) -> bool:
    """A lossless decoder the goal may name: audited lossless, or, without a test with power, passing the
    one-sample audit at p > TF_ALPHA with AR's control passing too (named as not audited)."""
    flag = row["audited_lossless"]
    if flag is True:
        return True
    unknown = flag is None or (isinstance(flag, float) and np.isnan(flag))
    return bool(row["lossless"]) and unknown and row["tf_p"] > TF_ALPHA and row["tf_control_p"] > TF_ALPHA


def with_intervals(table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """A run's regime rows (run_table) with each ratio's interval and step_compression_se from its
    summary rows; NaN where the rows were written before runs recorded them."""
    out = table.copy()
    official = run_official_sjd(rows)
    for column, source in INTERVAL_SOURCES.items():
        source = f"vs_{official}" if column == "vs_official_sjd" else source
        for end in ("lo", "hi"):
            out[f"{column}_{end}"] = rows[f"{source}_{end}"].values if f"{source}_{end}" in rows else np.nan
    out["step_compression_se"] = rows["step_compression_se"].values if "step_compression_se" in rows else np.nan
    out["latency_units"] = rows["latency_units"].values if "latency_units" in rows else np.nan  # timed batches
    return out


def regime_table(runs: list[pd.DataFrame], powered: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every run's rows, ordered by entropy, model, window, decoder. Where two runs measure one cell
    (model, window, decoder), the one with more images stays (the earlier listed one on a tie); each
    row's ratios are to the SJD rows of its own run."""
    table = pd.concat([with_intervals(run_table(r, powered), r) for r in runs], ignore_index=True)
    table = table.sort_values("images", ascending=False, kind="stable")
    table = table.drop_duplicates(["model", "window", "decoder"]).sort_index()
    # a model's runs measure its entropy apart; order its rows together, by the largest run's
    order = table.groupby("model", sort=False)["entropy_nats"].transform("first")
    table = table.assign(_order=order).sort_values(["_order", "model", "window"], kind="stable")
    return table.drop(columns="_order").reset_index(drop=True)


def official_sjd_rows(table: pd.DataFrame, window: int) -> pd.DataFrame:
    """Per model, its official-schedule SJD at `window`: the official sampler's drafts where a run has it, else
    the harness's forced drafts."""
    rows = table[table["decoder"].isin(OFFICIAL_REFERENCES) & (table["window"] == window)]
    rows = rows.assign(_rank=rows["decoder"].map(OFFICIAL_REFERENCES.index)).sort_values("_rank", kind="stable")
    return rows.drop_duplicates("model").drop(columns="_rank").sort_index()


def anchors(table: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Per model: each anchor ratio, ours and published, and ours over published (1 = reproduced). Each official
    decoder is the official sampler's where a run has it, else the same config with the harness's forced drafts
    (`drafts` says which the ratio used)."""

    def pick(model: str, decoder: str, window: int | None) -> pd.DataFrame:
        for name in (decoder, decoder + FORCED):
            rows = table[(table["model"] == model) & (table["decoder"] == name)]
            if window is not None:
                rows = rows[rows["window"] == window]
            if len(rows):
                return rows
        return rows

    def compression(model: str, decoder: str, window: int | None, column: str = "step_compression") -> float:
        rows = pick(model, decoder, window)
        return float(rows[column].iloc[0]) if len(rows) and column in rows else float("nan")

    def drafts(model: str, *decoders: tuple[str, int | None]) -> str:
        used = [pick(model, d, w)["decoder"] for d, w in decoders if d != "ar"]
        return "forced" if any(len(u) and u.iloc[0].endswith(FORCED) for u in used) else "official"

    out = []
    for model in dict.fromkeys(table["model"]):
        entropy = float(table.loc[table["model"] == model, "entropy_nats"].iloc[0])
        for name, decoder, window, ref, ref_window, pub, pub_ref in ANCHORS:
            if ref == "ar":  # step compression over AR: its own bootstrap interval
                ours = compression(model, decoder, window)
                lo, hi = (compression(model, decoder, window, f"step_compression_{end}") for end in ("lo", "hi"))
            else:  # two runs (windows): the delta method, the runs' estimates taken as independent
                top, bottom = (compression(model, decoder, window), compression(model, ref, ref_window))
                top_se, bottom_se = (compression(model, d, w, "step_compression_se") for d, w in
                                     ((decoder, window), (ref, ref_window)))  # fmt: skip
                ours = top / bottom
                lo, hi = ratio_interval(ours, [top_se / top, bottom_se / bottom])
            theirs = published_ratio(published, pub, pub_ref)
            out.append({"model": model, "entropy_nats": entropy, "anchor": name,
                        "drafts": drafts(model, (decoder, window), (ref, ref_window)), "ours": ours, "ours_lo": lo,
                        "ours_hi": hi, "published": theirs, "ours_over_published": ours / theirs,
                        "ours_over_published_lo": lo / theirs, "ours_over_published_hi": hi / theirs})  # fmt: skip
    return pd.DataFrame(out)


def published_compression(published: pd.DataFrame, row: tuple[str, str]) -> float:
    """A (table, method) row's step compression in results/paper/published.csv; NaN when absent."""
    rows = published[(published["table"] == row[0]) & (published["method"] == row[1])]
    return float(rows["step_compression"].iloc[0]) if len(rows) else float("nan")


def published_ratio(published: pd.DataFrame, row: tuple[str, str], reference: tuple[str, str]) -> float:
    """An anchor's published value: one published row's step compression over another's."""
    return published_compression(published, row) / published_compression(published, reference)


def ratio_interval(ratio: float, relative_ses: list[float], z: float = 1.959964) -> tuple[float, float]:
    """95% normal interval of a product or quotient of independent estimates from their relative
    standard errors (delta method: relative variances add); NaN where one is unknown."""
    spread = z * ratio * float(np.sqrt(np.sum(np.square(relative_ses))))
    return ratio - spread, ratio + spread


def goal(table: pd.DataFrame, target: float, window: int = 16, schedule: str | None = None) -> dict | None:
    """On the model whose official SJD at `window` compresses closest to `target` (SJD's published
    step compression, published_compression(published, SJD_ROW)), the audited lossless decoder with the highest
    step compression at that window
    (on `schedule` only, if given). Where none is audited with power, the one among the lossless
    decoders whose one-sample audit passes without power, marked `audited: False`."""
    sjd = official_sjd_rows(table, window)
    if sjd.empty:
        return None
    model = sjd.loc[(sjd["step_compression"] - target).abs().idxmin(), "model"]
    rows = table[(table["model"] == model) & (table["window"] == window)]
    rows = rows[~rows["decoder"].isin(["ar", *OFFICIAL_REFERENCES, HARNESS_SJD])]
    if schedule is not None:
        rows = rows[rows["schedule"] == schedule]
    audited = rows[rows["audited_lossless"].eq(True)]
    candidates = audited if not audited.empty else rows[rows.apply(counts_for_goal, axis=1).astype(bool)]
    if candidates.empty:
        return {"model": model, "decoder": None}
    best = candidates.loc[candidates["step_compression"].idxmax()]
    # latency_units: the timed batches behind a latency interval (without it the sentence cannot show one)
    keys = ("model", "entropy_nats", "decoder", "schedule", "window", "step_compression", "vs_official_sjd",
            "vs_harness_sjd", "latency_speedup", "efficiency", "audit_p", "tf_p", "tf_n_tokens",
            "tf_tokens_needed", "latency_units")  # fmt: skip
    return {k: best[k] for k in (*keys, *INTERVAL_COLUMNS)} | {"audited": not audited.empty}


# -- the page's words on the audit (studies/regime_page.py) ---------------------------
AUDITED_TEXT = (
    "`audited_lossless` is true only where the one-sample teacher-forced audit (`audit.teacher_forced`, "
    f"docs/algorithms.md) backs the claim with power: AR's control passes, the decoder passes at p > {TF_ALPHA:g}, "
    "and it tested at least the tokens that detect a 0.01 nats/token excess; `unknown` where no such test ran. "
    "The power is against a systematic surprisal excess (and, on rows with `tokens needed (split)`, one whose "
    "sign the entropy or the image band sets), not every departure: a fault of no predictable sign can pass "
    "(docs/algorithms.md, the one-sample audit)."
)


def where_audited(audit: pd.Series) -> str:
    """`decoder, window W, study S, seed K` of one audit (the parts it records)."""
    parts = [str(audit["decoder"])]
    if pd.notna(audit.get("window")):
        parts.append(f"window {int(audit['window'])}")
    if isinstance(audit.get("study"), str):
        parts.append(f"study {audit['study']}")
    return ", ".join([*parts, f"seed {audit['seed']}"])


def seed_calibration(runs: list[pd.DataFrame]) -> pd.DataFrame:
    """The one-sample audit across seeds, per model: over every listed run's AR and lossless-claiming rows
    with a one-sample p, how many audits there were (one per run and decoder: each run decoded its own samples,
    so runs at other windows, in other studies or at other seeds are separate audits), how many passed at
    p > TF_ALPHA, and the smallest p with its decoder, window, study and seed. Exact samplers give uniform p's,
    so about TF_ALPHA of the audits fail by chance; many more failures mean the audit (or a decoder) is
    miscalibrated."""
    rows = []
    for run in runs:
        if "tf_p" not in run:
            continue
        lossless = json.loads(run["decoder_lossless"].iloc[0])
        configs = json.loads(run["decoder_configs"].iloc[0]) if "decoder_configs" in run else {}
        claims = run["decoder"].isin([d for d, exact in lossless.items() if exact])
        audited = run[claims & run["tf_p"].notna()]
        rows += [{"model": r["model"], "seed": int(r.get("seed", 0)), "decoder": r["decoder"],
                  "window": configs.get(r["decoder"], {}).get("window"), "study": r.get("experiment"),
                  "run": r.get("run_dir", id(run)), "tf_p": float(r["tf_p"])}
                 for _, r in audited.iterrows()]  # fmt: skip
    if not rows:
        return pd.DataFrame(columns=["model", "seeds", "audits", "passing", "smallest_p", "smallest_at"])
    audits = pd.DataFrame(rows).drop_duplicates(["run", "decoder"], keep="last")
    out = []
    for model, group in audits.groupby("model", sort=False):
        worst = group.loc[group["tf_p"].idxmin()]
        seeds = ", ".join(str(s) for s in sorted(group["seed"].unique()))
        out.append({"model": model, "seeds": seeds, "audits": len(group),
                    "passing": int((group["tf_p"] > TF_ALPHA).sum()), "smallest_p": float(worst["tf_p"]),
                    "smallest_at": where_audited(worst)})  # fmt: skip
    return pd.DataFrame(out)


def power_text(table: pd.DataFrame) -> str:
    """What the page's audits can and cannot say, from which audits its rows carry."""
    tf = table["tf_p"].notna().any() if "tf_p" in table else False
    carried = ("some rows carry the one-sample teacher-forced audit (`tf_p`), and only they can be audited lossless"
               if tf else "no row carries the one-sample teacher-forced audit, so no lossless claim on this page "
               "is audited here")  # fmt: skip
    return (
        "On the audits: the two-sample per-position test (`audit_p`) at the few samples per caption these runs "
        "afford has almost no power on a high-entropy model (compare `audit_tv` with AR's own `audit_noise_tv`); "
        f"{carried}. The lossless decoders' exactness is tested by `tests/audit/test_audit.py` (the micro model's "
        "enumerated output space) and `tests/audit/test_teacher_forced.py` (the one-sample audit's calibration and "
        "negative controls)."
    )


def flag_text(value) -> str:
    """audited_lossless as the page shows it: True, False or unknown."""
    return "unknown" if value is None or (isinstance(value, float) and np.isnan(value)) else str(bool(value))


def not_audited_text(model: str, among: str, table: pd.DataFrame) -> str:
    """The goal's sentence when no decoder on `model` is audited lossless at window 16."""
    rows = table[table["model"] == model]
    untested = "tf_p" not in rows or rows["tf_p"].isna().all()
    why = "no row of it has the one-sample teacher-forced audit" if untested else "none passes it with power"
    return (
        f"On `{model}` no decoder{among} is audited lossless at window 16 ({why}): twice official SJD, losslessly, "
        "is not audited."
    )
