"""SJD2 on the real adapters (Lumina-mGPT, Emu3) with tiny random models: a noise-aware checkpoint in
our format loads through the adapter, the `embeds` contract holds (level 0 is the plain forward, cached
windows equal fresh computations), SJD2 with one denoising step equals greedy AR, and missing or
mismatched files are named with the config key and the recipe."""

import warnings
from pathlib import Path

import pytest
import test_adapter_chameleon as cham
import test_adapter_emu3 as emu
import torch

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.sjd import SJDDecoder
from sjd.decoders.sjd2 import SJD2Decoder
from sjd.models.emu3 import Emu3Adapter
from sjd.models.lumina import LuminaAdapter
from sjd.sjd2.emu3 import Emu3SJD2Adapter
from sjd.sjd2.inputs import save_checkpoint
from sjd.sjd2.lumina import LuminaSJD2Adapter
from sjd.sjd2.noise_path import SIDECAR_META, SIDECAR_WEIGHTS, NoisePath
from sjd.types import CODE_EMBEDDINGS, EMBEDS, Prompt

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = [Prompt("p0", "a red fox in the snow"), Prompt("p1", "two cats")]
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SAMPLED = SamplingConfig(cfg_scale=3.0, temperature=1.0, top_k=20)

pytestmark = pytest.mark.usefixtures("one_thread")


def char_tokenizer(ids: dict[str, int], unk: int):
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({**ids, "[UNK]": unk}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def random_path(model, seed: int) -> NoisePath:
    """A noise path at the model's embedding scale with a random (not zero) timestep embedding, so
    that every test sees the timestep signal at work."""
    path = NoisePath.for_table(model.get_input_embeddings().weight)
    with torch.no_grad():
        path.time_embed.weight.normal_(0.0, path.scale, generator=torch.Generator().manual_seed(seed))
    return path


# family -> (base adapter from a tiny model, tokenizer, SJD2 class, loader kwargs)
def lumina_base():
    tokenizer = char_tokenizer({c: cham.TEXT0 + i for i, c in enumerate(cham.CHARS)}, 3)
    return LuminaAdapter.from_model(cham.tiny_chameleon(), tokenizer, 2, 2), tokenizer


def emu3_base():
    tokenizer = char_tokenizer({chr(32 + i): emu.TEXT0 + i for i in range(emu.N_TEXT)}, 1)
    return Emu3Adapter.from_model(emu.tiny_emu3(), tokenizer, 4, 4), tokenizer


FAMILIES = {
    "lumina": (lumina_base, LuminaSJD2Adapter, {"resolution": 64}),  # 2 x 2 grids = 4 x 4 codes
    "emu3": (emu3_base, Emu3SJD2Adapter, {"resolution": 8}),  # 8 px / the tiny VQ's factor 2 = 4 x 4 codes
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved(request, tmp_path_factory):
    """(family, checkpoint directory, the in-memory SJD2 adapter it was saved from, the loaded one)."""
    family = request.param
    make_base, cls, kwargs = FAMILIES[family]
    base, tokenizer = make_base()
    source = cls.wrap(base, random_path(base.model, seed=1))
    directory = tmp_path_factory.mktemp(f"{family}_sjd2")
    save_checkpoint(source, directory, tokenizer, family, {"base_model": f"tiny random {family}", "train": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lumina without a VQGAN warns that images cannot be decoded
        loaded = cls(weights=str(directory), dtype="float32", **kwargs)
    return family, directory, source, loaded


def gens(prompts, seed=0):
    return make_generators(seed, [p.prompt_id for p in prompts], torch.device("cpu"))


def prompt_rows(adapter) -> list[torch.Tensor]:
    """Each cache row's real prompt ids: conditional rows, then the unconditional ones."""
    ids, lengths = adapter.prompt_batch(PROMPTS, with_uncond=True)
    return [row[len(row) - n :] for row, n in zip(ids, lengths)]


def fresh(adapter, row: torch.Tensor, generated_inputs: torch.Tensor) -> torch.Tensor:
    """Uncached logits of one unpadded prompt row (clean, level 0) followed by the model inputs of
    the generated positions (embeddings + timestep embedding); output i predicts generated position i."""
    path = adapter.noise_path
    prompt = path.inputs(adapter._clean(row[None]), torch.zeros(1, len(row), dtype=torch.long))
    with torch.no_grad():
        logits = adapter._run_embeds(torch.cat([prompt, generated_inputs[None]], dim=1)).logits
    return logits[0, len(row) - 1 :].float()


# -- the checkpoint -------------------------------------------------------------------------------
def test_the_checkpoint_holds_the_base_format_and_the_sidecar(saved):
    family, directory, source, loaded = saved
    assert (directory / "config.json").is_file() and list(directory.glob("model*.safetensors"))
    assert (directory / SIDECAR_WEIGHTS).is_file() and (directory / SIDECAR_META).is_file()
    assert loaded.noise_meta["family"] == family and loaded.noise_meta["noise_levels"] == loaded.noise_levels == 32
    assert loaded.noise_path.scale == pytest.approx(source.noise_path.scale)
    assert torch.equal(loaded.noise_path.time_embed.weight, source.noise_path.time_embed.weight)
    for key, p in source.model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[key], p), key
    assert loaded.row_ids("a cat") == source.row_ids("a cat")  # the tokenizer travelled with the weights
    assert EMBEDS in loaded.capabilities and CODE_EMBEDDINGS in loaded.capabilities
    assert loaded.embed_dim == loaded.model.get_input_embeddings().weight.shape[1]


# -- the `embeds` contract ------------------------------------------------------------------------
def test_level_zero_embeddings_give_the_forward_logits(saved):
    """At level 0 the noise is ignored, and forward_embeds(embed(tokens)) is forward(tokens) exactly."""
    _, _, _, adapter = saved
    codes = adapter.layout.free_token_ids
    tokens = codes[torch.randint(len(codes), (2, 7), generator=torch.Generator().manual_seed(0))]
    zeros = torch.zeros_like(tokens)
    noise = torch.randn(2, 7, adapter.embed_dim, generator=torch.Generator().manual_seed(1))
    adapter.prefill(PROMPTS, with_uncond=True)
    plain = adapter.forward(tokens, [0, 0])
    adapter.prefill(PROMPTS, with_uncond=True)
    embedded = adapter.forward_embeds(adapter.embed(tokens, zeros, noise), zeros, [0, 0])
    assert torch.equal(plain.cond, embedded.cond) and torch.equal(plain.uncond, embedded.uncond)


def test_every_call_goes_through_the_noise_aware_path(saved):
    """The fine-tuned model is read through its input path: prefill equals a fresh call on normalised
    embeddings plus the level-0 timestep embedding, and differs from the plain model's logits."""
    _, _, source, adapter = saved
    rows = prompt_rows(adapter)
    first = adapter.prefill(PROMPTS, with_uncond=True)
    none = torch.empty(0, adapter.embed_dim)
    for b in range(2):
        torch.testing.assert_close(first.cond[b, 0], fresh(adapter, rows[b], none)[0], atol=2e-4, rtol=0)
        torch.testing.assert_close(first.uncond[b, 0], fresh(adapter, rows[2 + b], none)[0], atol=2e-4, rtol=0)
    plain = source.base_adapter.__new__(source.base_adapter)  # the same model through the plain adapter
    plain.__dict__.update(source.__dict__)
    assert (plain.prefill(PROMPTS, with_uncond=True).cond - first.cond).abs().max() > 1e-3


def test_cached_noisy_windows_match_fresh_computations_with_cfg_rows(saved):
    _, _, _, adapter = saved
    rows, path, L = prompt_rows(adapter), adapter.noise_path, adapter.noise_levels
    g = torch.Generator().manual_seed(2)
    codes = adapter.layout.free_token_ids
    seq = codes[torch.randint(len(codes), (2, 12), generator=g)]
    clean_inputs = path.inputs(adapter._clean(seq), torch.zeros_like(seq))
    adapter.prefill(PROMPTS, with_uncond=True)
    adapter.forward(seq[:, :8], [0, 0])
    adapter.truncate([3, 5])  # ragged rows: 3 and 5 generated positions kept
    window = torch.stack([seq[0, 3:9], seq[1, 5:11]])
    levels = torch.randint(0, L, window.shape, generator=g)
    noise = torch.randn(*window.shape, adapter.embed_dim, generator=g)
    embeds = adapter.embed(window, levels, noise)
    out = adapter.forward_embeds(embeds, levels, [3, 5])
    for b, n in enumerate([3, 5]):
        gen = torch.cat([clean_inputs[b, :n], path.inputs(embeds[b], levels[b])])
        torch.testing.assert_close(out.cond[b], fresh(adapter, rows[b], gen)[n + 1 :], atol=2e-4, rtol=0)
        torch.testing.assert_close(out.uncond[b], fresh(adapter, rows[2 + b], gen)[n + 1 :], atol=2e-4, rtol=0)
    # Noisy inputs change the logits after them: the window is not read as clean tokens.
    clean_out = adapter.forward_embeds(adapter.embed(window, 0 * levels, noise), 0 * levels, [3, 5])
    assert (clean_out.cond - out.cond).abs().max() > 1e-3


# -- decoding -------------------------------------------------------------------------------------
def test_sjd2_with_one_denoising_step_equals_greedy_ar(saved):
    """denoise_steps=1: every carried draft enters clean, so p only ever sees clean tokens."""
    _, _, _, adapter = saved
    n_tokens = adapter.layout.n_tokens
    ar = ARDecoder().generate(adapter, PROMPTS, GREEDY, gens(PROMPTS))
    res = SJD2Decoder(window=8, denoise_steps=1).generate(adapter, PROMPTS, GREEDY, gens(PROMPTS, seed=3))
    assert torch.equal(ar.tokens, res.tokens)
    assert [sum(a) for a in res.accepted] == [n_tokens] * len(PROMPTS)
    assert all(n < n_tokens for n in res.n_forward)  # windows did commit several tokens
    sjd = SJDDecoder(window=6).generate(adapter, PROMPTS, GREEDY, gens(PROMPTS, seed=5))
    assert torch.equal(ar.tokens, sjd.tokens)  # SJD decodes the same noise-aware model


def test_sjd2_keeps_the_grammar_and_accounts_every_token(saved):
    _, _, _, adapter = saved
    decoder = SJD2Decoder(window=8, denoise_steps=3)
    decoder.check(adapter)
    res = decoder.generate(adapter, PROMPTS, SAMPLED, gens(PROMPTS))
    forced = adapter.layout.forced
    assert (res.tokens[:, forced >= 0] == forced[forced >= 0]).all()
    assert adapter.layout.free_tokens[res.tokens[:, forced < 0]].all()
    assert [sum(a) for a in res.accepted] == [adapter.layout.n_tokens] * len(PROMPTS)
    assert [len(a) for a in res.accepted] == res.n_forward


# -- errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [LuminaSJD2Adapter, Emu3SJD2Adapter])
def test_missing_checkpoints_name_the_path_the_key_and_the_recipe(tmp_path, cls):
    with pytest.raises(FileNotFoundError, match=r"model\.adapter\.weights.*not set.*finetune_sjd2_hf\.py"):
        cls(weights=None)
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError, match=r"model\.adapter\.weights.*finetune_sjd2_hf\.py") as err:
        cls(weights=str(missing))
    assert str(missing) in str(err.value)
    missing.mkdir()  # e.g. a plain checkpoint: no sidecar
    with pytest.raises(FileNotFoundError, match=rf"{SIDECAR_META} not found.*model\.adapter\.weights") as err:
        cls(weights=str(missing))
    assert "finetune_sjd2_hf.py" in str(err.value)


def test_a_missing_timestep_file_or_another_family_is_named(saved, tmp_path):
    import shutil

    family, directory, _, _ = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(directory, copy)
    other = Emu3SJD2Adapter if family == "lumina" else LuminaSJD2Adapter
    with pytest.raises(ValueError, match=rf"noise-aware '{family}' checkpoint.*model\.adapter\.weights"):
        other(weights=str(copy))
    (copy / SIDECAR_WEIGHTS).unlink()
    cls = LuminaSJD2Adapter if family == "lumina" else Emu3SJD2Adapter
    with pytest.raises(FileNotFoundError, match=rf"{SIDECAR_WEIGHTS} not found.*model\.adapter\.weights"):
        cls(weights=str(copy))


@pytest.mark.parametrize("model, cls", [("lumina_sjd2", LuminaSJD2Adapter), ("emu3_sjd2", Emu3SJD2Adapter)])
def test_model_configs_match_their_adapter(compose_cfg, model, cls):
    import inspect

    cfg = compose_cfg([f"model={model}"])
    adapter = dict(cfg.model.adapter)
    assert adapter.pop("_target_") == f"{cls.__module__}.{cls.__name__}"
    assert adapter["weights"] is None  # required: there is no released checkpoint to default to
    inspect.signature(cls).bind(**adapter, device="cpu")


def test_the_model_config_loads_a_checkpoint(saved, compose_cfg):
    from hydra.utils import instantiate

    family, directory, source, _ = saved
    overrides = [f"model={family}_sjd2", f"model.adapter.weights={directory}", "model.adapter.dtype=float32"]
    overrides.append(f"model.adapter.resolution={FAMILIES[family][2]['resolution']}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapter = instantiate(compose_cfg(overrides).model.adapter, device="cpu")
    assert type(adapter) is type(source) and adapter.name == f"{family}_sjd2"
    assert torch.equal(adapter.noise_path.time_embed.weight, source.noise_path.time_embed.weight)


@pytest.mark.parametrize("experiment, model", [("sjd2_lumina_coco", "lumina"), ("sjd2_emu3_coco", "emu3")])
def test_sjd2_overlays_match_the_published_rows(compose_cfg, experiment, model):
    from sjd.harness.runner import build_decoders
    from studies.paper import load_published

    cfg = compose_cfg([f"experiment={experiment}"])
    assert cfg.model.name == f"{model}_sjd2" and cfg.prompts.name == "coco5k"
    decoders, _ = build_decoders(cfg)
    names = {d.name for d in decoders}
    published = load_published(ROOT / "results" / "paper" / "published.csv")
    methods = set(published[published["table"] == experiment]["method"])
    # The published methods under the official schedule, each SJD-loop decoder with a harness-schedule sibling.
    assert methods and methods <= names and names == {"ar", "sjd", "sjd2", "sjd_harness", "sjd2_harness"}
    by_name = {d.name: d for d in decoders}
    for name in ("sjd", "sjd2"):
        assert by_name[name].schedule == "official" and by_name[f"{name}_harness"].schedule == "harness"
    sjd2 = by_name["sjd2"]
    assert sjd2.window > 80 and sjd2.denoise_steps == 20
