"""ZipAR next-set decoding (ICML 2025; docs/algorithms.md §9), on PJD's row machinery.

Row r+1 starts once row r has `context` committed codes (ZipAR's "window": 8 for LlamaGen, 16
for Lumina-mGPT); every forward then feeds each active row its last committed token at its
true raster position and samples one code per active row from p, with no drafts and no
verification. A row never passes the row above, and it sees the committed codes of the rows
above, never their future ones (but for the draft anchor below), which is why it is not
lossless (the audit measures it).

It reuses PJD's segments, row-causal mask and bookkeeping (sjd.decoders.pjd) with zero drafts
per row and every active row taking its sample, and PJD's anchors: a new row's first input is
the end-of-line token closing the row above (ZipAR's "auxiliary token" is that row's last code,
which this layout reaches through the cache) or, in a layout without end-of-line tokens
(LlamaGen, Janus, Anole), the row above's last code itself: a draft of it, seen by the new row
only, until the row above commits it (PJD's anchoring choice, see sjd.decoders.pjd).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sjd.decoders.pjd import PJDDecoder


@dataclass(eq=False, kw_only=True)
class ZipARDecoder(PJDDecoder):
    lossless = False

    name: str = "zipar"
    context: int = 16
    window: int = field(default=0, init=False)  # no drafts: each active row forwards its last token, samples the next
    keep_threshold: float = field(default=0.5, init=False)
    init: str = field(default="random", init=False)
    every_row_samples: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        if self.context < 1:  # PJD's window check does not apply: ZipAR drafts nothing
            raise ValueError(f"decoder.context must be >= 1, got {self.context}")

    def config(self) -> dict:
        return {"name": self.name, "context": self.context}
