"""A decoder config built for a small model as the runner builds it: conf/decoder/<name>.yaml resolved beside the
model's config (a drafter decoder takes the model's shipped drafter), then cut to what the model's image holds
and checked against the adapter."""

from hydra.utils import instantiate
from omegaconf import OmegaConf

from sjd.decoders.base import Decoder
from sjd.harness.decoder_configs import decoder_config
from sjd.models.base import ModelAdapter


def resolved_decoder(name: str, model: str) -> Decoder:
    node = OmegaConf.create({"decoder": decoder_config(name), "model": OmegaConf.load(f"conf/model/{model}.yaml")})
    return instantiate(OmegaConf.to_container(node.decoder, resolve=True))


def fitted(decoder: Decoder, adapter: ModelAdapter) -> Decoder:
    """`window` and a row's `context` (PJD, ZipAR) no wider than the model's image holds; checked as at start-up."""
    for key, most in (("window", adapter.layout.n_tokens), ("context", adapter.layout.width)):
        if key in decoder.config():
            setattr(decoder, key, min(getattr(decoder, key), most))
    decoder.check(adapter)
    return decoder
