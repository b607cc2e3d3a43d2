"""What would stall a GPU: host syncs and operator calls per decoder iteration, counted on the CPU.

On a GPU a decoder iteration is fast only when the host never waits for the device: every `.item()`,
`.tolist()`, `bool(t)`, `nonzero`, boolean-mask indexing, `torch.equal` or copy to the host of a tensor on
the device blocks until the device has caught up, and every operator call outside the model forward is a
kernel launch. Here everything runs on the CPU, so `SyncCounter` (a torch function mode) tracks which tensors
*would* live on the device, and counts what is done with them:

- device tensors: the parameters and buffers of the adapter's networks and of a decoder's own (a drafter),
  every tensor a factory makes with an explicit `device=` (what a decoder allocates on `adapter.device`),
  every host tensor moved with `.to(a torch.device)` (`.to(adapter.device)`: a no-op here, so the counter
  hands on a copy to mark, never the host tensor itself), and every output of an operator with a device
  tensor among its inputs. A tensor built on the host (`torch.tensor(list)` without a device) is a host
  tensor, and reading it stalls nothing.
- a sync: one of SYNC_FUNCTIONS on a device tensor, `.to("cpu")` of one, indexing one with a boolean
  mask, or a copy of host data to the device (`host_to_device`: `torch.tensor(list, device=...)`,
  `host.to(device)`, a host index or value used on a device tensor), which from pageable host memory blocks the
  host until the stream reaches it. Each is counted where it happens: in the model forward (the adapter's own
  methods), in the logits pipeline (sjd.core.sampling.logits_to_probs), or in the decoder, with the innermost
  sjd/ line that asked for it.
- an operator call outside the forward: any torch function producing a device tensor while no adapter
  method runs: a kernel launch on a GPU, before any compile fuses them.
- with `graphs_of` (count_decode; what compile=true launches): each call of a decoder's iteration kernels
  (sjd.decoders.kernels: the logits pipeline, verification, sampling) counts as what a CUDA graph replay of it
  launches: the replay and a copy of each device tensor input into the graph's own buffers, and nothing inside
  it. The kernels run eager here; that each is one graph is what tests/decoders/test_kernels.py holds
  (fullgraph compiles).

Iterations are the decode loop's forwards (the prefill excluded). What the forward clock does once a decode (the
prefill and the first token before the loop, the finished result after it: `ForwardClock.start` and `finish`), and a
window decoder's set-up before its loop (`WindowDecoder.start`), is counted apart, as `once` (`syncs_once_per_decode`),
and not per iteration; so are a layout's tables, copied to the device once per process. `scripts/count_syncs.py`
prints the report for every decoder; it asserts nothing, and only counts (times nothing).
"""

from __future__ import annotations

import functools
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from sjd.decoders.base import Decoder
from sjd.decoders.kernels import Kernels
from sjd.models.base import ModelAdapter
from sjd.types import Prompt

SYNC_FUNCTIONS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__,
    torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.cpu, torch.Tensor.numpy,
    torch.equal, torch.allclose, torch.Tensor.allclose, torch.unique, torch.Tensor.unique, torch.masked_select,
    torch.Tensor.masked_select, torch.Tensor.repeat_interleave, torch.repeat_interleave, torch.argwhere,
}  # fmt: skip
FROM_HOST_DATA = {torch.tensor, torch.as_tensor, torch.asarray}  # with device=: a copy of host data
COPY = "host-to-device copy"  # a sync site's name for a copy of host data to the device
ADAPTER_METHODS = ("prefill", "forward", "forward_at", "forward_embeds", "truncate", "keep_slots", "head")
PIPELINE = ("sampling.py", "logits_to_probs")
# Work done once a decode, not a step: ForwardClock's start (prefill, first token) and finish (the result), a window
# decoder's set-up before its loop (a continuation's first drafts, and for SJD-PAC their sibling room), AR's entropy
# and a window or tree decoder's per-row counts read after it, and a layout's tables, copied to the device once per
# process (sjd.types.ImageLayout), as are a static draft tree's.
ONCE_A_DECODE = (
    ("decoders/base.py", ("start", "finish")),
    ("decoders/window.py", ("start",)),
    ("decoders/ar.py", ("mean_entropy",)),
    ("decoders/window_state.py", ("finish",)),
    ("decoders/eagle.py", ("finish",)),
    ("sjd/types.py", ("_cached", "allowed_table")),
    ("drafters/tree.py", ("static_plan",)),  # a static tree shape's tables, made once per device
)
SJD_ROOT = Path(__file__).resolve().parents[1]
MARK = "_would_be_on_device"


@dataclass
class Counts:
    """What one decode did with device tensors."""

    syncs: Counter = field(default_factory=Counter)  # (where, site) -> count; where: forward | pipeline | decoder
    ops_outside_forward: int = 0
    forwards: int = 0
    ops_in_forward: int = 0  # operator calls inside the adapter's forward (the model's own kernels, eager)
    ops_in_layers: int = 0  # of those, inside the decoder layers (`layer_hooks`)
    copies_to_device: int = 0  # of the syncs, copies of host data to the device (wherever they happen)


class SyncCounter(TorchFunctionMode):
    """Counts syncs on device tensors and device operator calls outside the forward (module docstring)."""

    def __init__(self, device_tensors: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.starting = list(device_tensors)
        self.counts = Counts()
        self.in_forward = 0
        self.in_layer = 0
        self.in_graph = 0

    @staticmethod
    def is_device(x) -> bool:
        return isinstance(x, torch.Tensor) and getattr(x, MARK, False)

    @staticmethod
    def mark(x: torch.Tensor) -> None:
        setattr(x, MARK, True)  # a plain attribute of the tensor object: identity, not value, decides

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [a for a in _flat((args, kwargs)) if isinstance(a, torch.Tensor)]
        on_device = any(self.is_device(a) for a in inputs)
        to_host = func is torch.Tensor.to and _target(args, kwargs) == "cpu"  # a copy to the host
        if on_device and (func in SYNC_FUNCTIONS or _boolean_index(func, args) or to_host):
            self.counts.syncs[self.site(func)] += 1
        if self.host_to_device(func, args, kwargs, on_device):
            self.counts.syncs[self.site(func, COPY)] += 1
            self.counts.copies_to_device += 1
        out = func(*args, **kwargs)
        made_here = kwargs.get("device") is not None or (func in (torch.Tensor.to,) and _to_a_device(args, kwargs))
        if made_here and not on_device and out is args[0]:
            out = out.clone()  # a host tensor moved to the model's device (a no-op here): the copy is the device's
        if on_device or made_here:
            produced = [o for o in _flat(out) if isinstance(o, torch.Tensor)]
            for o in produced:
                self.mark(o)
            if produced and self.in_graph and not self.in_forward:
                pass  # inside a graph replay, counted once at its call (`replay`)
            elif produced and not self.in_forward:
                self.counts.ops_outside_forward += 1
            elif produced:
                self.counts.ops_in_forward += 1
                self.counts.ops_in_layers += bool(self.in_layer)
        return out

    def host_to_device(self, func, args, kwargs, on_device: bool) -> bool:
        """Whether `func` copies host data to the device: on a GPU a copy from pageable host memory, which blocks
        the host until the stream reaches it (a sync). A device tensor made from a Python list or a host tensor
        (`torch.tensor(list, device=...)`, `host.to(device)`, `device.copy_(host)`), a device tensor indexed with a
        host index tensor or list, and a host tensor or list written into a device tensor by index."""
        if func is torch.Tensor.new_tensor:  # on the device of the tensor it is called on
            to_device = self.is_device(args[0]) or kwargs.get("device") is not None
            return to_device and not self.is_device(args[1] if len(args) > 1 else kwargs.get("data"))
        if func in FROM_HOST_DATA:
            data = args[0] if args else kwargs.get("data")
            return kwargs.get("device") is not None and not self.is_device(data)
        if func is torch.Tensor.to:  # a non-blocking copy is from pinned memory (sjd.core.staging): no sync
            blocking = not kwargs.get("non_blocking", False)
            return blocking and _to_a_device(args, kwargs) and not self.is_device(args[0])
        if func is torch.Tensor.copy_:
            return self.is_device(args[0]) and isinstance(args[1], torch.Tensor) and not self.is_device(args[1])
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and on_device and self.is_device(args[0]):
            index = args[1] if isinstance(args[1], tuple) else (args[1],)
            value = args[2:3] if func is torch.Tensor.__setitem__ else ()
            return any(self._host_data(i) for i in (*index, *value))
        return False

    def _host_data(self, x) -> bool:
        """A host tensor of more than one element, or a Python list (an index or a value that must be copied over;
        a Python number or a 0-d host tensor rides in the kernel's arguments)."""
        if isinstance(x, torch.Tensor):
            return not self.is_device(x) and x.dim() > 0
        return isinstance(x, list)

    def site(self, func, what: str | None = None) -> tuple[str, str]:
        """(where, `file:line function`) of the innermost sjd/ frame that asked for a sync."""
        if self.in_forward:
            where = "forward"
        else:
            where = "decoder"
        frames = [f for f in traceback.extract_stack()[:-2] if f.filename.startswith(str(SJD_ROOT))]
        frames = [f for f in frames if not f.filename.endswith("syncs.py")]
        if any(f.filename.endswith(PIPELINE[0]) and f.name == PIPELINE[1] for f in frames) and not self.in_forward:
            where = "pipeline"
        if any(f.filename.endswith(file) and f.name in names for f in frames for file, names in ONCE_A_DECODE):
            where = "once"  # the prefill and the first token, or the finished result: once a decode, not a step
        top = frames[-1] if frames else None
        name = what or getattr(func, "__name__", str(func))
        at = f"{Path(top.filename).relative_to(SJD_ROOT.parent)}:{top.lineno} {top.name}" if top else "?"
        return where, f"{name} at {at}"

    @contextmanager
    def watching(self, adapter: ModelAdapter) -> Iterator[None]:
        """Mark the adapter's methods as the model forward while this counter is active (and count forwards)."""
        saved = {}
        for name in ADAPTER_METHODS:
            method = getattr(adapter, name, None)
            if method is None:
                continue
            saved[name] = adapter.__dict__.get(name)
            setattr(adapter, name, self._wrap(method, count=name in ("forward", "forward_at", "forward_embeds")))
        for t in self.starting:
            self.mark(t)
        try:
            with self:
                yield
        finally:
            for t in self.starting:  # the networks keep no trace of the count
                delattr(t, MARK)
            for name, old in saved.items():
                if old is None:
                    delattr(adapter, name)
                else:
                    setattr(adapter, name, old)

    def replay(self, kernel: Callable) -> Callable:
        """`kernel` as a CUDA graph replay is counted: one launch, plus one copy per device tensor input into the
        graph's buffers (outside a forward); the calls inside it are not counted."""

        @functools.wraps(kernel)
        def replayed(*args):
            if not self.in_forward:
                self.counts.ops_outside_forward += 1 + sum(self.is_device(a) for a in _flat(args))
            self.in_graph += 1
            try:
                return kernel(*args)
            finally:
                self.in_graph -= 1

        return replayed

    def _wrap(self, method: Callable, count: bool) -> Callable:
        @functools.wraps(method)
        def inside(*args, **kwargs):
            self.in_forward += 1
            self.counts.forwards += count and self.in_forward == 1
            try:
                return method(*args, **kwargs)
            finally:
                self.in_forward -= 1

        return inside


def _flat(x) -> Iterator:
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _flat(item)
    elif isinstance(x, dict):
        for item in x.values():
            yield from _flat(item)
    elif hasattr(x, "__dataclass_fields__"):  # Logits and friends
        for name in x.__dataclass_fields__:
            yield from _flat(getattr(x, name))
    else:
        yield x


def _boolean_index(func, args) -> bool:
    """Indexing with a boolean mask: the result's size is known only on the device (assigning through one is not
    a sync: the mask selects in place)."""
    if func is not torch.Tensor.__getitem__ or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _target(args, kwargs):
    """Where `t.to(...)` sends t: its device (or dtype, or other tensor) argument."""
    return kwargs.get("device", args[1] if len(args) > 1 else None)


def _to_a_device(args, kwargs) -> bool:
    """`t.to(device)` / `t.to(other)` moves a host tensor to the device (not a dtype-only cast). A `torch.device`
    is the model's device, wherever the model runs (decoders write `.to(adapter.device)`); the string "cpu"
    is the host."""
    target = _target(args, kwargs)
    if isinstance(target, str):
        return target != "cpu"
    return isinstance(target, (torch.device, torch.Tensor))


def device_tensors(adapter: ModelAdapter, networks: dict[str, torch.nn.Module]) -> list[torch.Tensor]:
    """The tensors that start on the device: every parameter and buffer of the adapter's and the decoder's nets."""
    nets = {**adapter.networks(), **networks}
    return [t for net in nets.values() for t in (*net.parameters(), *net.buffers())]


def count_decode(
    decode: Callable[[], object], adapter: ModelAdapter, networks: dict, graphs_of: Decoder | None = None
) -> Counts:
    """Run `decode()` (one generate call) under a fresh SyncCounter and return what it counted. The decoder's own
    networks (a drafter) count as forwards, not as the decoder's calls: sjd.core.cost prices a drafter forward
    as a forward of its architecture, so its calls must not be priced twice. With `graphs_of`, that decoder's
    iteration kernels count as compile=true launches them (module docstring)."""
    counter = SyncCounter(device_tensors(adapter, networks))
    if graphs_of is not None:
        saved = graphs_of.kernels
        graphs_of.use_kernels(Kernels(counter.replay))

    def enter(*_):
        counter.in_forward += 1

    def leave(*_):
        counter.in_forward -= 1

    hooks = [
        h for net in networks.values() for h in (net.register_forward_pre_hook(enter), net.register_forward_hook(leave))
    ]
    try:
        with counter.watching(adapter):
            decode()
    finally:
        for h in hooks:
            h.remove()
        if graphs_of is not None:
            graphs_of.use_kernels(saved)
    return counter.counts


def forward_op_counts(adapter: ModelAdapter, prompts: Sequence[Prompt]) -> tuple[int, int, int]:
    """(operator calls outside the layers, per layer, layers) of one width-1 forward after the prefill of
    `prompts` (its first row), counted as the decoder's are (calls that make a device tensor): what an eager
    forward launches (sjd.core.cost.FORWARD_OPS_FIXED and FORWARD_OPS_PER_LAYER)."""
    network = next(iter(adapter.networks().values()))
    layers = next(m for name, m in network.named_modules() if name.endswith("layers") and len(m))
    counter = SyncCounter(device_tensors(adapter, {}))

    def enter(*_):
        counter.in_layer += 1

    def leave(*_):
        counter.in_layer -= 1

    hooks = [
        h for layer in layers for h in (layer.register_forward_pre_hook(enter), layer.register_forward_hook(leave))
    ]
    try:
        with torch.no_grad():
            adapter.prefill(prompts[:1], with_uncond=True)
            token = torch.zeros((1, 1), dtype=torch.long)  # its value does not change what is launched
            with counter.watching(adapter):
                adapter.forward(token, [0])
    finally:
        for h in hooks:
            h.remove()
    c = counter.counts
    return c.ops_in_forward - c.ops_in_layers, c.ops_in_layers // len(layers), len(layers)


def report_row(counts: list[Counts]) -> dict:
    """Per iteration (the decode loop's forwards, the prefill excluded) over several decodes of one setting."""
    iterations = max(1, sum(c.forwards for c in counts))
    by_where = Counter()
    sites = Counter()
    for c in counts:
        for (where, site), n in c.syncs.items():
            by_where[where] += n
            if where == "decoder":
                sites[site] += n
    return {
        "iterations": iterations,
        "decoder_syncs_per_iter": by_where["decoder"] / iterations,
        "pipeline_syncs_per_iter": by_where["pipeline"] / iterations,
        "forward_syncs_per_iter": by_where["forward"] / iterations,
        "ops_outside_forward_per_iter": sum(c.ops_outside_forward for c in counts) / iterations,
        "decoder_sync_sites": "; ".join(f"{s} x{n / iterations:.2f}" for s, n in sites.most_common(4)),
        "syncs_per_iter": sum(n for where, n in by_where.items() if where != "once") / iterations,
        "syncs_once_per_decode": by_where["once"] / max(1, len(counts)),
        "copies_to_device_per_iter": sum(
            n for c in counts for (where, site), n in c.syncs.items() if where != "once" and site.startswith(COPY)
        )
        / iterations,
    }


# What each decoder-side sync site is for, by file and function: the report's answer to "why more than one a
# step". The one a window decoder needs reads how many drafts each row accepted (base.py read).
PURPOSES = {
    "base.py read": "the accepted lengths, with the forwards' NaN/inf flags in the same copy: the one sync a "
    "window decoder needs (SJD-PAC's also brings the accepted siblings and the sibling room of every draft a row "
    "may carry on; PJD's and ZipAR's every row segment's outcome; SSD's the blocks that end, once for those that "
    "end together, again where one that ended decides, by the token after it, its row's next draws)",
    "base.py check_finite": "the NaN/inf guard on the logits, read at once: the prefill's, and every forward's "
    "in decoders that read no count after each forward",
    "base.py finish": "copies the finished tokens to the host, once a decode",
    "eagle.py finish": "copies the drafter's forwards per row to the host, once a decode",
    "window_state.py finish": "copies the drafter's forwards per row to the host, once a decode",
    "ar.py generate": "AR's loop reads the rows' finished state or tokens on the host",
}


def sync_purposes(sites: str) -> str:
    """The purpose of each reported site (`name at path:line function xN`), where PURPOSES knows its file and
    function."""
    out = []
    for site in filter(None, (s.strip() for s in str(sites).split(";"))):
        where, function = site.split(" at ", 1)[1].rsplit(" x", 1)[0].split(" ", 1)
        key = f"{Path(where.split(':')[0]).name} {function}"
        out.append(f"{key}: {PURPOSES.get(key, 'not yet explained')}")
    return "; ".join(dict.fromkeys(out))
