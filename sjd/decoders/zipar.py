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

from sjd.decoders.pjd import PJDDecoder


class ZipARDecoder(PJDDecoder):
    lossless = False

    def __init__(self, name: str = "zipar", context: int = 16) -> None:
        super().__init__(name=name, window=1, context=context, keep_threshold=0.5, init="random")
        self.window = 0  # no drafts: each active row forwards its last token and samples the next
        self.every_row_samples = True

    def config(self) -> dict:
        return {"name": self.name, "context": self.context}
