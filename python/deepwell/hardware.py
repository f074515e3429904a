"""hardware.py — dw.probe(), dw.hardware(): the machine as dw_hw sees it (probed, a datasheet preset
or a `deepwell probe --json` file), with its GPUs, features and peer (NVLink) matrix."""
import ctypes
import os
import tempfile

from . import _structs as S
from ._core import Handle, JsonDoc, ctx_of, raise_for
from ._lib import cstr, lib, text

FEATURES = ("wgmma", "fp8", "tcgen05", "tmem", "mx_block_scaling", "fp4")


class Record(dict):
    """A dict whose keys also read as attributes (hw.gpus[0].name)."""

    def __getattr__(self, k):
        try:
            return self[k]
        except KeyError:
            raise AttributeError(k) from None


class Hardware(JsonDoc, Handle):
    """A dw_hw. .gpus: one dict per GPU of a node (name, sm, hbm, features, is_hopper,
    is_blackwell, rates, ...; keys read as attributes too); .info: the
    machine; .peers: the peer-access matrix; .to_json(): the `deepwell probe --json` document."""

    _free, _to_json = "dw_hw_free", "dw_hw_to_json"

    @property
    def info(self):
        o = S.HwInfo.new()
        raise_for(lib().dw_hw_get_info(self._handle(), ctypes.byref(o)))
        return o.as_dict()

    @property
    def gpu_count(self):
        return lib().dw_hw_gpu_count(self._handle())

    @property
    def gpus(self):
        out = []
        for i in range(self.gpu_count):
            g = S.GpuInfo.new()
            raise_for(lib().dw_hw_get_gpu(self._handle(), i, ctypes.byref(g)))
            d = g.as_dict()
            d["sm"] = 10 * g.cc_major + g.cc_minor
            d["hbm"] = g.hbm_bytes
            d["features"] = [f for f in FEATURES if d[f]]
            d["is_hopper"], d["is_blackwell"] = g.cc_major == 9, g.cc_major >= 10
            out.append(Record(d))
        return out

    @property
    def features(self):
        """Features every GPU of the node has (empty without GPUs)."""
        gpus = self.gpus
        return [f for f in FEATURES if gpus and all(f in g["features"] for g in gpus)]

    @property
    def peers(self):
        """n x n matrix of dicts (access, perf_rank, native_atomics); None on the diagonal."""
        n = self.gpu_count
        m = [[None] * n for _ in range(n)]
        for i in range(n):
            for j in range(n):
                if i != j:
                    p = S.PeerLink.new()
                    raise_for(lib().dw_hw_get_peer(self._handle(), i, j, ctypes.byref(p)))
                    m[i][j] = p.as_dict()
        return m

    @property
    def notice(self):
        return text(lib().dw_hw_notice(self._handle()))

    def copy(self):
        """An independent copy (through the `deepwell probe --json` document)."""
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="deepwell-hw-", delete=False) as f:
            f.write(self.to_json())
        try:
            return _make(lib().dw_hw_load, self._ctx, cstr(f.name))
        finally:
            os.unlink(f.name)

    def one_gpu(self):
        """A copy reduced to one node of one GPU (as a single engine sees the machine)."""
        hw = self.copy()
        return hw.set_nodes(1).keep_gpus(1)

    def set_nodes(self, nodes):
        self._ctx.check(lib().dw_hw_set_nodes(self._ctx._h, self._handle(), int(nodes)))
        return self

    def keep_gpus(self, n):
        self._ctx.check(lib().dw_hw_keep_gpus(self._ctx._h, self._handle(), int(n)))
        return self

    def __repr__(self):
        if self.closed:
            return "Hardware(closed)"
        i = self.info
        return f"Hardware(source={i['source']!r}, nodes={i['nodes']}, gpus={i['gpus']}, preset={i['preset']!r})"


def _make(fn, ctx, *args):
    h = ctypes.c_void_p()
    ctx.check(fn(ctx._h, *args, ctypes.byref(h)))
    return Hardware(h.value, ctx)


def probe(ctx=None):
    """This machine's GPUs (CUDA runtime, NVML). No GPU is not an error: .gpus is empty and
    .notice says why."""
    ctx = ctx_of(ctx)
    return _make(lib().dw_probe, ctx)


def hardware(what, nodes=1, gpus=None, ctx=None):
    """A machine to plan for: a preset name ("h100-sxm", "h200", "b200", ...), a hardware JSON
    file (`deepwell probe --json`), or "probe"; `gpus` keeps only that many GPUs per node."""
    ctx = ctx_of(ctx)
    names = presets()
    if what == "probe":
        hw = probe(ctx)
        if nodes != 1:
            hw.set_nodes(nodes)
    elif what in names:
        hw = _make(lib().dw_hw_preset, ctx, cstr(what), int(nodes))
    else:
        hw = _make(lib().dw_hw_load, ctx, cstr(what))
        if nodes != 1:
            hw.set_nodes(nodes)
    if gpus is not None:
        hw.keep_gpus(gpus)
    return hw


def presets():
    """{name: description} of the hardware presets."""
    L = lib()
    return {text(L.dw_hw_preset_name(i)): text(L.dw_hw_preset_description(i)) for i in range(L.dw_hw_preset_count())}
