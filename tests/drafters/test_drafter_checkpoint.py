"""Released drafter layouts load through `decoder.drafter.weights` (CPU, tiny random targets and checkpoints).

The checkpoints are written here by hand in LANTERN's released layout, not through our own `save_drafter`:
- LlamaGen: a LlamaGen-style transformers llama config (`num_hidden_layers: 1`, `input_type`) and
  `pytorch_model.bin`, with no input norm at layer 0;
- Anole: a Chameleon config and `model.safetensors` or `pytorch_model.bin`, per-head q/k norms
  [heads, head_dim] and an input norm; Lumina-mGPT's q/k norms one row per model-parallel shard [1, head_dim].
Then: safe loading, the target's embedding when the file has none, the refusals at start-up (through
`EagleDecoder(...)` and `.check(adapter)`, as the runner calls them, and once through run.py), the target's
dtype, and a loaded drafter decoding greedy AR's tokens.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_adapter_chameleon as cham
import test_adapter_llamagen as lg
import torch
from hydra.utils import instantiate
from safetensors.torch import save_file
from transformers import JanusVQVAE

from sjd.core.sampling import SamplingConfig
from sjd.core.seeding import make_generators
from sjd.decoders.ar import ARDecoder
from sjd.decoders.eagle import EagleDecoder
from sjd.drafters.checkpoint import WEIGHTS_KEY, load_drafter
from sjd.models.anole import AnoleAdapter
from sjd.models.llamagen import LlamaGenAdapter
from sjd.models.lumina import LuminaAdapter
from sjd.models.nets.llamagen_gpt import LlamaGenConfig, LlamaGenGPT
from sjd.models.nets.llamagen_vq import vq_config

ROOT = Path(__file__).resolve().parents[2]
T2I_GRID = 16  # LANTERN's `input_type: t2i` drafters are for LlamaGen's 256 px model: 16 x 16 codes
GREEDY = SamplingConfig(cfg_scale=3.0, temperature=0.0)
SMALL_TREE = dict(depth=2, top_k=3, total_tokens=6)

pytestmark = pytest.mark.usefixtures("one_thread")


# -- targets -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llamagen():
    """The tiny LlamaGen of tests/models/test_adapter_llamagen.py, at the 16 x 16 grid of a `t2i` drafter."""
    torch.manual_seed(3)
    gpt = LlamaGenGPT(LlamaGenConfig.build(lg.GPT_FIELDS, grid_size=T2I_GRID)).eval()
    torch.manual_seed(2)
    vq = JanusVQVAE(vq_config(lg.VQ_FIELDS, T2I_GRID)).eval()
    return LlamaGenAdapter.from_parts(gpt, lg.tiny_tokenizer(), lg.tiny_t5(), vq)


@pytest.fixture(scope="module")
def anole():
    return AnoleAdapter.from_model(cham.tiny_chameleon(seed=2), cham.encode, cham.ANOLE_H, cham.ANOLE_W)


@pytest.fixture(scope="module")
def lumina():
    return LuminaAdapter.from_model(cham.tiny_chameleon(), cham.encode, cham.H_GRIDS, cham.W_GRIDS)


# -- released layouts, by hand ---------------------------------------------------------------------------
def random_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(shape, generator=g) * 0.1 for k, shape in shapes.items()}


def layer_shapes(H: int, heads: int, kv_heads: int, ffn: int) -> dict[str, tuple[int, ...]]:
    hd = H // heads
    return {
        "fc.weight": (H, 2 * H),
        "fc.bias": (H,),
        "layers.0.self_attn.q_proj.weight": (heads * hd, H),
        "layers.0.self_attn.k_proj.weight": (kv_heads * hd, H),
        "layers.0.self_attn.v_proj.weight": (kv_heads * hd, H),
        "layers.0.self_attn.o_proj.weight": (H, heads * hd),
        "layers.0.mlp.gate_proj.weight": (ffn, H),
        "layers.0.mlp.up_proj.weight": (ffn, H),
        "layers.0.mlp.down_proj.weight": (H, ffn),
        "layers.0.post_attention_layernorm.weight": (H,),
    }


def write(directory: Path, config: dict, state: dict[str, torch.Tensor], fmt: str = "bin") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if fmt == "bin":
        torch.save(state, directory / "pytorch_model.bin")
    else:
        save_file({k: v.contiguous() for k, v in state.items()}, str(directory / "model.safetensors"))
    return directory


def llamagen_config(target, **changes) -> dict:
    """As LANTERN's data/configs/llamagen_t2i_config.json, at the target's sizes."""
    a = target.architecture()
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": a["hidden_size"], "intermediate_size": a["intermediate_size"],
        "num_attention_heads": a["num_attention_heads"], "num_key_value_heads": a["num_key_value_heads"],
        "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "vocab_size": a["vocab_size"], "caption_dim": 2048,
        "max_position_embeddings": 2048, "pretraining_tp": 1, "rope_scaling": None, "torch_dtype": "float16",
        "input_type": "t2i", **changes,
    }  # fmt: skip


def llamagen_state(target, seed: int = 0) -> dict[str, torch.Tensor]:
    a = target.architecture()
    H, V = a["hidden_size"], a["vocab_size"]
    shapes = {"embed_tokens.weight": (V, H)} | layer_shapes(H, a["num_attention_heads"], a["num_key_value_heads"],
                                                             a["intermediate_size"])  # fmt: skip
    state = random_tensors(shapes, seed)
    state["layers.0.post_attention_layernorm.weight"] += 1.0
    return state


def chameleon_config(target, **changes) -> dict:
    """As LANTERN's data/configs/anole_config.json, at the target's sizes."""
    a = target.architecture()
    return {
        "architectures": ["ChameleonForConditionalGeneration"], "model_type": "chameleon", "attention_bias": False,
        "hidden_act": "silu", "hidden_size": a["hidden_size"], "intermediate_size": a["intermediate_size"],
        "num_attention_heads": a["num_attention_heads"], "num_key_value_heads": a["num_key_value_heads"],
        "num_hidden_layers": 1, "model_parallel_size": 1, "mlp_bias": False, "rms_norm_eps": a["rms_norm_eps"],
        "rope_theta": a["rope_theta"], "rope_scaling": None, "vocab_size": a["vocab_size"],
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16", **changes,
    }  # fmt: skip


def chameleon_state(target, seed: int = 0, shards: int | None = None) -> dict[str, torch.Tensor]:
    """Anole's keys; with `shards`, q/k norms stored [shards, head_dim] as Lumina-mGPT's."""
    a = target.architecture()
    H, V, heads, kv = a["hidden_size"], a["vocab_size"], a["num_attention_heads"], a["num_key_value_heads"]
    hd = H // heads
    shapes = {"embed_tokens.weight": (V, H), "layers.0.input_layernorm.weight": (H,)}
    shapes |= layer_shapes(H, heads, kv, a["intermediate_size"])
    for name, n in (("q_norm", heads), ("k_norm", kv)):
        for t in ("weight", "bias"):
            shapes[f"layers.0.self_attn.{name}.{t}"] = (shards or n, hd)
    state = random_tensors(shapes, seed)
    for k in state:
        if k.endswith("norm.weight") or k.endswith("layernorm.weight"):
            state[k] += 1.0
    return state


def assert_loaded(net, state: dict[str, torch.Tensor]) -> None:
    loaded = net.state_dict()
    assert set(loaded) == set(state)
    for k, v in state.items():
        assert torch.equal(loaded[k].float(), v.float()), k


# -- the layouts load ------------------------------------------------------------------------------------
def test_lantern_llamagen_layout_loads(tmp_path, llamagen):
    state = llamagen_state(llamagen)
    net = load_drafter(llamagen, str(write(tmp_path / "llamagen_drafter", llamagen_config(llamagen), state)))
    cfg = net.config
    assert (cfg.family, cfg.grid_size, cfg.cls_token_num, cfg.rms_norm_eps) == ("llamagen", 16, lg.CAPTION_SLOTS, 1e-6)
    assert not cfg.input_norm and cfg.fc_bias
    assert_loaded(net, state)  # the file's own embedding (LANTERN's carry one), no input norm
    assert net.embed_tokens.weight.dtype == torch.float32


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_lantern_anole_layout_loads(tmp_path, anole, fmt):
    state = chameleon_state(anole, seed=1)
    net = load_drafter(anole, str(write(tmp_path / f"anole_{fmt}", chameleon_config(anole), state, fmt)))
    assert (net.config.family, net.config.input_norm, net.config.qk_norm) == ("chameleon", True, True)
    assert net.layers[0].self_attn.q_norm.weight.shape == (4, 16)
    assert_loaded(net, state)


def test_lumina_shard_qk_norms_expand_to_every_head(tmp_path, lumina):
    """[1, head_dim] (one model-parallel shard) becomes the same row for each of the 4 query and 2 key heads."""
    state = chameleon_state(lumina, seed=2, shards=1)
    assert state["layers.0.self_attn.q_norm.weight"].shape == (1, 16)
    net = load_drafter(lumina, str(write(tmp_path / "lumina", chameleon_config(lumina, dropout=0.05), state, "st")))
    per_head = {
        k: v.expand(4 if ".q_norm." in k else 2, -1) if "_norm." in k and "layernorm" not in k else v
        for k, v in state.items()
    }
    assert_loaded(net, per_head)

    bad = chameleon_state(lumina, seed=2, shards=3)  # 3 shards cannot split 4 heads
    with pytest.raises(ValueError, match=rf"{WEIGHTS_KEY}.*[qk]_norm.*\(3, 16\)"):
        load_drafter(lumina, str(write(tmp_path / "bad", chameleon_config(lumina), bad, "st")))


def test_safetensors_is_read_when_both_files_exist(tmp_path, anole):
    directory = write(tmp_path / "both", chameleon_config(anole), chameleon_state(anole, seed=3), "st")
    torch.save(chameleon_state(anole, seed=4), directory / "pytorch_model.bin")
    assert_loaded(load_drafter(anole, str(directory)), chameleon_state(anole, seed=3))


def test_the_target_embedding_when_the_file_has_none(tmp_path, anole):
    state = chameleon_state(anole, seed=5)
    del state["embed_tokens.weight"]
    net = load_drafter(anole, str(write(tmp_path / "no_embed", chameleon_config(anole), state)))
    assert torch.equal(net.embed_tokens.weight, anole.token_embeddings().float())
    assert not net.embed_tokens.weight.requires_grad


class NotATensor:
    pass


def test_pickles_are_read_safely(tmp_path, anole):
    """torch.load(weights_only=True): a pickled object is refused, not constructed; a plain non-tensor entry
    (which the restricted unpickler allows) is refused too. Both errors name the key and the file."""
    directory = write(tmp_path / "pickled", chameleon_config(anole), {})
    torch.save({**chameleon_state(anole), "extra": NotATensor()}, directory / "pytorch_model.bin")
    with pytest.raises(ValueError, match=rf"{WEIGHTS_KEY}.*pytorch_model\.bin.*weights_only") as e:
        load_drafter(anole, str(directory))
    assert "NotATensor" in str(e.value)
    torch.save({**chameleon_state(anole), "step": 3}, directory / "pytorch_model.bin")
    with pytest.raises(ValueError, match=rf"{WEIGHTS_KEY}.*pytorch_model\.bin.*non-tensor entries \['step'\]"):
        load_drafter(anole, str(directory))


def test_the_drafter_takes_the_target_dtype(tmp_path):
    target = AnoleAdapter.from_model(
        cham.tiny_chameleon(seed=2).to(torch.bfloat16), cham.encode, cham.ANOLE_H, cham.ANOLE_W
    )
    net = load_drafter(target, str(write(tmp_path / "bf16", chameleon_config(target), chameleon_state(target))))
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}


# -- refusals at start-up ----------------------------------------------------------------------------------
def refusal(adapter, directory: Path) -> str:
    decoder = EagleDecoder(drafter={"weights": str(directory)})  # the directory is complete: construction passes
    with pytest.raises(ValueError) as e:
        decoder.check(adapter)
    return str(e.value)


def test_a_drafter_that_does_not_fit_is_refused_naming_both_values(tmp_path, anole, llamagen):
    state = chameleon_state(anole)
    a = anole.architecture()
    cases = {
        "hidden": (chameleon_config(anole, hidden_size=32), [f"hidden_size 32 (the target's: {a['hidden_size']})"]),
        "vocab": (chameleon_config(anole, vocab_size=99), [f"vocab_size 99 (the target's: {a['vocab_size']})"]),
        "layers": (chameleon_config(anole, num_hidden_layers=2), ["num_hidden_layers 2 (a drafter has 1)"]),
        "family": (llamagen_config(anole), ["a llamagen layer (the target is a chameleon model)"]),
    }
    for name, (config, expected) in cases.items():
        message = refusal(anole, write(tmp_path / name, config, state))
        assert message.startswith(f"`{WEIGHTS_KEY}`: the drafter at {tmp_path / name}"), message
        for part in expected:
            assert part in message, (name, message)
    eagle_llama = {**chameleon_config(anole), "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    assert "a llama layer (the target is a chameleon model)" in refusal(
        anole, write(tmp_path / "llama", eagle_llama, {})
    )
    stage2 = refusal(llamagen, write(tmp_path / "t2i2", llamagen_config(llamagen, input_type="t2i2"), {}))
    assert "input_type 't2i2', a 32x32-code drafter (the target's grid: 16x16)" in stage2


def test_a_checkpoint_of_the_wrong_keys_is_refused(tmp_path, anole, llamagen):
    """A LlamaGen-layout file (no input norm, no q/k norms) under a Chameleon config: every missing key named."""
    message = refusal(anole, write(tmp_path / "mixed", chameleon_config(anole), llamagen_state(anole)))
    assert "missing ['layers.0.input_layernorm.weight', 'layers.0.self_attn.k_norm.bias'" in message


def test_missing_files_stop_decoder_construction(tmp_path):
    (tmp_path / "empty").mkdir()
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    for path, what in [
        (tmp_path / "absent", "no drafter directory at"),
        (tmp_path / "empty", "no drafter config.json in"),
        (no_weights, "no drafter weights (model.safetensors or pytorch_model.bin) in"),
    ]:
        with pytest.raises(FileNotFoundError) as e:
            EagleDecoder(drafter={"weights": str(path)})
        assert WEIGHTS_KEY in str(e.value) and f"{what} {path}" in str(e.value), str(e.value)


def test_eagle_on_a_model_without_a_drafter_stops_at_construction(compose_cfg):
    cfg = compose_cfg(["decoder=eagle", "model=anole"])  # conf/model/anole.yaml names no drafter
    assert cfg.decoder.drafter.weights is None
    with pytest.raises(Exception, match=rf"`{WEIGHTS_KEY}`"):
        instantiate(cfg.decoder)


def test_run_py_refuses_a_missing_drafter_directory_before_loading_anything():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "run.py"), "decoder=eagle", "model=micro", "decoder.drafter.weights=/nonexistent",
         "prompts.n=1"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "WANDB_MODE": "offline"}, timeout=120,
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"`{WEIGHTS_KEY}`=/nonexistent: no drafter directory at /nonexistent" in proc.stderr, proc.stderr[-2000:]


# -- a loaded drafter decodes --------------------------------------------------------------------------------
@pytest.mark.parametrize("target", ["anole", "llamagen"])
def test_a_loaded_drafter_decodes_greedy_ar_tokens(tmp_path, request, target):
    adapter = request.getfixturevalue(target)
    if target == "anole":
        state = chameleon_state(adapter, seed=6)
        directory = write(tmp_path / "d", chameleon_config(adapter), state, "st")
    else:
        state = llamagen_state(adapter, seed=6)
        directory = write(tmp_path / "d", llamagen_config(adapter), state)
    prompts = cham.PROMPTS
    eagle = EagleDecoder(drafter={"weights": str(directory)}, **SMALL_TREE)
    eagle.check(adapter)
    gens = make_generators(0, [p.prompt_id for p in prompts], torch.device("cpu"))
    ours = eagle.generate(adapter, prompts, GREEDY, gens)
    ar = ARDecoder().generate(adapter, prompts, GREEDY, make_generators(0, [p.prompt_id for p in prompts], "cpu"))
    assert torch.equal(ours.tokens, ar.tokens)
    assert min(ours.extras["drafter_forwards"]) > 0
    assert_loaded(load_drafter(adapter, str(directory)), state)  # the network the decoder ran: the file's
